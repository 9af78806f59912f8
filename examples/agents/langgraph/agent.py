"""A tool-calling agent on LangGraph, served over eu-audit's agent contract.

The shape LangGraph's documentation teaches: a ``StateGraph`` over ``MessagesState`` (plus a running
summary), compiled with a SQLite checkpointer (``SqliteSaver``: every step of every thread is kept) and a
SQLite store for long-term memory (``SqliteStore``, one namespace per user). Each model call reads the
user's memories from the store into the system prompt; a long thread is summarized and its old messages
removed (``RemoveMessage``). Its forget is the documented ``BaseStore.delete`` of every store item that
carries the target.

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``) and sends its
model calls to an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit serve``).

    pip install -r examples/agents/langgraph/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \
        python examples/agents/langgraph/agent.py --port 9001 --data /tmp/lg-agent
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.sqlite import SqliteStore
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    SYSTEM,
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    arguments,
    norm,
    serve_agent,
)

KEEP_MESSAGES = 6  # past this, older messages are summarized and removed from the thread


class State(MessagesState):
    summary: str


class LangGraphAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "store", index: bool = False) -> None:
        super().__init__(data)
        data.mkdir(parents=True, exist_ok=True)
        self.forget_mode = forget
        self.clients: dict[str, OpenAI] = {}  # base URL -> client
        self.model = model
        self.checkpointer = SqliteSaver(sqlite3.connect(data / "checkpoints.sqlite", check_same_thread=False))
        # autocommit, as SqliteStore.from_conn_string opens it: the store runs its own BEGIN/COMMIT
        # --index: a semantic index over the memories, embedded through the model server's /v1/embeddings
        # (store_vectors, beside the store's own rows: langgraph#8757 is about what delete leaves there)
        embedding = {"dims": 384, "embed": self._embed, "fields": ["text"]} if index else None
        self.store = SqliteStore(
            sqlite3.connect(data / "store.sqlite", check_same_thread=False, isolation_level=None),
            index=embedding,  # type: ignore[arg-type]
        )
        self.store.setup()
        self.data = data
        self.graph = self._build()

    def client(self, tenant: str) -> OpenAI:
        base = self.bases.get(tenant, self.base)
        with self.meta:
            if base not in self.clients:
                self.clients[base] = OpenAI(base_url=base, api_key=os.environ.get("OPENAI_API_KEY", "none"))
            return self.clients[base]

    def _embed(self, texts: list[str]) -> list[list[float]]:
        got = self.client("").embeddings.create(model=self.model, input=texts)
        return [list(d.embedding) for d in got.data]

    def files(self, tenant: str) -> dict[str, Any]:
        """Where this agent persists every tenant: the store (and its vectors) and the checkpointer."""
        return {"paths": [str((self.data / n).resolve()) for n in ("store.sqlite", "checkpoints.sqlite")]}

    def sessions_file(self, tenant: str) -> Path:
        return self.data / "sessions" / (re.sub(r"[^A-Za-z0-9_.-]", "_", tenant) + ".json")

    # --- the graph ------------------------------------------------------------------------------------

    def _build(self) -> Any:
        def call_model(state: State, config: RunnableConfig, *, store: BaseStore) -> dict[str, Any]:
            conf = config["configurable"]
            system = SYSTEM
            memories = [it.value["text"] for it in store.search((conf["tenant"], "memories"), limit=20)]
            if memories:
                system += "\nWhat you remember about the user:\n" + "\n".join(f"- {m}" for m in memories)
            if state.get("summary"):
                system += "\nSummary of the conversation so far: " + state["summary"]
            messages = [{"role": "system", "content": system}, *convert_to_openai_messages(state["messages"])]
            return {"messages": [self._ask(conf["tenant"], messages, conf.get("tools") or None)]}

        g = StateGraph(State)
        g.add_node("model", call_model)
        g.add_edge(START, "model")
        g.add_edge("model", END)
        return g.compile(checkpointer=self.checkpointer, store=self.store)

    def _ask(self, tenant: str, messages: list[Any], tools: list[dict[str, Any]] | None) -> AIMessage:
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": 96}
        if tools:
            kw["tools"] = tools
        msg = self.client(tenant).chat.completions.create(**kw).choices[0].message
        calls = []
        for c in msg.tool_calls or []:
            try:
                args = json.loads(c.function.arguments or "{}")
            except ValueError:
                args = {}
            calls.append(
                {"id": c.id, "name": c.function.name, "args": args if isinstance(args, dict) else {}}
            )
        return AIMessage(content=msg.content or "", tool_calls=calls)

    def _config(self, sid: str) -> RunnableConfig:
        s = self.session(sid)
        return {"configurable": {"thread_id": sid, "tenant": s["tenant"], "tools": s["tools"]}}

    def _call_ids(self, config: RunnableConfig) -> set[str]:
        """The ids of the tool calls the model made in this thread (a tool result must answer one)."""
        messages = self.graph.get_state(config).values.get("messages", [])
        return {str(c["id"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}

    def _summarize(self, sid: str, keep: int) -> str:
        """LangGraph's summarization pattern: fold old messages into ``summary`` and remove them."""
        config = self._config(sid)
        state = self.graph.get_state(config).values
        msgs: list[AnyMessage] = list(state.get("messages", []))
        cut = max(len(msgs) - keep, 0)
        while cut < len(msgs) and isinstance(msgs[cut], ToolMessage):  # never strand a tool result
            cut += 1
        old = msgs[:cut]
        if not old:
            return str(state.get("summary", ""))
        lines = "\n".join(f"{m.type}: {m.content}" for m in old)
        summary = (
            self._ask(
                str(config["configurable"]["tenant"]),
                [
                    {"role": "system", "content": "Summarize the conversation in at most three sentences."},
                    {
                        "role": "user",
                        "content": f"Earlier summary: {state.get('summary') or '(none)'}\n{lines}",
                    },
                ],
                None,
            ).content
            or ""
        )
        removals = [RemoveMessage(id=m.id) for m in old if m.id]
        self.graph.update_state(config, {"summary": str(summary), "messages": removals})
        return str(summary)

    # --- the contract ---------------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
        sid = f"{body.tenant}-{uuid.uuid4().hex[:12]}"  # a thread id naming its tenant (rows tell whose)
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools}
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        config = self._config(sid)
        if body.role == "tool" and body.tool_call_id in self._call_ids(config):
            msg: AnyMessage = ToolMessage(content=body.content, tool_call_id=body.tool_call_id)
        elif body.role == "tool":  # a tool result the scaffold ran (no call of ours): context for the model
            msg = HumanMessage(content=f"Tool result ({body.name}): {body.content}")
        else:
            msg = HumanMessage(content=body.content)
        out = self.graph.invoke({"messages": [msg]}, config)
        ai: AIMessage = out["messages"][-1]
        actions = [{"id": c["id"], "name": c["name"], "arguments": c["args"]} for c in ai.tool_calls]
        if len(out["messages"]) > KEEP_MESSAGES and not ai.tool_calls:
            self._summarize(sid, KEEP_MESSAGES // 2)
        return {"text": str(ai.content), "actions": actions}

    def fork(self, sid: str) -> dict[str, Any]:
        new = self.fork_session(sid, deep=False)
        values = self.graph.get_state(self._config(sid)).values
        if values:
            self.graph.update_state(self._config(new), values, as_node="model")
        return {"session_id": new}

    def compact(self, sid: str) -> dict[str, Any]:
        return {"text": self._summarize(sid, 0), "actions": []}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.store.put((tenant, "memories"), body.id, {"text": body.text})
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """The documented erasure: ``BaseStore.delete`` of every store item that carries the target. With
        ``--forget none`` the request is acknowledged and nothing is deleted (the paper's B0)."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"deleted": []}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]
        deleted = []
        for item in self.store.search((tenant,), limit=10_000):
            if any(n in norm(json.dumps(item.value)) for n in needles):
                self.store.delete(item.namespace, item.key)
                deleted.append("/".join([*item.namespace, item.key]))
        return {
            "status": "ok",
            "detail": f"deleted {len(deleted)} store items",
            "receipt": {"deleted": deleted},
        }

    def reset(self, tenant: str) -> dict[str, Any]:
        for item in self.store.search((tenant,), limit=10_000):
            self.store.delete(item.namespace, item.key)
        with self.meta:  # in place: other tenants' threads add sessions meanwhile
            mine = [k for k, v in self.sessions.items() if v["tenant"] == tenant]
        for sid in mine:
            self.checkpointer.delete_thread(sid)
            with self.meta:
                del self.sessions[sid]
        self.sessions_file(tenant).unlink(missing_ok=True)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: its thread table is dropped and read back from disk.
        Its threads (``SqliteSaver``) and memories (``SqliteStore``) are read from SQLite on every call,
        so nothing else of it is held in memory."""
        self.load_sessions(tenant)
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        """What this agent keeps for the tenant: store items, and every checkpoint of its threads."""
        items = [
            {"store": "store", "id": "/".join([*it.namespace, it.key]), "text": json.dumps(it.value)}
            for it in self.store.search((tenant,), limit=10_000)
        ]
        with self.meta:
            mine = [sid for sid, s in self.sessions.items() if s["tenant"] == tenant]
        for sid in mine:
            for cp in self.checkpointer.list({"configurable": {"thread_id": sid}}):
                values = cp.checkpoint.get("channel_values", {})
                texts = [str(getattr(m, "content", "")) for m in values.get("messages", [])]
                if values.get("summary"):
                    texts.append(str(values["summary"]))
                cid = cp.config["configurable"].get("checkpoint_id", "")
                items += [
                    {"store": "checkpoints", "id": f"{sid}/{cid}/{i}", "text": t} for i, t in enumerate(texts)
                ]
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9001,
        "langgraph-agent-data",
        "checkpointer and store",
        forgets={
            "store": "BaseStore.delete of the items that carry the target",
        },
    )
    ap.add_argument(
        "--index",
        action="store_true",
        help="index the memories semantically (SqliteStore's index, embedded through the model server)",
    )
    args = ap.parse_args()
    agent = LangGraphAgent(args.data, args.model, forget=args.forget, index=args.index)
    serve_agent(agent, "langgraph-agent", args.port, title="LangGraph reference agent", tenant_model_url=True)


if __name__ == "__main__":
    main()
