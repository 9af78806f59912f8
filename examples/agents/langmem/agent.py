"""A chat agent with tools whose long-term memory is LangMem's memory manager over a LangGraph store,
served over eu-audit's agent contract.

The shape LangMem's documentation teaches: ``create_memory_store_manager`` writes the user's memories
into a LangGraph ``BaseStore`` (here ``SqliteStore``, namespace ``("memories", user)``). Every turn the
agent searches the manager for memories relevant to the message and puts them in the system prompt;
after every exchange it hands the exchange to the manager, whose LLM extracts new memories and updates
old ones (structured output through tool calls, via ``trustcall``). The conversation itself is a message
buffer per session, kept on disk. Its forget is what LangMem offers: find the memories that carry the
target (``manager.search``) and ``manager.delete`` each one.

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``) and sends its
model calls to an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit serve``). When
LangMem's extraction fails (a model that cannot give the structured output it asks for), the turn fails
with LangMem's own error, which the harness reports with the episode and step (exit 3).

    pip install -r examples/agents/langmem/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \
        python examples/agents/langmem/agent.py --port 9004 --data /tmp/langmem-agent
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from langchain_openai import ChatOpenAI
from langgraph.store.sqlite import SqliteStore
from langmem import create_memory_store_manager
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    SYSTEM,
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    actions,
    arguments,
    norm,
    serve_agent,
)

KEEP_MESSAGES = 8  # the buffer the model sees: older messages drop out of the prompt (kept on disk)


def _text(value: Any) -> str:
    """A LangMem memory's text: stored as ``{"kind": "Memory", "content": {"content": "..."}}``, read back
    by the manager with the content as its ``Memory`` model."""
    content = value.get("content") if isinstance(value, dict) else value
    if isinstance(content, dict):
        content = content.get("content", json.dumps(content))
    return str(getattr(content, "content", content))


class LangMemAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "langmem") -> None:
        super().__init__(data)
        data.mkdir(parents=True, exist_ok=True)
        self.data, self.model, self.forget_mode = data, model, forget
        # autocommit, as SqliteStore.from_conn_string opens it: the store runs its own BEGIN/COMMIT
        self.store = SqliteStore(
            sqlite3.connect(data / "store.sqlite", check_same_thread=False, isolation_level=None)
        )
        self.store.setup()
        self.managers: dict[str, Any] = {}  # tenant -> its LangMem manager (its LLM on the tenant's lane)

    # --- plumbing ---------------------------------------------------------------------------------

    def sessions_file(self, tenant: str) -> Path:
        return self.data / "sessions" / (re.sub(r"[^A-Za-z0-9_.-]", "_", tenant) + ".json")

    def config(self, tenant: str) -> dict[str, Any]:
        return {"configurable": {"langgraph_user_id": tenant}}

    def manager(self, tenant: str) -> Any:
        if tenant not in self.managers:
            llm = ChatOpenAI(
                model=self.model, base_url=self.bases.get(tenant, self.base), api_key="none",
                temperature=0.0, max_tokens=200,
            )  # fmt: skip
            self.managers[tenant] = create_memory_store_manager(
                llm, namespace=("memories", "{langgraph_user_id}"), store=self.store
            )
        return self.managers[tenant]

    def memories(self, tenant: str, query: str | None = None, limit: int = 5) -> list[Any]:
        return list(self.manager(tenant).search(query=query, limit=limit, config=self.config(tenant)))

    # --- a turn -----------------------------------------------------------------------------------

    def answer(self, s: dict[str, Any], recalled: list[str]) -> dict[str, Any]:
        system = SYSTEM
        if recalled:
            system += "\nWhat you remember about the user:\n" + "\n".join(f"- {m}" for m in recalled)
        window = s["history"][-KEEP_MESSAGES:]
        while window and window[0]["role"] == "tool":  # a tool result without its call
            window = window[1:]
        client = OpenAI(base_url=self.bases.get(s["tenant"], self.base), api_key="none")
        kw: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "system", "content": system}, *window],
            "temperature": 0.0, "max_tokens": 96,
        }  # fmt: skip
        if s["tools"]:
            kw["tools"] = s["tools"]
        msg = client.chat.completions.create(**kw).choices[0].message
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}  # noqa: E501
            for c in msg.tool_calls or []
        ]  # fmt: skip
        s["history"].append(
            {"role": "assistant", "content": msg.content or "", **({"tool_calls": calls} if calls else {})}
        )
        return {"text": msg.content or "", "actions": actions(calls)}

    def extract(self, tenant: str, exchange: list[dict[str, Any]]) -> None:
        """LangMem's extraction over the exchange; its own error fails the turn, named."""
        try:
            self.manager(tenant).invoke({"messages": exchange, "max_steps": 1}, config=self.config(tenant))
        except Exception as exc:
            raise HTTPException(500, f"LangMem's memory manager failed: {type(exc).__name__}: {exc}") from exc

    # --- the contract -----------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url and self.bases.get(body.tenant) != body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
            self.managers.pop(body.tenant, None)  # LangMem's LLM follows the tenant's lane
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools, "history": []}
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        s = self.session(sid)
        calls = {c["id"] for m in s["history"] for c in m.get("tool_calls") or []}
        recalled: list[str] = []
        if body.role == "tool" and body.tool_call_id in calls:
            s["history"].append({"role": "tool", "tool_call_id": body.tool_call_id, "content": body.content})
        elif body.role == "tool":  # a tool result the scaffold ran (no call of ours): context for the model
            s["history"].append({"role": "user", "content": f"Tool result ({body.name}): {body.content}"})
        else:
            recalled = [_text(m.value) for m in self.memories(s["tenant"], body.content)]
            s["history"].append({"role": "user", "content": body.content})
        turn = self.answer(s, recalled)
        exchange = [
            {"role": m["role"], "content": m["content"]}
            for m in s["history"][-2:]
            if m["role"] in ("user", "assistant") and m.get("content")
        ]
        self.save_sessions(s["tenant"])
        if exchange:
            self.extract(s["tenant"], exchange)
        return turn

    def fork(self, sid: str) -> dict[str, Any]:
        return {"session_id": self.fork_session(sid)}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        """As LangMem's own write leaves a memory (kind ``Memory``, its text under ``content``)."""
        value = {"kind": "Memory", "content": {"content": body.text}}
        self.manager(tenant).put(body.id, value, config=self.config(tenant))
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """LangMem's erasure: every memory that carries the target, found by ``search`` with each variant
        and by listing, deleted with ``manager.delete``. ``--forget none``: acknowledged, nothing deleted."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"deleted": []}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]
        found = {
            m.key: _text(m.value)
            for q in [body.target, *body.variants]
            for m in self.memories(tenant, q, 100)
        }
        found.update({m.key: _text(m.value) for m in self.memories(tenant, None, 10_000)})
        deleted = [key for key, text in found.items() if any(n in norm(text) for n in needles)]
        for key in deleted:
            self.manager(tenant).delete(key, config=self.config(tenant))
        return {
            "status": "ok",
            "detail": f"deleted {len(deleted)} LangMem memories",
            "receipt": {"deleted": deleted},
        }

    def reset(self, tenant: str) -> dict[str, Any]:
        for item in self.store.search(("memories", tenant), limit=100_000):
            self.store.delete(item.namespace, item.key)
        self.drop_sessions(tenant)
        self.sessions_file(tenant).unlink(missing_ok=True)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: its LangMem manager is made anew and its
        conversations are read back from disk (the store is SQLite, read on every call)."""
        with self.meta:
            self.managers.pop(tenant, None)
        self.load_sessions(tenant)
        return {"ok": True}

    def files(self, tenant: str) -> dict[str, Any]:
        """Where the tenant is persisted: the LangGraph store every tenant shares (eu-audit counts only
        its rows that name this tenant) and the tenant's conversation file."""
        return {
            "paths": [str((self.data / "store.sqlite").resolve()), str(self.sessions_file(tenant).resolve())]
        }

    def dump(self, tenant: str) -> dict[str, Any]:
        """LangMem's memories in the store (every item of the tenant's namespaces) and the conversations."""
        items = [
            {"store": "langmem", "id": "/".join([*it.namespace, it.key]), "text": json.dumps(it.value)}
            for it in self.store.search(("memories", tenant), limit=100_000)
        ]
        with self.meta:
            mine = [(sid, s) for sid, s in self.sessions.items() if s["tenant"] == tenant]
        for sid, s in mine:
            for i, msg in enumerate(s["history"]):
                items.append(
                    {"store": "conversation", "id": f"{sid}/{i}", "text": str(msg.get("content") or "")}
                )
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9004,
        "langmem-agent-data",
        "the store and the sessions",
        forgets={
            "langmem": "delete the memories that carry the target",
        },
    )
    args = ap.parse_args()
    agent = LangMemAgent(args.data, args.model, forget=args.forget)
    serve_agent(agent, "langmem-agent", args.port, title="LangMem reference agent", tenant_model_url=True)


if __name__ == "__main__":
    main()
