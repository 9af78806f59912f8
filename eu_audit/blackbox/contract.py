"""The agent-under-test contract, version ``eu-audit/agent-api@1``: what eu-audit needs from an agent it
did not build, as JSON over HTTP (any language) and as the Python protocol of ``adapter.py`` (the same
fields). ``eu-audit schema agent-api`` prints it.

An agent serves, on its own base URL:

| method and path | body | answer |
|---|---|---|
| ``GET /eu-audit/v1/capabilities`` |  | ``Capabilities`` |
| ``POST /eu-audit/v1/sessions`` | ``StartSession`` | ``Session`` |
| ``POST /eu-audit/v1/sessions/{session_id}/messages`` | ``Message`` | ``Turn`` |
| ``POST /eu-audit/v1/sessions/{session_id}/fork`` (optional: ``fork``) |  | ``Session`` |
| ``POST /eu-audit/v1/sessions/{session_id}/compact`` (optional: ``compact``) |  | ``Turn`` |
| ``POST /eu-audit/v1/tenants/{tenant}/memory`` (optional: ``memory_inject``) | ``MemoryRecord`` | ``Turn`` |
| ``POST /eu-audit/v1/tenants/{tenant}/forget`` | ``ForgetRequest`` | ``ForgetReceipt`` |
| ``POST /eu-audit/v1/tenants/{tenant}/reset`` |  | ``Ok`` |
| ``GET /eu-audit/v1/tenants/{tenant}/dump`` (optional: ``store_dump``) |  | ``StoreDump`` |
| ``POST /eu-audit/v1/tenants/{tenant}/restart`` (optional: ``restart``) |  | ``Ok`` |
| ``POST /eu-audit/v1/tenants/{tenant}/reindex`` (optional: ``reindex``) |  | ``Ok`` |
| ``GET /eu-audit/v1/tenants/{tenant}/files`` (optional: ``store_files``) |  | ``StoreFiles`` |

Path ids are percent-encoded, one segment each (the harness names tenants with letters, digits and
``-``; an agent that lets a session id hold ``/`` must match it whole, as ``eu-audit agent`` does).
A capability an agent lacks makes the audits that need it "not measurable (agent lacks X)", never a
pass. Keep the agent's model calls pointed at ``eu-audit serve`` (its ``OPENAI_BASE_URL``) so what
reaches the model after the forget can be audited too.

What each call means (what a stranger would otherwise have to guess):

- ``reset(tenant)``: forget everything the tenant has, as if it never existed: every session, memory row,
  history, summary, index entry. The harness calls it before each tenant's run; tenants never share state.
- ``start(tenant, seed, tools, model_base_url)``: a new session of the tenant; it sees the tenant's
  memory (what the agent keeps across sessions), not other sessions' transcripts unless the agent itself
  carries them over. ``seed`` is the run's seed, for agents that sample on their own (most leave decoding
  to the model server, which the harness pins); ``tools`` are the functions the harness will run when the
  agent calls them. ``model_base_url``, sent to every session of an agent whose capabilities say
  ``tenant_model_url`` (one tenant at a time too), is where every model call for this tenant must go from
  now on, chat, completions and embeddings alike (serve's lane for the tenant: tenants are told apart by
  where their calls arrive; one tenant at a time, a call on serve's root URL is still attributed by the
  harness's mark, while tenants side by side fail the run on it). ``GET {model_base_url}/models``
  answers there too; whether an agent lists models is its own business, it is never audited.
  The agent's model calls while it runs its own ``forget`` (an LLM that rewrites a memory) are logged in
  serve's log under phase ``forget``: neither before nor after the forget, so never residue.
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
  store (memory rows, history or audit tables, summaries, checkpoints, vector payloads, graph nodes). It
  must only read: the harness calls it after the probes, after each recheck and, with ``--recheck
  at-once``, right after the forget, between the episode's turns.
- ``files(tenant)``: the paths of every file the agent persists the tenant's data in (SQLite databases,
  vector stores, JSON, logs), as the harness's machine sees them; a file shared by tenants is listed for
  each. The harness reads them itself after the forget (``eu_audit.blackbox.forensics``): every table and
  column, the raw bytes (free pages, WAL and journal included) and every stored vector, so what the
  agent's dump leaves out still counts. ``eu-audit gate --store-path GLOB`` names them for an agent that
  does not serve this.
- ``restart(tenant)``: what a process restart does to the tenant: drop everything held in memory for it
  (clients, caches, open sessions, in-memory indexes) and load it back from what the agent persisted, as a
  fresh process would. Session ids stay valid (the session is loaded back by its id). Only an agent
  that persists its sessions should claim it; ``eu-audit gate --recheck restart`` then asks whether a
  forget survives the restart (a write-behind cache, a journal or a late writer can bring z back).
- ``reindex(tenant)``: the stack's own re-index or re-sync now, as its scheduled job would run it: rebuild
  what it derives from the records it keeps (embeddings and vector index, search tables, graph
  communities and summaries). Only a stack that has such a job should claim it; ``--recheck reindex``
  then asks whether the rebuild brings z back from a source the forget left.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    #: the agent sends a tenant's model calls to the ``model_base_url`` its sessions are started with
    #: (what lets the harness drive tenants at the same time: ``eu-audit gate --tenants-in-flight N``)
    tenant_model_url: bool = False
    restart: bool = False  # the agent reloads a tenant from what it persisted, as a new process would
    reindex: bool = False  # the agent rebuilds a tenant's derived indexes from its records when told
    store_files: bool = False  # the agent names the files it persists a tenant's data in (``files``)


class OfferedTool(_Model):
    """An OpenAI-style function the harness offers for this session (it answers the calls)."""

    type: Literal["function"] = "function"
    function: dict[str, Any]


class StartSession(_Model):
    tenant: str
    seed: int = 0
    tools: list[OfferedTool] = Field(default_factory=list)
    #: the OpenAI base URL (ending in /v1) for every model call made for this tenant, its sessions, forks,
    #: memory writes and forget; None: the agent's own configured one (a run driven one tenant at a time)
    model_base_url: str | None = None


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


class StoreFiles(_Model):
    """Where the agent persists a tenant's data: absolute paths on the harness's machine."""

    paths: list[str] = Field(default_factory=list, max_length=1000)


@dataclass(frozen=True)
class Endpoint:
    """One call of the contract, written once: the HTTP client, the reference server, the Python
    adapter's check and the table in this module's docstring are all made from ``ENDPOINTS``."""

    op: str  # the Python protocol's method (``AgentUnderTest.<op>``)
    method: Literal["GET", "POST"]
    path: str  # under PREFIX; ``{name}`` segments are the op's leading arguments
    request: type[BaseModel] | None
    answer: type[BaseModel]
    #: None: every agent serves it; else the ``Capabilities`` flag that says it does
    capability: str | None = None

    @property
    def required(self) -> bool:
        return self.capability is None

    @property
    def params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("capabilities", "GET", "/capabilities", None, Capabilities),
    Endpoint("start", "POST", "/sessions", StartSession, Session),
    Endpoint("send", "POST", "/sessions/{session_id}/messages", Message, Turn),
    Endpoint("fork", "POST", "/sessions/{session_id}/fork", None, Session, "fork"),
    Endpoint("compact", "POST", "/sessions/{session_id}/compact", None, Turn, "compact"),
    Endpoint("inject_memory", "POST", "/tenants/{tenant}/memory", MemoryRecord, Turn, "memory_inject"),
    Endpoint("forget", "POST", "/tenants/{tenant}/forget", ForgetRequest, ForgetReceipt),
    Endpoint("reset", "POST", "/tenants/{tenant}/reset", None, Ok),
    Endpoint("dump", "GET", "/tenants/{tenant}/dump", None, StoreDump, "store_dump"),
    Endpoint("restart", "POST", "/tenants/{tenant}/restart", None, Ok, "restart"),
    Endpoint("reindex", "POST", "/tenants/{tenant}/reindex", None, Ok, "reindex"),
    Endpoint("files", "GET", "/tenants/{tenant}/files", None, StoreFiles, "store_files"),
)
BY_OP = {e.op: e for e in ENDPOINTS}
REQUIRED_OPS = tuple(e.op for e in ENDPOINTS if e.required)


def markdown_table() -> str:
    """The endpoint table of this module's docstring (a test keeps the two equal)."""
    rows = ["| method and path | body | answer |", "|---|---|---|"]
    for e in ENDPOINTS:
        optional = "" if e.required else f" (optional: ``{e.capability}``)"
        body = f"``{e.request.__name__}``" if e.request else ""
        rows.append(f"| ``{e.method} {PREFIX}{e.path}``{optional} | {body} | ``{e.answer.__name__}`` |")
    return "\n".join(rows)


def agent_api_schema() -> dict[str, Any]:
    """The contract as one JSON document: endpoints and the schema of every body."""
    models: dict[str, Any] = {}
    endpoints = []
    for e in ENDPOINTS:
        for m in (e.request, e.answer):
            if m is not None:
                models[m.__name__] = m.model_json_schema()
        endpoints.append(
            {
                "op": e.op,
                "method": e.method,
                "path": PREFIX + e.path,
                "request": e.request.__name__ if e.request else None,
                "answer": e.answer.__name__,
                "required": e.required,
                "capability": e.capability,
            }
        )
    return {
        "$id": API_VERSION,
        "title": "eu-audit agent-under-test contract",
        "description": (__doc__ or "").strip(),
        "endpoints": endpoints,
        "schemas": models,
    }
