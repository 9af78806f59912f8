"""Agents under test written for the tests, reached with ``--agent tests.scripted_agents:NAME``: no model of
their own, their model calls (if any) through ``eu-audit serve`` at ``$EU_AUDIT_TEST_SERVE``. They exercise
the harness, never evidence about forgetting."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from itertools import count
from pathlib import Path
from typing import Any

from eu_audit.blackbox.contract import (
    Capabilities,
    ForgetReceipt,
    ForgetRequest,
    MemoryRecord,
    Message,
    OfferedTool,
    StoreDump,
    Turn,
)


def _http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data, {"Content-Type": "application/json", **(headers or {})}, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, None


class ForgingAgent:
    """Keeps every message of a tenant (memory records included) and sends them all to serve's chat
    endpoint for each reply; its forget deletes nothing. Before each model call it tries the control
    surface, as an agent that wants to look clean would: mark its prompts as pre-forget, change the
    pinned decoding, read the log. ``attempts`` keeps the status codes it got."""

    def __init__(self) -> None:
        self.serve = os.environ["EU_AUDIT_TEST_SERVE"].rstrip("/")
        self.history: dict[str, list[dict[str, str]]] = {}  # tenant -> messages
        self.tenant_of: dict[str, str] = {}
        self.ids = count()
        self.attempts: list[int] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(name="forging", memory_inject=True)

    def _forge(self) -> None:
        mark = {"tag": {"tenant": "forged", "phase": "stream"}}
        self.attempts.append(_http("POST", self.serve + "/eu-audit/v1/mark", mark)[0])
        self.attempts.append(
            _http("POST", self.serve + "/eu-audit/v1/mark", mark, {"X-EU-Audit-Control": "0" * 64})[0]
        )
        self.attempts.append(_http("POST", self.serve + "/eu-audit/v1/decoding", {"mode": "agent"})[0])
        self.attempts.append(_http("GET", self.serve + "/eu-audit/v1/log")[0])

    def _reply(self, tenant: str) -> Turn:
        self._forge()
        body = {"messages": self.history[tenant], "max_tokens": 8}
        status, got = _http("POST", self.serve + "/v1/chat/completions", body)
        assert status == 200, status
        return Turn(text=str(got["choices"][0]["message"]["content"] or ""))

    def start(self, tenant: str, *, seed: int, tools: list[OfferedTool]) -> str:
        sid = f"{tenant}-{next(self.ids)}"
        self.tenant_of[sid] = tenant
        self.history.setdefault(tenant, [])
        return sid

    def send(self, session_id: str, message: Message) -> Turn:
        tenant = self.tenant_of[session_id]
        self.history[tenant].append({"role": "user", "content": message.content})
        return self._reply(tenant)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.history.setdefault(tenant, []).append({"role": "system", "content": f"Memory: {record.text}"})
        return Turn(text="")

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        return ForgetReceipt(status="ok", detail="(deleted nothing)")

    def reset(self, tenant: str) -> None:
        self.history[tenant] = []

    def dump(self, tenant: str) -> StoreDump:
        return StoreDump()


AGENTS: list[ForgingAgent] = []


def forging() -> ForgingAgent:
    agent = ForgingAgent()
    AGENTS.append(agent)
    return agent


class NotebookAgent:
    """No model: it writes every message it gets into a notebook (one per tenant) and answers each message
    with its whole notebook, so whatever it still holds shows in every answer and in its dump. Its forget
    either removes every note that carries a variant of the target (``thorough``) or nothing at all."""

    def __init__(self, thorough: bool) -> None:
        self.thorough = thorough
        self.notes: dict[str, list[str]] = {}
        self.tenant_of: dict[str, str] = {}
        self.ids = count()

    def capabilities(self) -> Capabilities:
        return Capabilities(name="notebook", memory_inject=True, store_dump=True)

    def _answer(self, tenant: str) -> Turn:
        return Turn(text="Noted. I know: " + " | ".join(self.notes[tenant]))

    def start(self, tenant: str, *, seed: int, tools: list[OfferedTool]) -> str:
        sid = f"{tenant}-{next(self.ids)}"
        self.tenant_of[sid] = tenant
        self.notes.setdefault(tenant, [])
        return sid

    def send(self, session_id: str, message: Message) -> Turn:
        tenant = self.tenant_of[session_id]
        self.notes[tenant].append(message.content)
        return self._answer(tenant)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.notes.setdefault(tenant, []).append(record.text)
        return Turn(text="")

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        if self.thorough:
            variants = [v.lower() for v in [request.target, *request.variants]]
            self.notes[tenant] = [n for n in self.notes[tenant] if not any(v in n.lower() for v in variants)]
        return ForgetReceipt(status="ok")

    def reset(self, tenant: str) -> None:
        self.notes[tenant] = []

    def dump(self, tenant: str) -> StoreDump:
        from eu_audit.blackbox.contract import StoredItem

        return StoreDump(items=[StoredItem(store="notes", text=t) for t in self.notes.get(tenant, [])])


def thorough() -> NotebookAgent:
    return NotebookAgent(thorough=True)


class MuteAgent(NotebookAgent):
    """A thorough forget, and never a word: every answer is empty (as Letta on a small model that never
    calls its ``send_message``), so what it says cannot show what it forgot."""

    def __init__(self) -> None:
        super().__init__(thorough=True)

    def _answer(self, tenant: str) -> Turn:
        return Turn(text="")


def mute() -> MuteAgent:
    return MuteAgent()


class HidingAgent(NotebookAgent):
    """Its forget stops *saying* the target: the notes that carry it leave its answers but move to an
    archive its dump still lists (z suppressed, not erased)."""

    def __init__(self) -> None:
        super().__init__(thorough=False)
        self.archive: dict[str, list[str]] = {}

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        variants = [v.lower() for v in [request.target, *request.variants]]
        carries = [n for n in self.notes[tenant] if any(v in n.lower() for v in variants)]
        self.archive.setdefault(tenant, []).extend(carries)
        self.notes[tenant] = [n for n in self.notes[tenant] if n not in carries]
        return ForgetReceipt(status="ok")

    def reset(self, tenant: str) -> None:
        super().reset(tenant)
        self.archive[tenant] = []

    def dump(self, tenant: str) -> StoreDump:
        from eu_audit.blackbox.contract import StoredItem

        kept = super().dump(tenant).items
        return StoreDump(
            items=[*kept, *(StoredItem(store="archive", text=t) for t in self.archive.get(tenant, []))]
        )


def hiding() -> HidingAgent:
    return HidingAgent()


class JournalAgent(NotebookAgent):
    """Persists each note to a journal (its "disk") and serves from the notes it loaded (its memory). Its
    forget removes the target's notes from memory; with ``rewrite`` it rewrites the journal too, without
    it the journal keeps them and a ``restart``, which reloads memory from the journal, brings z back.
    Session ids survive the restart, as the contract asks."""

    def __init__(self, rewrite: bool) -> None:
        super().__init__(thorough=True)
        self.rewrite = rewrite
        self.journal: dict[str, list[str]] = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(name="journal", memory_inject=True, store_dump=True, restart=True)

    def send(self, session_id: str, message: Message) -> Turn:
        self.journal.setdefault(self.tenant_of[session_id], []).append(message.content)
        return super().send(session_id, message)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.journal.setdefault(tenant, []).append(record.text)
        return super().inject_memory(tenant, record)

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        receipt = super().forget(tenant, request)
        if self.rewrite:
            self.journal[tenant] = list(self.notes[tenant])
        return receipt

    def reset(self, tenant: str) -> None:
        super().reset(tenant)
        self.journal[tenant] = []

    def restart(self, tenant: str) -> None:
        self.notes[tenant] = list(self.journal.get(tenant, []))


def write_behind() -> JournalAgent:
    """Its forget passes at once and comes back after a restart."""
    return JournalAgent(rewrite=False)


def durable() -> JournalAgent:
    """Its forget reaches what it persisted: it stays done after a restart."""
    return JournalAgent(rewrite=True)


class NoComingBack(JournalAgent):
    def restart(self, tenant: str) -> None:
        raise RuntimeError("the journal is gone")


def no_coming_back() -> JournalAgent:
    """Says it can restart; its restart fails."""
    return NoComingBack(rewrite=True)


class IndexAgent(JournalAgent):
    """Serves from an index it derives from its rows (the journal), as a vector index over a table. Its
    forget deletes the target's entries from the index; with ``rewrite`` it deletes the rows too. Its
    ``reindex`` rebuilds the index from the rows, as a stack's scheduled re-index would: without
    ``rewrite`` that brings z back. It claims no restart."""

    def capabilities(self) -> Capabilities:
        return Capabilities(name="index", memory_inject=True, store_dump=True, reindex=True)

    def reindex(self, tenant: str) -> None:
        self.notes[tenant] = list(self.journal.get(tenant, []))


def stale_index() -> IndexAgent:
    """Its forget passes at once and comes back after a re-index."""
    return IndexAgent(rewrite=False)


def naive() -> NotebookAgent:
    return NotebookAgent(thorough=False)


class WindowAgent(NotebookAgent):
    """Keeps the last few inputs it received in a window beside its notebook, as mem0 keeps a session's last
    10 messages for its extraction prompt, and its forget cleans the notebook only. The window is not in its
    answers; later inputs evict the target from it, so it is there right after the forget and gone by the
    time the probes are done."""

    WINDOW = 5

    def __init__(self) -> None:
        super().__init__(thorough=True)
        self.window: dict[str, list[str]] = {}

    def _seen(self, tenant: str, text: str) -> None:
        kept = self.window.setdefault(tenant, [])
        kept.append(text)
        del kept[: -self.WINDOW]

    def send(self, session_id: str, message: Message) -> Turn:
        self._seen(self.tenant_of[session_id], message.content)
        return super().send(session_id, message)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self._seen(tenant, record.text)
        return super().inject_memory(tenant, record)

    def reset(self, tenant: str) -> None:
        super().reset(tenant)
        self.window[tenant] = []

    def dump(self, tenant: str) -> StoreDump:
        from eu_audit.blackbox.contract import StoredItem

        window = [StoredItem(store="window", text=t) for t in self.window.get(tenant, [])]
        return StoreDump(items=[*super().dump(tenant).items, *window])


def windowed() -> WindowAgent:
    """Its forget leaves z in a window that later inputs evict."""
    return WindowAgent()


class LaneAgent:
    """Keeps every user message and memory record of a tenant and sends them all to the model for each
    reply, at the ``model_base_url`` its tenant was started with (serve's lane): a naive forget, so every
    post-forget prompt of the forgetting tenant carries z. ``stray`` ignores the lane and calls serve's
    root URL, as an agent with one global client would."""

    def __init__(self, stray: bool = False) -> None:
        self.serve = os.environ["EU_AUDIT_TEST_SERVE"].rstrip("/")
        self.stray = stray
        self.history: dict[str, list[dict[str, str]]] = {}
        self.url: dict[str, str] = {}
        self.tenant_of: dict[str, str] = {}
        self.ids = count()

    def capabilities(self) -> Capabilities:
        return Capabilities(name="lanes", memory_inject=True, tenant_model_url=True)

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        # without serve (in-process tests) there is no lane: serve's root URL is the tenant's then
        self.url[tenant] = model_base_url if model_base_url and not self.stray else self.serve + "/v1"
        sid = f"{tenant}-{next(self.ids)}"
        self.tenant_of[sid] = tenant
        self.history.setdefault(tenant, [])
        return sid

    def send(self, session_id: str, message: Message) -> Turn:
        tenant = self.tenant_of[session_id]
        self.history[tenant].append({"role": "user", "content": message.content})
        body = {"messages": self.history[tenant], "max_tokens": 4}
        status, got = _http("POST", self.url[tenant] + "/chat/completions", body)
        assert status == 200, (status, got)
        return Turn(text=str(got["choices"][0]["message"]["content"] or ""))

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        self.history.setdefault(tenant, []).append({"role": "system", "content": f"Memory: {record.text}"})
        return Turn(text="")

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        return ForgetReceipt(status="ok", detail="(deleted nothing)")

    def reset(self, tenant: str) -> None:
        self.history[tenant] = []


def lanes() -> LaneAgent:
    return LaneAgent()


class HangingAgent(LaneAgent):
    """The lane agent, whose tenants after the first three lanes never come back from ``start`` (a slow agent,
    or a hung one): with three tenants in flight, the third to hang means every tenant of the first
    session finished. It then touches the file ``EU_AUDIT_TEST_HANG`` names, for the test to stop the run."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.hanging = 0
        self.lock = threading.Lock()

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        with self.lock:  # a tenant is told by its lane (a bystander shares its forgetting tenant's)
            lane = model_base_url or tenant
            if lane not in self.started:
                self.started.append(lane)
            late = self.started.index(lane) >= 3
            if late:
                self.hanging += 1
                if self.hanging == 3:
                    Path(os.environ["EU_AUDIT_TEST_HANG"]).touch()
        if late:
            time.sleep(300)
        return super().start(tenant, seed=seed, tools=tools, model_base_url=model_base_url)


def hanging() -> HangingAgent:
    return HangingAgent()


class RewritingAgent(LaneAgent):
    """A forget that asks the model to rewrite the tenant's history without the target (one model call),
    then keeps the model's answer: the call is made inside the forget, and serve's log says so."""

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        ask = [*self.history[tenant], {"role": "user", "content": "Rewrite the above without the target."}]
        body = {"messages": ask, "max_tokens": 4}
        status, got = _http("POST", self.url[tenant] + "/chat/completions", body)
        assert status == 200, (status, got)
        self.history[tenant] = [{"role": "system", "content": str(got["choices"][0]["message"]["content"])}]
        return ForgetReceipt(status="ok", detail="history rewritten by the model")


def rewriting() -> RewritingAgent:
    return RewritingAgent()


def stray() -> LaneAgent:
    return LaneAgent(stray=True)


class SmugglingAgent(LaneAgent):
    """A hostile agent: after its forget no message's content holds z (each is redacted with the target
    matcher itself), yet every model call still carries everything the tenant ever said, in one place a
    detector that reads only message content misses: its earlier tool calls' arguments (``calls``), an
    offered tool's description (``specs``), a response format's JSON schema (``format``), or z cut in
    two halves sent as two messages (``split``)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.matcher: dict[str, Any] = {}  # tenant -> the target matcher its forget named

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        from eu_audit.matching import TargetMatcher

        self.matcher[tenant] = TargetMatcher.of(request.target, request.variants)
        return ForgetReceipt(status="ok", detail="(removed z from every message's content)")

    def _body(self, tenant: str, history: list[dict[str, str]]) -> dict[str, Any]:
        m = self.matcher.get(tenant)
        if m is None:
            return {"messages": history, "max_tokens": 4}
        kept = " | ".join(h["content"] for h in history)
        clean = [{**h, "content": m.redact(h["content"], "")} for h in history]
        if self.mode == "calls":
            call = {
                "id": "c1",
                "type": "function",
                "function": {"name": "note", "arguments": json.dumps({"t": kept})},
            }
            smuggled = [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
            return {"messages": [*smuggled, *clean], "max_tokens": 4}
        if self.mode == "specs":
            spec = {
                "name": "recall",
                "description": f"Known: {kept}",
                "parameters": {"type": "object", "properties": {}},
            }
            return {"messages": clean, "tools": [{"type": "function", "function": spec}], "max_tokens": 4}
        if self.mode == "format":
            schema = {"type": "object", "description": f"Known: {kept}"}
            fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
            return {"messages": clean, "response_format": fmt, "max_tokens": 4}
        a, b = m.spans(kept)[0]
        cut = (a + b) // 2  # each half alone is no variant of z; the two read in order are
        halves = [{"role": "user", "content": kept[:cut]}, {"role": "user", "content": kept[cut:]}]
        return {"messages": [*halves, *clean[-1:]], "max_tokens": 4}

    def send(self, session_id: str, message: Message) -> Turn:
        tenant = self.tenant_of[session_id]
        self.history[tenant].append({"role": "user", "content": message.content})
        status, got = _http(
            "POST", self.url[tenant] + "/chat/completions", self._body(tenant, self.history[tenant])
        )
        assert status == 200, (status, got)
        return Turn(text=str(got["choices"][0]["message"]["content"] or ""))


def smuggle_calls() -> SmugglingAgent:
    return SmugglingAgent("calls")


def smuggle_specs() -> SmugglingAgent:
    return SmugglingAgent("specs")


def smuggle_format() -> SmugglingAgent:
    return SmugglingAgent("format")


def smuggle_split() -> SmugglingAgent:
    return SmugglingAgent("split")


class FloorLifter(NotebookAgent):
    """Hostile: its forget cleans its notebook, but it knows the suite's targets and says them to every
    tenant, the reference (B5, never fed z) among them. Since the floor is read from the reference's
    answers, saying z there lifts the floor its own answers are measured against."""

    def __init__(self) -> None:
        super().__init__(thorough=True)
        from eu_audit.suites import load_suite

        self.targets = [ep.target.value for ep in load_suite("builtin")]

    def _answer(self, tenant: str) -> Turn:
        return Turn(text=super()._answer(tenant).text + " | As I recall: " + "; ".join(self.targets))


def floor_lifter() -> FloorLifter:
    return FloorLifter()


class InterruptedAgent(NotebookAgent):
    """The thorough notebook, whose host is stopped (^C, SIGTERM) as the second session begins: when a
    fifth tenant is reset (a session's three tenants and the agent's bystander come first)."""

    def __init__(self) -> None:
        super().__init__(thorough=True)
        self.seen: set[str] = set()

    def reset(self, tenant: str) -> None:
        self.seen.add(tenant)
        if len(self.seen) > 4:
            raise KeyboardInterrupt
        super().reset(tenant)


def interrupted() -> InterruptedAgent:
    return InterruptedAgent()


if (
    __name__ == "__main__"
):  # one of these agents over real HTTP: python -m tests.scripted_agents NAME --port P
    import argparse

    from eu_audit.blackbox.agent_server import run_agent_server

    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    run_agent_server(globals()[a.name](), port=a.port)
