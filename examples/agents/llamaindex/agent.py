"""A chat agent with tools on LlamaIndex's ``Memory`` with memory blocks (``llama-index-core``), served over
eu-audit's agent contract.

It is the agent LlamaIndex's memory docs build: one ``Memory`` per conversation, its short-term FIFO queue
of messages in a SQL chat store (``SQLAlchemyChatStore`` on a SQLite file per tenant), and a long-term
``FactExtractionMemoryBlock`` shared by the tenant's conversations: when the queue passes its token
limit, the oldest messages are *archived* (they stay in the table, status ``archived``) and handed to the
block, whose LLM extracts facts; ``Memory.get`` puts the facts into the system message. Records the
harness injects are facts of that block, as the agent's own memory write would leave them.

Its forget, chosen with ``--forget``, is what LlamaIndex documents for changing a memory:

- ``rewrite`` (default): for each conversation, ``Memory.get_all`` (every status), then ``Memory.set`` of
  the messages that do not carry the target; the fact block's facts that carry it are removed;
- ``reset``: ``Memory.reset`` of each conversation that carries the target, and the facts as above;
- ``none``: acknowledged, nothing removed (the paper's B0).

The model is an OpenAI-compatible endpoint through a ``CustomLLM`` of ~30 lines (LlamaIndex's own
``llama-index-llms-openai`` pins ``openai<3``, which the other reference agents' pins exclude).

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``).

    pip install -r examples/agents/llamaindex/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \\
        python examples/agents/llamaindex/agent.py --port 9003 --data /tmp/llamaindex-agent
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import sys
import threading
import uuid
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.memory import FactExtractionMemoryBlock, Memory
from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore
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

TOKEN_LIMIT = 1200  # the queue archives into the fact block past 70% of this (LlamaIndex's ratio)
_T = TypeVar("_T")


class ServedLLM(CustomLLM):
    """LlamaIndex's LLM interface over an OpenAI-compatible chat endpoint (the fact block's extractor)."""

    base_url: str
    model: str = "served"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=8192, num_output=200, is_chat_model=True, model_name=self.model)

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        client = OpenAI(base_url=self.base_url, api_key="none")
        sent = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        out = client.chat.completions.create(model=self.model, messages=sent, temperature=0.0, max_tokens=200)  # type: ignore[arg-type]
        return ChatResponse(
            message=ChatMessage(role="assistant", content=out.choices[0].message.content or "")
        )

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self.chat, messages)

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(
            text=self.chat([ChatMessage(role="user", content=prompt)]).message.content or ""
        )

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
        raise NotImplementedError("this agent never streams")


def _openai(m: ChatMessage) -> dict[str, Any]:
    """A LlamaIndex message as an OpenAI chat message (tool calls and ids kept in additional_kwargs)."""
    msg: dict[str, Any] = {"role": m.role.value, "content": m.content or ""}
    if m.additional_kwargs.get("tool_calls"):
        msg["tool_calls"] = m.additional_kwargs["tool_calls"]
    if m.role == MessageRole.TOOL:
        msg["tool_call_id"] = m.additional_kwargs.get("tool_call_id", "")
    return msg


class LlamaIndexAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "rewrite") -> None:
        super().__init__(data)
        self.data, self.model, self.forget_mode = data, model, forget
        self.tenants: dict[str, dict[str, Any]] = {}  # tenant -> its chat store and fact block
        # LlamaIndex's SQL store is async and bound to the loop it was opened on: one loop for all calls
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def wait(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # --- plumbing ---------------------------------------------------------------------------------

    def tenant(self, name: str) -> dict[str, Any]:
        if name not in self.tenants:
            folder = self.folder(name)
            folder.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite+aiosqlite:///{folder / 'memory.sqlite'}"
            llm = ServedLLM(base_url=self.bases.get(name, self.base), model=self.model)
            self.tenants[name] = {
                "store": SQLAlchemyChatStore(table_name="llama_index_memory", async_database_uri=uri),
                "facts": FactExtractionMemoryBlock(name="facts", llm=llm),
            }
        return self.tenants[name]

    def memory(self, tenant: str, sid: str) -> Memory:
        t = self.tenant(tenant)
        return Memory.from_defaults(
            session_id=sid, token_limit=TOKEN_LIMIT, memory_blocks=[t["facts"]], chat_store=t["store"]
        )

    def stored_ids(self, tenant: str) -> list[str]:
        return list(self.wait(self.tenant(tenant)["store"].get_keys()))

    # --- a turn -----------------------------------------------------------------------------------

    def turn(self, sid: str, incoming: ChatMessage) -> dict[str, Any]:
        s = self.session(sid)
        memory = self.memory(s["tenant"], sid)
        self.wait(memory.aput(incoming))
        messages = [_openai(m) for m in self.wait(memory.aget())]
        if messages and messages[0]["role"] == "system":  # the memory blocks' content
            messages[0]["content"] = SYSTEM + "\n" + messages[0]["content"]
        else:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        client = OpenAI(base_url=self.bases.get(s["tenant"], self.base), api_key="none")
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": 96}
        if s["tools"]:
            kw["tools"] = s["tools"]
        msg = client.chat.completions.create(**kw).choices[0].message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls or []
        ]
        extra = {"tool_calls": calls} if calls else {}
        self.wait(
            memory.aput(ChatMessage(role="assistant", content=msg.content or "", additional_kwargs=extra))
        )
        return {"text": msg.content or "", "actions": actions(calls)}

    def call_ids(self, tenant: str, sid: str) -> set[str]:
        history = self.wait(self.memory(tenant, sid).aget_all())
        return {c["id"] for m in history for c in m.additional_kwargs.get("tool_calls") or []}

    # --- the contract -----------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url and self.bases.get(body.tenant) != body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
            if body.tenant in self.tenants:  # the fact block's LLM follows the tenant's lane
                self.tenants[body.tenant]["facts"].llm = ServedLLM(
                    base_url=body.model_base_url, model=self.model
                )
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools}
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        tenant = self.tenant_of(sid)
        if body.role == "tool" and body.tool_call_id in self.call_ids(tenant, sid):
            extra = {"tool_call_id": body.tool_call_id}
            msg = ChatMessage(role="tool", content=body.content, additional_kwargs=extra)
        elif body.role == "tool":  # a tool result the scaffold ran (no call of ours): context for the model
            msg = ChatMessage(role="user", content=f"Tool result ({body.name}): {body.content}")
        else:
            msg = ChatMessage(role="user", content=body.content)
        return self.turn(sid, msg)

    def fork(self, sid: str) -> dict[str, Any]:
        tenant = self.tenant_of(sid)
        history = self.wait(self.memory(tenant, sid).aget_all())
        new = self.fork_session(sid, deep=False)
        self.wait(self.memory(tenant, new).aset(history))
        return {"session_id": new}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        facts = self.tenant(tenant)["facts"]
        if body.text not in facts.facts:
            facts.facts.append(body.text)
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"removed": 0}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]

        def carries(text: str) -> bool:
            return any(n in norm(text) for n in needles)

        removed = 0
        for sid in self.stored_ids(tenant):
            memory = self.memory(tenant, sid)
            history = self.wait(memory.aget_all())
            keep = [m for m in history if not carries(json.dumps(_openai(m)))]
            if len(keep) == len(history):
                continue
            if self.forget_mode == "reset":
                self.wait(memory.areset())
                removed += len(history)
            else:
                self.wait(memory.aset(keep))
                removed += len(history) - len(keep)
        facts = self.tenant(tenant)["facts"]
        kept_facts = [f for f in facts.facts if not carries(f)]
        removed += len(facts.facts) - len(kept_facts)
        facts.facts = kept_facts
        return {
            "status": "ok",
            "detail": f"{self.forget_mode}: {removed} items removed",
            "receipt": {"removed": removed},
        }

    def reset(self, tenant: str) -> dict[str, Any]:
        t = self.tenants.pop(tenant, None)
        if t is not None:
            for sid in self.wait(t["store"].get_keys()):
                self.wait(t["store"].delete_messages(sid))
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        self.drop_sessions(tenant)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: its chat store is opened again on its SQLite file,
        its session table read back from disk, and its fact block made anew. LlamaIndex keeps a memory
        block's facts in process memory only (the chat store holds messages), so a restart loses them."""
        with self.meta:
            self.tenants.pop(tenant, None)
        self.load_sessions(tenant)
        return {"ok": True}

    def files(self, tenant: str) -> dict[str, Any]:
        """Where the tenant is persisted: its chat store's SQLite file and its session table (the fact
        block lives in process memory only)."""
        return {
            "paths": [str((self.folder(tenant) / f).resolve()) for f in ("memory.sqlite", "sessions.json")]
        }

    def dump(self, tenant: str) -> dict[str, Any]:
        """The chat store's rows (active and archived), and the fact block's facts."""
        items: list[dict[str, Any]] = []
        self.tenant(tenant)
        path = self.folder(tenant) / "memory.sqlite"
        if path.exists():
            db = sqlite3.connect(path)
            try:
                rows = db.execute("SELECT id, key, status, data FROM llama_index_memory").fetchall()
            except sqlite3.Error:
                rows = []  # nothing stored yet: no table
            finally:
                db.close()
            for rid, key, status, data in rows:
                items.append({"store": f"messages-{status}", "id": f"{key}/{rid}", "text": str(data)})
        for i, fact in enumerate(self.tenants[tenant]["facts"].facts):
            items.append({"store": "facts", "id": str(i), "text": fact})
        return {"items": items}


def main() -> None:
    ap = arguments(
        __doc__,
        9003,
        "llamaindex-agent-data",
        "a SQLite file per tenant",
        forgets={
            "rewrite": "Memory.set of each conversation without the target's messages, and the facts "
            "without it",
            "reset": "Memory.reset of each conversation that holds it",
        },
    )
    args = ap.parse_args()
    agent = LlamaIndexAgent(args.data, args.model, forget=args.forget)
    serve_agent(
        agent,
        "llamaindex-memory",
        args.port,
        title="LlamaIndex Memory reference agent",
        tenant_model_url=True,
    )


if __name__ == "__main__":
    main()
