"""The smallest agent eu-audit can gate: a chat agent with tools and a memory, served over the agent
contract with the contract kit (``examples/agents/contract_kit.py``). Copy it to start your own.

It keeps, per tenant, a list of memories (the records the harness injects, and each user message the
agent is told to remember) and, per session, the conversation; every model call gets the memories in its
system prompt. Its forget removes every memory and every message that carries the target or one of its
variants (a case- and punctuation-blind substring match), so it leaves nothing its own dump shows; what it
does not reach (serve's log, a prompt a model call already received) is what eu-audit measures.

Everything lives in process memory and is written to one JSON file per tenant under ``--data`` after every
change, so ``restart`` (drop the tenant, read the file back) and eu-audit's read of the agent's files
(``files``) both work. Its model is an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit
serve``); each tenant's calls go to the URL its session was started with (serve's lane for it).

    pip install openai fastapi uvicorn
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \\
        python examples/agents/minimal/agent.py --port 9010 --data /tmp/minimal-agent
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import ForgetRequest, MemoryRecord, Message, StartSession, serve_agent

SYSTEM = "You are a brief personal assistant. Use the tools when a task needs them."


def norm(text: str) -> str:
    """Case and punctuation folded: "12 Linden St." and "12 linden st" are one needle."""
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).strip()


class MinimalAgent:
    def __init__(self, data: Path, model: str) -> None:
        self.data, self.model = data, model
        self.base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8088/v1")
        self.tenants: dict[str, dict[str, Any]] = {}  # tenant -> memories, sessions, model URL
        self.owner: dict[str, str] = {}  # session id -> tenant
        self.locks: dict[str, threading.RLock] = {}
        self.meta = threading.Lock()

    # --- state -------------------------------------------------------------------------------------

    def lock_of(self, tenant: str) -> threading.RLock:
        with self.meta:
            return self.locks.setdefault(tenant, threading.RLock())

    def tenant_of(self, session_id: str) -> str:
        if session_id not in self.owner:
            raise HTTPException(404, f"no session {session_id}")
        return self.owner[session_id]

    def file(self, tenant: str) -> Path:
        return self.data / (re.sub(r"[^A-Za-z0-9_.-]", "_", tenant) + ".json")

    def state(self, tenant: str) -> dict[str, Any]:
        if tenant not in self.tenants:
            path = self.file(tenant)
            saved = json.loads(path.read_text()) if path.exists() else {}
            self.tenants[tenant] = {"memories": [], "sessions": {}, "base": self.base, **saved}
            with self.meta:
                self.owner.update({sid: tenant for sid in self.tenants[tenant]["sessions"]})
        return self.tenants[tenant]

    def save(self, tenant: str) -> None:
        """The tenant's state on disk, replaced whole (a restart reads it back)."""
        self.data.mkdir(parents=True, exist_ok=True)
        tmp = self.file(tenant).with_suffix(".tmp")
        tmp.write_text(json.dumps(self.tenants[tenant]))
        tmp.replace(self.file(tenant))

    # --- the model ---------------------------------------------------------------------------------

    def reply(self, tenant: str, session_id: str) -> dict[str, Any]:
        st = self.state(tenant)
        s = st["sessions"][session_id]
        system = SYSTEM + "".join(f"\nYou remember: {m['text']}" for m in st["memories"])
        kw: dict[str, Any] = {"model": self.model, "temperature": 0.0, "max_tokens": 96}
        if s["tools"]:
            kw["tools"] = s["tools"]
        client = OpenAI(base_url=st["base"], api_key=os.environ.get("OPENAI_API_KEY", "none"))
        msg = (
            client.chat.completions.create(
                messages=[{"role": "system", "content": system}, *s["messages"]], **kw
            )
            .choices[0]
            .message
        )
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": _json_or_none(c.function.arguments)}
            for c in msg.tool_calls or []
        ]
        said: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            said["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        s["messages"].append(said)
        self.save(tenant)
        return {"text": msg.content or "", "actions": calls}

    # --- the contract ------------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        st = self.state(body.tenant)
        if body.model_base_url:
            st["base"] = body.model_base_url
        sid = uuid.uuid4().hex[:12]
        st["sessions"][sid] = {"tools": body.tools, "messages": []}
        with self.meta:
            self.owner[sid] = body.tenant
        self.save(body.tenant)
        return {"session_id": sid}

    def send(self, session_id: str, body: Message) -> dict[str, Any]:
        tenant = self.tenant_of(session_id)
        messages = self.state(tenant)["sessions"][session_id]["messages"]
        message: dict[str, Any] = {"role": "user", "content": body.content}
        if body.role == "tool":
            pending = {c["id"] for c in (messages[-1].get("tool_calls") or [])} if messages else set()
            if body.tool_call_id in pending:  # the result of a call this agent made
                message = {"role": "tool", "tool_call_id": body.tool_call_id, "content": body.content}
            else:  # a tool the scaffold ran: context for the model
                message["content"] = f"Tool result ({body.name}): {body.content}"
        messages.append(message)
        return self.reply(tenant, session_id)

    def fork(self, session_id: str) -> dict[str, Any]:
        tenant = self.tenant_of(session_id)
        sessions = self.state(tenant)["sessions"]
        new = uuid.uuid4().hex[:12]
        sessions[new] = json.loads(json.dumps(sessions[session_id]))
        with self.meta:
            self.owner[new] = tenant
        self.save(tenant)
        return {"session_id": new}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.state(tenant)["memories"].append({"id": body.id, "text": body.text})
        self.save(tenant)
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """Every memory and every message that carries the target (or a variant) goes."""
        needles = [n for n in (norm(v) for v in [body.target, *body.variants]) if n]

        def carries(item: dict[str, Any]) -> bool:
            return any(n in norm(json.dumps(item)) for n in needles)

        st = self.state(tenant)
        before = len(st["memories"]) + sum(len(s["messages"]) for s in st["sessions"].values())
        st["memories"] = [m for m in st["memories"] if not carries(m)]
        for s in st["sessions"].values():
            s["messages"] = [m for m in s["messages"] if not carries(m)]
        removed = before - len(st["memories"]) - sum(len(s["messages"]) for s in st["sessions"].values())
        self.save(tenant)
        return {"status": "ok", "detail": f"removed {removed} items", "receipt": {"removed": removed}}

    def reset(self, tenant: str) -> dict[str, Any]:
        st = self.tenants.pop(tenant, None)
        with self.meta:
            for sid in (st or {}).get("sessions", {}):
                self.owner.pop(sid, None)
        self.file(tenant).unlink(missing_ok=True)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does: the tenant's state dropped, read back from its file on next use."""
        self.tenants.pop(tenant, None)
        self.state(tenant)
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        st = self.state(tenant)
        items = [{"store": "memory", "id": m["id"], "text": m["text"]} for m in st["memories"]]
        for sid, s in st["sessions"].items():
            for i, m in enumerate(s["messages"]):
                items.append({"store": "conversation", "id": f"{sid}/{i}", "text": json.dumps(m)})
        return {"items": items}

    def files(self, tenant: str) -> dict[str, Any]:
        return {"paths": [str(self.file(tenant).resolve())]}


def _json_or_none(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return None  # arguments that are not JSON: the harness records the call as malformed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9010)
    ap.add_argument("--data", type=Path, default=Path("minimal-agent-data"), help="one JSON file per tenant")
    ap.add_argument("--model", default="served", help="the model name sent to the endpoint")
    args = ap.parse_args()
    serve_agent(MinimalAgent(args.data, args.model), "minimal-agent", args.port, tenant_model_url=True)


if __name__ == "__main__":
    main()
