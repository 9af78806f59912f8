"""The agent-under-test contract, version ``eu-audit/agent-api@1``: what eu-audit needs from an agent it
did not build, as JSON over HTTP (any language) and as the Python protocol of ``adapter.py`` (the same
fields). ``eu-audit schema agent-api`` prints it.

An agent serves, on its own base URL:

| method and path | body | answer |
|---|---|---|
| ``GET /eu-audit/v1/capabilities`` | | ``Capabilities`` |
| ``POST /eu-audit/v1/sessions`` | ``StartSession`` | ``Session`` |
| ``POST /eu-audit/v1/sessions/{session_id}/messages`` | ``Message`` | ``Turn`` |
| ``POST /eu-audit/v1/sessions/{session_id}/fork`` (optional) | | ``Session`` |
| ``POST /eu-audit/v1/sessions/{session_id}/compact`` (optional) | | ``Turn`` |
| ``POST /eu-audit/v1/tenants/{tenant}/memory`` (optional) | ``MemoryRecord`` | ``Turn`` |
| ``POST /eu-audit/v1/tenants/{tenant}/forget`` | ``ForgetRequest`` | ``ForgetReceipt`` |
| ``POST /eu-audit/v1/tenants/{tenant}/reset`` | | ``Ok`` |
| ``GET /eu-audit/v1/tenants/{tenant}/dump`` (optional) | | ``StoreDump`` |

A capability an agent lacks makes the audits that need it "not measurable (agent lacks X)", never a
pass. Keep the agent's model calls pointed at ``eu-audit serve`` (its ``OPENAI_BASE_URL``) so what
reaches the model after the forget can be audited too.

What each call means (what a stranger would otherwise have to guess):

- ``reset(tenant)``: forget everything the tenant has, as if it never existed: every session, memory row,
  history, summary, index entry. The harness calls it before each tenant's run; tenants never share state.
- ``start(tenant, seed, tools)``: a new session of the tenant; it sees the tenant's memory (what the
  agent keeps across sessions), not other sessions' transcripts unless the agent itself carries them over.
  ``seed`` is the run's seed, for agents that sample on their own (most leave decoding to the model server,
  which the harness pins); ``tools`` are the functions the harness will run when the agent calls them.
- messages: ``role: user`` is the user speaking; ``role: tool`` answers a call the agent made
  (``tool_call_id`` is that call's id) or, with ``tool_call_id: "scaffold-tN"``, brings a tool result the
  scenario ran at step N without a call of the agent's. An agent that keeps an OpenAI-style history
  records the latter as a user message or as an assistant tool call with that id followed by the result.
- ``inject_memory(tenant, record)``: store the record in the tenant's long-term memory as the agent's own
  memory write would; the episode's starting records come this way too, right after ``start``. The answer
  is the agent's turn, if storing one makes it speak (often empty).
- ``fork(session)``: a copy of the session to probe; what the copy does never changes the original. It
  shares the tenant's memory as it was at the fork (a probe must see what a next turn would).
- ``compact(session)``: the agent's own compaction or summary now; the answer's text is the summary.
- ``forget(tenant, request)``: the agent's own forget for the target (and variants); ``hint`` may carry
  the flagged observation. ``unsupported`` or ``error`` fails the run; ``partial`` is recorded as said.
- ``dump(tenant)``: every place the agent keeps text for the tenant, one item per row or record, named by
  store (memory rows, history or audit tables, summaries, checkpoints, vector payloads, graph nodes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

API_VERSION = "eu-audit/agent-api@1"
PREFIX = "/eu-audit/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")  # an agent may add fields; eu-audit reads its own


class Capabilities(_Model):
    version: str = API_VERSION
    name: str = "agent"
    fork: bool = False  # probe a copy of a session without changing it
    memory_inject: bool = False  # store a memory record for a tenant (a memory step of an episode)
    store_dump: bool = False  # list what the agent keeps for a tenant (memory rows, history, summaries)
    compact: bool = False  # the agent compacts its context when told (a compaction step)


class ToolSpec(_Model):
    """An OpenAI-style function the harness offers for this session (it answers the calls)."""

    type: Literal["function"] = "function"
    function: dict[str, Any]


class StartSession(_Model):
    tenant: str
    seed: int = 0
    tools: list[ToolSpec] = Field(default_factory=list)


class Session(_Model):
    session_id: str


class Message(_Model):
    role: Literal["user", "tool"]
    content: str
    tool_call_id: str | None = None  # the call a tool result answers (None: a tool result the scaffold ran)
    name: str | None = None  # the tool's name


class Action(_Model):
    """A tool call the agent wants; the harness runs it and answers with a ``tool`` message."""

    id: str
    name: str
    arguments: dict[str, Any] | None = None  # None: the agent wrote arguments that do not parse


class Turn(_Model):
    text: str = ""
    actions: list[Action] = Field(default_factory=list)


class MemoryRecord(_Model):
    id: str
    text: str


class ForgetHint(_Model):
    """What the requester knows about where z came from (a flagged observation), optional."""

    source_text: str | None = None  # the observation that carried z, as the agent received it
    sanitized: str | None = None  # the same observation without z, as the requester would have it


class ForgetRequest(_Model):
    target: str
    variants: list[str] = Field(default_factory=list)
    hint: ForgetHint | None = None


class ForgetReceipt(_Model):
    status: Literal["ok", "partial", "unsupported", "error"] = "ok"
    detail: str = ""
    receipt: dict[str, Any] = Field(default_factory=dict)  # whatever the agent reports (kept verbatim)


class Ok(_Model):
    ok: bool = True


class StoredItem(_Model):
    store: str  # which store: "memory", "history", "summary", "checkpoints", ...
    id: str = ""
    text: str


class StoreDump(_Model):
    items: list[StoredItem] = Field(default_factory=list)


ENDPOINTS: list[tuple[str, str, type[BaseModel] | None, type[BaseModel], bool]] = [
    # (method, path, request, answer, required)
    ("GET", "/capabilities", None, Capabilities, True),
    ("POST", "/sessions", StartSession, Session, True),
    ("POST", "/sessions/{session_id}/messages", Message, Turn, True),
    ("POST", "/sessions/{session_id}/fork", None, Session, False),
    ("POST", "/sessions/{session_id}/compact", None, Turn, False),
    ("POST", "/tenants/{tenant}/memory", MemoryRecord, Turn, False),
    ("POST", "/tenants/{tenant}/forget", ForgetRequest, ForgetReceipt, True),
    ("POST", "/tenants/{tenant}/reset", None, Ok, True),
    ("GET", "/tenants/{tenant}/dump", None, StoreDump, False),
]


def json_schema() -> dict[str, Any]:
    """The contract as one JSON document: endpoints and the schema of every body."""
    models: dict[str, Any] = {}
    endpoints = []
    for method, path, req, ans, required in ENDPOINTS:
        for m in (req, ans):
            if m is not None:
                models[m.__name__] = m.model_json_schema()
        endpoints.append(
            {
                "method": method,
                "path": PREFIX + path,
                "request": req.__name__ if req else None,
                "answer": ans.__name__,
                "required": required,
            }
        )
    return {
        "$id": API_VERSION,
        "title": "eu-audit agent-under-test contract",
        "description": (__doc__ or "").strip(),
        "endpoints": endpoints,
        "schemas": models,
    }
