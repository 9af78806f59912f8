"""A chat agent with tools on mem0 (the ``mem0ai`` library), served over eu-audit's agent contract.

It is the kind of agent people deploy with mem0: every turn it retrieves the user's memories into the
system prompt, keeps a rolling summary of the conversation, and after every exchange hands the messages
to ``Memory.add``: stored as they are by default (``infer=False``), or with ``--infer`` handed to mem0's
LLM, which extracts facts and merges them with what it holds (its extraction prompt alone is ~8,500
tokens, more than SmolLM2's context and slow for a 0.5B model on a CPU). Its forget is what mem0 offers
for erasure: find the memories that carry the target (``search`` and ``get_all``) and ``delete`` each one.

Nothing here imports eu-audit: it speaks the HTTP contract (``eu-audit schema agent-api``) and sends its
model calls and embeddings to an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit
serve``). Each tenant gets its own mem0 store under ``--data`` (qdrant local mode on disk and mem0's
SQLite history), so tenants never see each other; ``--shared-store`` keeps every tenant in one store, one
mem0 user each (``user_id``), as a multi-user deployment does. ``--forget delete_all`` erases with
``Memory.delete_all(user_id=...)`` instead of deleting the memories that carry the target, ``--forget
reset`` with ``Memory.reset()`` of the tenant's own store and its conversations emptied. ``files`` names
the store's files (its SQLite history, the vector store's folder), which eu-audit reads itself.
``--vector-store chroma`` keeps the vectors in Chroma's local ``PersistentClient`` instead of qdrant's local
mode (``pip install chromadb``). The calls work on
mem0 1.x (``user_id=``, ``limit=``) and 2.x (``filters=``, ``top_k=``) alike, for the residue pack's
cases on older releases.

    pip install -r examples/agents/mem0/requirements.txt
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \
        python examples/agents/mem0/agent.py --port 9000 --data /tmp/mem0-agent
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported: no phone-home

from fastapi import HTTPException
from mem0 import Memory
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

EMBED_DIMS = 384  # MiniLM, what eu-audit serve's /v1/embeddings returns
KEEP_MESSAGES = 6  # the rolling window: older messages are folded into the summary


def _scoped(method: Any, tenant: str, k: int, *args: Any) -> list[dict[str, Any]]:
    """``search`` or ``get_all`` of one user's memories on mem0 2.x (``filters``, ``top_k``) or 1.x
    (``user_id``, ``limit``): the results list either way."""
    import inspect

    if "top_k" in inspect.signature(method).parameters:
        got = method(*args, filters={"user_id": tenant}, top_k=k)
    else:
        got = method(*args, user_id=tenant, limit=k)
    return list(got.get("results", []) if isinstance(got, dict) else got)


class Mem0Agent(Tenants):
    def __init__(
        self,
        data: Path,
        model: str,
        infer: bool,
        forget: str = "mem0",
        shared: bool = False,
        vectors: str = "qdrant",
    ) -> None:
        super().__init__(data)
        self.data, self.model, self.infer, self.forget_mode, self.shared = data, model, infer, forget, shared
        self.vectors = vectors  # mem0's vector store provider: qdrant (local mode) or chroma (local)
        self.clients: dict[str, OpenAI] = {}  # base URL -> client
        self.memories: dict[str, Memory] = {}

    def client(self, tenant: str) -> OpenAI:
        base = self.bases.get(tenant, self.base)
        with self.meta:
            if base not in self.clients:
                self.clients[base] = OpenAI(base_url=base, api_key=os.environ.get("OPENAI_API_KEY", "none"))
            return self.clients[base]

    def store_folder(self, tenant: str) -> Path:
        """Where the tenant's mem0 store lives: its own folder, or the one every tenant shares."""
        return self.data / "shared-store" if self.shared else self.folder(tenant)

    # --- mem0, one store per tenant ------------------------------------------------------------------

    def memory(self, tenant: str) -> Memory:
        key = "" if self.shared else tenant
        if key not in self.memories:
            folder = self.store_folder(tenant)
            folder.mkdir(parents=True, exist_ok=True)
            openai_cfg = {"openai_base_url": self.bases.get(tenant, self.base), "api_key": "none"}
            self.memories[key] = Memory.from_config(
                {
                    "vector_store": self.vector_store(folder),
                    "llm": {
                        "provider": "openai",
                        # mem0's own max_tokens (2000): a lower cap cuts its extraction JSON mid-list, and
                        # mem0 then stores nothing ("Error parsing extraction response")
                        "config": {"model": self.model, "temperature": 0.0, **openai_cfg},
                    },
                    "embedder": {
                        "provider": "openai",
                        "config": {"model": "all-MiniLM-L6-v2", "embedding_dims": EMBED_DIMS, **openai_cfg},
                    },
                    "history_db_path": str(folder / "history.db"),
                }
            )
        return self.memories[key]

    def vector_store(self, folder: Path) -> dict[str, Any]:
        """mem0's vector store config: qdrant's local mode on disk, or Chroma's local persistent client."""
        if self.vectors == "chroma":
            return {
                "provider": "chroma",
                "config": {"collection_name": "memories", "path": str(folder / "chroma")},
            }
        return {
            "provider": "qdrant",
            "config": {
                "collection_name": "memories",
                "path": str(folder / "qdrant"),
                "embedding_model_dims": EMBED_DIMS,
                "on_disk": True,
            },
        }

    def recall(self, tenant: str, query: str) -> list[str]:
        return [h["memory"] for h in _scoped(self.memory(tenant).search, tenant, 5, query)]

    # --- the model ------------------------------------------------------------------------------------

    def chat(
        self, tenant: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> Any:
        kw: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": 96}
        if tools:
            kw["tools"] = tools
        return self.client(tenant).chat.completions.create(**kw).choices[0].message

    def prompt(self, s: dict[str, Any]) -> list[dict[str, Any]]:
        system = SYSTEM
        if s["recalled"]:
            system += "\nWhat you remember about the user:\n" + "\n".join(f"- {m}" for m in s["recalled"])
        if s["summary"]:
            system += "\nSummary of the conversation so far: " + s["summary"]
        return [{"role": "system", "content": system}, *s["history"]]

    def summarize(self, s: dict[str, Any], keep: int) -> str:
        """Fold all but the last ``keep`` messages into the rolling summary."""
        old, s["history"] = s["history"][: len(s["history"]) - keep], s["history"][len(s["history"]) - keep :]
        if keep == 0:
            old, s["history"] = old + s["history"], []
        while s["history"] and s["history"][0]["role"] == "tool":  # a tool result without its call
            old.append(s["history"].pop(0))
        if not old:
            return str(s["summary"])
        lines = "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in old)
        msg = self.chat(
            s["tenant"],
            [
                {"role": "system", "content": "Summarize the conversation in at most three sentences."},
                {"role": "user", "content": f"Earlier summary: {s['summary'] or '(none)'}\n{lines}"},
            ],
        )
        s["summary"] = (msg.content or "").strip()
        s["summaries"].append(s["summary"])
        return str(s["summary"])

    def answer(self, s: dict[str, Any]) -> dict[str, Any]:
        msg = self.chat(s["tenant"], self.prompt(s), s["tools"])
        calls = list(msg.tool_calls or [])
        turn: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if calls:
            turn["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        s["history"].append(turn)
        return {"text": msg.content or "", "actions": actions(calls)}

    # --- the contract ---------------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url and self.bases.get(body.tenant) != body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
            self.memories.pop(body.tenant, None)  # mem0's LLM and embedder follow the tenant's lane
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {
                "tenant": body.tenant, "tools": body.tools, "history": [], "summary": "", "summaries": [],
                "recalled": [],
            }  # fmt: skip
        self.save_sessions(body.tenant)
        return {"session_id": sid}

    def send(self, sid: str, body: Message) -> dict[str, Any]:
        s = self.session(sid)
        if body.role == "tool" and body.tool_call_id in _call_ids(s["history"]):
            s["history"].append({"role": "tool", "tool_call_id": body.tool_call_id, "content": body.content})
        elif body.role == "tool":  # a tool result the scaffold ran (no call of ours): context for the model
            s["history"].append({"role": "user", "content": f"Tool result ({body.name}): {body.content}"})
        else:
            s["recalled"] = self.recall(s["tenant"], body.content)
            s["history"].append({"role": "user", "content": body.content})
        turn = self.answer(s)
        exchange = [m for m in s["history"][-2:] if m["role"] in ("user", "assistant") and m.get("content")]
        if exchange:
            try:
                self.memory(s["tenant"]).add(exchange, user_id=s["tenant"], infer=self.infer)
            except Exception as exc:  # mem0's own error (e.g. its extraction prompt over the model's context)
                raise HTTPException(500, f"mem0's Memory.add failed: {type(exc).__name__}: {exc}") from exc
        if len(s["history"]) > KEEP_MESSAGES:
            self.summarize(s, KEEP_MESSAGES // 2)
        self.save_sessions(s["tenant"])
        return turn

    def fork(self, sid: str) -> dict[str, Any]:
        return {"session_id": self.fork_session(sid)}

    def compact(self, sid: str) -> dict[str, Any]:
        s = self.session(sid)
        text = self.summarize(s, 0)
        self.save_sessions(s["tenant"])
        return {"text": text, "actions": []}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.memory(tenant).add(body.text, user_id=tenant, infer=False, metadata={"record_id": body.id})
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """mem0's erasure: every memory that carries the target, found by search and by listing, deleted.
        With ``--forget none`` the request is acknowledged and nothing is deleted (the agent before it had
        a forget: the paper's B0, the baseline its forget is compared with)."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"deleted": []}}
        m = self.memory(tenant)
        if self.forget_mode == "reset":  # everything of the tenant: its mem0 store and its conversations
            m.reset()
            with self.meta:
                mine = [s for s in self.sessions.values() if s["tenant"] == tenant]
            for s in mine:  # emptied in place: the harness goes on talking in the same sessions
                s.update(history=[], summary="", summaries=[], recalled=[])
            self.save_sessions(tenant)
            return {
                "status": "ok",
                "detail": "Memory.reset() of the tenant's store",
                "receipt": {"deleted": "all"},
            }
        if self.forget_mode == "delete_all":  # mem0's erasure of a whole user
            m.delete_all(user_id=tenant)
            return {"status": "ok", "detail": "Memory.delete_all(user_id)", "receipt": {"deleted": "all"}}
        needles = [norm(v) for v in [body.target, *body.variants] if norm(v)]
        found: dict[str, str] = {}
        for query in [body.target, *body.variants]:
            for hit in _scoped(m.search, tenant, 50, query):
                found[hit["id"]] = hit["memory"]
        for item in _scoped(m.get_all, tenant, 1000):
            found[item["id"]] = item["memory"]
        deleted = [mid for mid, text in found.items() if any(n in norm(text) for n in needles)]
        for mid in deleted:
            m.delete(mid)
        return {
            "status": "ok",
            "detail": f"deleted {len(deleted)} mem0 memories",
            "receipt": {"deleted": deleted},
        }

    def reset(self, tenant: str) -> dict[str, Any]:
        if self.shared:  # only this user's memories go; the other users' stay (never Memory.reset)
            m = self.memory(tenant)
            for item in _scoped(m.get_all, tenant, 1000):
                m.delete(item["id"])
        elif tenant in self.memories:
            self.memories.pop(tenant).reset()
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        self.drop_sessions(tenant)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does to the tenant: mem0 is closed (qdrant's local client, the history
        database) and opened again from its files; the conversations are dropped from memory and read
        back from the tenant's sessions file."""
        m = None if self.shared else self.memories.pop(tenant, None)  # a shared store stays open
        if m is not None and hasattr(m.vector_store.client, "close"):  # Chroma's local client has none
            m.vector_store.client.close()
        if m is not None:
            m.close()
        self.load_sessions(tenant)
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        """What this agent keeps for the tenant: mem0's memories, its history and messages tables, and the
        sessions' conversation buffers and summaries."""
        m = self.memory(tenant)
        items = [
            {"store": "memory", "id": x["id"], "text": x["memory"]} for x in _scoped(m.get_all, tenant, 1000)
        ]
        db = sqlite3.connect(self.store_folder(tenant) / "history.db")
        try:
            for hid, old, new, event in db.execute("SELECT id, old_memory, new_memory, event FROM history"):
                items.append({"store": "history", "id": hid, "text": f"{event}: {old or ''} -> {new or ''}"})
            for mid, content in db.execute("SELECT id, content FROM messages"):
                items.append({"store": "messages", "id": mid, "text": content or ""})
        except sqlite3.Error:
            pass  # a tenant that never stored anything has no tables yet
        finally:
            db.close()
        with self.meta:
            mine = [(sid, s) for sid, s in self.sessions.items() if s["tenant"] == tenant]
        for sid, s in mine:
            if s["tenant"] != tenant:
                continue
            for i, text in enumerate(s["summaries"]):
                items.append({"store": "summary", "id": f"{sid}/{i}", "text": text})
            for i, msg in enumerate(s["history"]):
                items.append(
                    {"store": "conversation", "id": f"{sid}/{i}", "text": str(msg.get("content") or "")}
                )
        return {"items": items}

    def files(self, tenant: str) -> dict[str, Any]:
        """Where mem0 persists the tenant: its SQLite history and the vector store's local folder (shared by
        every tenant with ``--shared-store``)."""
        folder = self.store_folder(tenant).resolve()
        return {"paths": [str(folder / "history.db"), str(folder / self.vectors)]}


def _call_ids(history: list[dict[str, Any]]) -> set[str]:
    """The ids of the tool calls this agent made in the conversation (a result must answer one of them)."""
    return {c["id"] for m in history for c in m.get("tool_calls") or []}


def main() -> None:
    ap = arguments(
        __doc__,
        9000,
        "mem0-agent-data",
        "mem0's stores, one folder per tenant",
        forgets={
            "mem0": "delete the memories that carry the target",
            "delete_all": "Memory.delete_all(user_id) of the tenant",
            "reset": "Memory.reset() of the tenant's own store and its conversations emptied (not with "
            "--shared-store, where it would wipe every user)",
        },
    )
    ap.add_argument(
        "--infer",
        action="store_true",
        help="let mem0's LLM extract facts from each exchange (Memory.add infer=True); its extraction prompt "
        "is ~8,500 tokens, beyond SmolLM2's 8K context, so the default stores the messages as they are",
    )
    ap.add_argument(
        "--shared-store",
        action="store_true",
        help="every tenant in one mem0 store, one user each (a multi-user deployment); default: a store each",
    )
    ap.add_argument(
        "--vector-store",
        choices=["qdrant", "chroma"],
        default="qdrant",
        help="where mem0 keeps the vectors: qdrant's local mode (default) or Chroma's local PersistentClient",
    )
    args = ap.parse_args()
    if args.forget == "reset" and args.shared_store:
        ap.error("--forget reset wipes the whole store: with --shared-store that is every user's memories")
    agent = Mem0Agent(
        args.data,
        args.model,
        infer=args.infer,
        forget=args.forget,
        shared=args.shared_store,
        vectors=args.vector_store,
    )
    serve_agent(
        agent, "mem0-agent", args.port, title="mem0 reference agent", tenant_model_url=not args.shared_store
    )


if __name__ == "__main__":
    main()
