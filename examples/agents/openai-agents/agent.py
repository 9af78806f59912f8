"""A chat agent with tools on the OpenAI Agents SDK (``openai-agents``), its conversation kept in the SDK's
``SQLiteSession``, served over eu-audit's agent contract.

It is the agent the SDK's docs build: an ``Agent`` run by ``Runner`` with a ``SQLiteSession`` for memory
(one per conversation, all of a tenant's in one SQLite file), its model the SDK's default class,
``OpenAIResponsesModel`` (the Responses API, which ``eu-audit serve`` answers; ``--api chat`` for
``OpenAIChatCompletionsModel`` on an endpoint without it). The SDK keeps no long-term memory of its own:
records the harness injects go to a session of their own (``memory``) whose items the agent's
instructions list.

``--session advanced`` keeps the conversation in the SDK's ``AdvancedSQLiteSession`` instead (branches
and usage analytics: its ``message_structure`` and ``turn_usage`` tables beside the messages), the session
the residue pack's openai-agents cases run on different releases.

Its forget is what the SDK documents for removing conversation items, chosen with ``--forget``:

- ``rewrite`` (default): for every session of the tenant, ``get_items``, ``clear_session`` and
  ``add_items`` of the items that do not carry the target (the items that do are gone);
- ``clear``: ``clear_session`` of every session that carries the target (the whole conversation goes);
- ``none``: acknowledged, nothing removed (the paper's B0).

``files`` names the tenant's SQLite file, which eu-audit reads itself (rows, orphans, raw bytes).
``dump`` lists each session's items and, as a store tier of its own (``sqlite-file``), the printable
strings of the SQLite file itself: SQLite leaves a deleted row's bytes in the file's free pages until they
are reused (``secure_delete`` is off by default), and a forget that only deletes rows leaves them there.

Tools: the harness runs them. The SDK invokes a function tool itself, so each tool here records the call
and answers a placeholder, the run stops at the first tool (``tool_use_behavior="stop_on_first_tool"``)
and the agent returns the call as its action; the harness's result then replaces the placeholder
(``pop_item``, the SDK's documented undo of the last item) before the run goes on.

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``).

    pip install -r examples/agents/openai-agents/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \\
        python examples/agents/openai-agents/agent.py --port 9002 --data /tmp/oai-agent
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no phone-home

from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    SQLiteSession,
    set_tracing_disabled,
)
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    SYSTEM,
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    action,
    arguments,
    norm,
    serve_agent,
)

set_tracing_disabled(True)

PENDING = "(the result of this call arrives in the next message)"
MEMORY = "memory"  # the session that holds the tenant's injected records


def _text(item: Any) -> str:
    return json.dumps(item, ensure_ascii=False)


def _file_strings(path: Path, shortest: int = 8) -> list[str]:
    """The printable runs of a file's bytes (what ``strings`` shows): live rows and freed pages alike."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [m.decode("utf-8", "replace") for m in re.findall(rb"[\x20-\x7e]{%d,}" % shortest, data)]


class AgentsSDKAgent(Tenants):
    def __init__(
        self, data: Path, model: str, forget: str = "rewrite", session: str = "sqlite", api: str = "responses"
    ) -> None:
        super().__init__(data)
        self.data, self.model, self.forget_mode, self.session_kind = data, model, forget, session
        self.api = api  # the SDK's default model class speaks the Responses API
        self.clients: dict[str, AsyncOpenAI] = {}  # base URL -> client, bound to the loop below
        # one event loop for every run: an async client outlives a run, and must not outlive its loop
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    # --- plumbing ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def store(self, tenant: str, sid: str) -> Iterator[SQLiteSession]:
        """The SDK's session ``sid`` in the tenant's SQLite file, closed after use."""
        folder = self.folder(tenant)
        folder.mkdir(parents=True, exist_ok=True)
        if self.session_kind == "advanced":
            from agents.extensions.memory import AdvancedSQLiteSession

            session: SQLiteSession = AdvancedSQLiteSession(
                session_id=sid, db_path=folder / "sessions.sqlite", create_tables=True
            )
        else:
            session = SQLiteSession(sid, folder / "sessions.sqlite")
        try:
            yield session
        finally:
            session.close()

    def items(self, tenant: str, sid: str) -> list[Any]:
        with self.store(tenant, sid) as store:
            return list(asyncio.run(store.get_items()))

    def stored_ids(self, tenant: str) -> list[str]:
        """Every session id the tenant's file holds (the SDK's sessions table), the memory one included."""
        import sqlite3

        path = self.folder(tenant) / "sessions.sqlite"
        if not path.exists():
            return []
        db = sqlite3.connect(path)
        try:
            return [r[0] for r in db.execute("SELECT session_id FROM agent_sessions")]
        except sqlite3.Error:
            return []
        finally:
            db.close()

    def agent(self, tenant: str, tools: list[dict[str, Any]], memories: list[str], calls: list[Any]) -> Agent:
        base = self.bases.get(tenant, self.base)
        with self.meta:
            if base not in self.clients:
                self.clients[base] = AsyncOpenAI(base_url=base, api_key="none")
            client = self.clients[base]
        instructions = SYSTEM
        if memories:
            instructions += "\nWhat you remember about the user:\n" + "\n".join(f"- {m}" for m in memories)

        def tool(spec: dict[str, Any]) -> FunctionTool:
            fn = spec.get("function") or spec

            async def invoke(ctx: Any, args: str, name: str = str(fn["name"])) -> str:
                calls.append({"id": getattr(ctx, "tool_call_id", ""), "name": name, "arguments": args})
                return PENDING

            return FunctionTool(
                name=str(fn["name"]),
                description=str(fn.get("description", "")),
                params_json_schema=fn.get("parameters") or {"type": "object", "properties": {}},
                on_invoke_tool=invoke,
                strict_json_schema=False,
            )

        return Agent(
            name="assistant",
            instructions=instructions,
            model=(OpenAIResponsesModel if self.api == "responses" else OpenAIChatCompletionsModel)(
                model=self.model, openai_client=client
            ),
            model_settings=ModelSettings(temperature=0.0, max_tokens=96),
            tools=[tool(t) for t in tools],
            tool_use_behavior="stop_on_first_tool",
        )

    def memories(self, tenant: str) -> list[str]:
        return [str(it.get("content", "")) for it in self.items(tenant, MEMORY) if isinstance(it, dict)]

    def run(self, sid: str, new: list[dict[str, Any]]) -> dict[str, Any]:
        s = self.session(sid)
        calls: list[dict[str, Any]] = []
        agent = self.agent(s["tenant"], s["tools"], self.memories(s["tenant"]), calls)
        with self.store(s["tenant"], sid) as store:
            try:
                run = Runner.run(agent, new, session=store, max_turns=4)  # type: ignore[arg-type]
                result = asyncio.run_coroutine_threadsafe(run, self.loop).result()
            except (ModelBehaviorError, MaxTurnsExceeded) as exc:
                # the SDK refuses a reply it cannot read (an empty answer cut at the token cap): the turn
                # says nothing, as a deployed agent's error handler would
                print(f"the SDK refused the model's answer: {exc}", flush=True)
                return {"text": "", "actions": []}
        text = "" if calls else str(result.final_output or "")
        return {"text": text, "actions": [action(c["id"], c["name"], c["arguments"]) for c in calls]}

    # --- the contract -----------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools}
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        s = self.session(sid)
        new: list[dict[str, Any]] = [{"role": "user", "content": body.content}]
        if body.role == "tool":  # by default a tool result the scaffold ran (no call of ours): context
            new = [{"role": "user", "content": f"Tool result ({body.name}): {body.content}"}]
            with self.store(s["tenant"], sid) as store:
                items = asyncio.run(store.get_items())
                last: Any = items[-1] if items else {}
                pending = isinstance(last, dict) and last.get("output") == PENDING
                if pending and last.get("call_id") == body.tool_call_id:
                    asyncio.run(store.pop_item())  # the placeholder goes; the harness's result replaces it
                    out = {
                        "type": "function_call_output",
                        "call_id": body.tool_call_id,
                        "output": body.content,
                    }
                    new = [out]
        return self.run(sid, new)

    def fork(self, sid: str) -> dict[str, Any]:
        tenant = self.tenant_of(sid)
        items = self.items(tenant, sid)
        new = self.fork_session(sid, deep=False)
        with self.store(tenant, new) as store:
            asyncio.run(store.add_items(items))
        return {"session_id": new}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        with self.store(tenant, MEMORY) as store:
            asyncio.run(store.add_items([{"role": "user", "content": body.text}]))
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"removed": 0}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]
        removed, cleared = 0, []
        for sid in self.stored_ids(tenant):
            items = self.items(tenant, sid)
            keep = [it for it in items if not any(n in norm(_text(it)) for n in needles)]
            if len(keep) == len(items):
                continue
            with self.store(tenant, sid) as store:
                asyncio.run(store.clear_session())
                if self.forget_mode == "rewrite":
                    asyncio.run(store.add_items(keep))
            removed += len(items) - (len(keep) if self.forget_mode == "rewrite" else 0)
            cleared.append(sid)
        detail = f"{self.forget_mode}: {removed} items removed from {len(cleared)} sessions"
        return {"status": "ok", "detail": detail, "receipt": {"removed": removed, "sessions": cleared}}

    def reset(self, tenant: str) -> dict[str, Any]:
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        self.drop_sessions(tenant)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: its session table is dropped and read back from
        disk. Its items live in the SDK's SQLite file, opened per call, so nothing else is in memory."""
        self.load_sessions(tenant)
        return {"ok": True}

    def files(self, tenant: str) -> dict[str, Any]:
        """Where the tenant's conversation is persisted: its SQLite file (the WAL lies beside it)."""
        return {"paths": [str((self.folder(tenant) / "sessions.sqlite").resolve())]}

    def dump(self, tenant: str) -> dict[str, Any]:
        """The tenant's sessions item by item, and the printable strings of its SQLite file."""
        items = []
        for sid in self.stored_ids(tenant):
            store = "memory" if sid == MEMORY else "session"
            for i, it in enumerate(self.items(tenant, sid)):
                items.append({"store": store, "id": f"{sid}/{i}", "text": _text(it)})
        for path in sorted(self.folder(tenant).glob("sessions.sqlite*")):  # the file and its WAL
            for i, text in enumerate(_file_strings(path)):
                items.append({"store": "sqlite-file", "id": f"{path.name}/{i}", "text": text})
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9002,
        "openai-agents-data",
        "one SQLite file per tenant",
        forgets={
            "rewrite": "re-add each session's items without the target",
            "clear": "clear_session of every session that holds it",
        },
    )
    ap.add_argument(
        "--session",
        choices=["sqlite", "advanced"],
        default="sqlite",
        help="the SDK's session class: SQLiteSession, or AdvancedSQLiteSession (branches, usage tables)",
    )
    ap.add_argument(
        "--api",
        choices=["responses", "chat"],
        default="responses",
        help="the model class: OpenAIResponsesModel (the SDK's default, /v1/responses) or "
        "OpenAIChatCompletionsModel (/v1/chat/completions, for an endpoint without the Responses API)",
    )
    args = ap.parse_args()
    agent = AgentsSDKAgent(args.data, args.model, forget=args.forget, session=args.session, api=args.api)
    serve_agent(
        agent,
        "openai-agents-sqlite-session",
        args.port,
        title="OpenAI Agents SDK reference agent",
        tenant_model_url=True,
    )


if __name__ == "__main__":
    main()
