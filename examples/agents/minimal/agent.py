"""The smallest agent eu-audit can gate: a chat agent with tools and a memory, served over the agent
contract with the contract kit (``examples/agents/contract_kit.py``). Copy it to start your own.

It keeps, per tenant, a list of memories (the records the harness injects, and each user message the
agent is told to remember) and, per session, the conversation; every model call gets the memories in its
system prompt. Its forget removes every memory and every message that carries the target or one of its
variants (a case- and punctuation-blind substring match), so it leaves nothing its own dump shows; what it
does not reach (serve's log, a prompt a model call already received) is what eu-audit measures.

Everything lives in process memory and is written to the tenant's folder under ``--data`` after every
change (its sessions and its memories, one JSON file each), so ``restart`` (drop the tenant, read the files
back) and eu-audit's read of the agent's files (``files``) both work. The bookkeeping every agent needs
(sessions, a lock and a model URL per tenant) is the kit's ``Tenants``. Its model is an OpenAI-compatible
endpoint (``OPENAI_BASE_URL``, e.g. ``eu-audit serve``); each tenant's calls go to the URL its session was
started with (serve's lane for it).

    pip install openai fastapi uvicorn
    OPENAI_BASE_URL=http://127.0.0.1:8088/v1 \\
        python examples/agents/minimal/agent.py --port 9010 --data /tmp/minimal-agent
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
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

SYSTEM = "You are a brief personal assistant. Use the tools when a task needs them."


class MinimalAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "remove") -> None:
        super().__init__(data)  # sessions, a lock and a model URL per tenant, the session table on disk
        self.model, self.forget_mode = model, forget
        self.memories: dict[str, list[dict[str, str]]] = {}  # tenant -> its memories

    # --- state -------------------------------------------------------------------------------------

    def memories_file(self, tenant: str) -> Path:
        return self.folder(tenant) / "memories.json"

    def memories_of(self, tenant: str) -> list[dict[str, str]]:
        if tenant not in self.memories:
            path = self.memories_file(tenant)
            self.memories[tenant] = json.loads(path.read_text()) if path.exists() else []
        return self.memories[tenant]

    def save(self, tenant: str) -> None:
        """The tenant's memories and sessions on disk, each file replaced whole (a restart reads them)."""
        self.save_sessions(tenant)
        tmp = self.memories_file(tenant).with_suffix(".tmp")
        tmp.write_text(json.dumps(self.memories_of(tenant)))
        tmp.replace(self.memories_file(tenant))

    # --- the model ---------------------------------------------------------------------------------

    def reply(self, session_id: str) -> dict[str, Any]:
        s = self.session(session_id)
        system = SYSTEM + "".join(f"\nYou remember: {m['text']}" for m in self.memories_of(s["tenant"]))
        kw: dict[str, Any] = {"model": self.model, "temperature": 0.0, "max_tokens": 96}
        if s["tools"]:
            kw["tools"] = s["tools"]
        client = OpenAI(base_url=self.base_of(s["tenant"]), api_key=os.environ.get("OPENAI_API_KEY", "none"))
        msg = (
            client.chat.completions.create(
                messages=[{"role": "system", "content": system}, *s["messages"]], **kw
            )
            .choices[0]
            .message
        )
        said: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            said["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        s["messages"].append(said)
        self.save(s["tenant"])
        return {"text": msg.content or "", "actions": actions(msg.tool_calls)}

    # --- the contract ------------------------------------------------------------------------------

    def start(self, body: StartSession) -> dict[str, Any]:
        if body.model_base_url:
            self.bases[body.tenant] = body.model_base_url
        sid = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[sid] = {"tenant": body.tenant, "tools": body.tools, "messages": []}
        self.save(body.tenant)
        return {"session_id": sid}

    def send(self, session_id: str, body: Message) -> dict[str, Any]:
        messages = self.session(session_id)["messages"]
        message: dict[str, Any] = {"role": "user", "content": body.content}
        if body.role == "tool":
            pending = {c["id"] for c in (messages[-1].get("tool_calls") or [])} if messages else set()
            if body.tool_call_id in pending:  # the result of a call this agent made
                message = {"role": "tool", "tool_call_id": body.tool_call_id, "content": body.content}
            else:  # a tool the scaffold ran: context for the model
                message["content"] = f"Tool result ({body.name}): {body.content}"
        messages.append(message)
        return self.reply(session_id)

    def fork(self, session_id: str) -> dict[str, Any]:
        return {"session_id": self.fork_session(session_id)}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.memories_of(tenant).append({"id": body.id, "text": body.text})
        self.save(tenant)
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """Every memory and every message that carries the target (or a variant) goes. With ``--forget
        none`` the request is acknowledged and nothing is removed (the paper's B0)."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"removed": 0}}
        carries = self.carrier(body)
        mine = [s for s in self.sessions.values() if s["tenant"] == tenant]
        before = len(self.memories_of(tenant)) + sum(len(s["messages"]) for s in mine)
        self.memories[tenant] = [m for m in self.memories_of(tenant) if not carries(m)]
        for s in mine:
            s["messages"] = [m for m in s["messages"] if not carries(m)]
        removed = before - len(self.memories[tenant]) - sum(len(s["messages"]) for s in mine)
        self.save(tenant)
        return {"status": "ok", "detail": f"removed {removed} items", "receipt": {"removed": removed}}

    def carrier(self, body: ForgetRequest) -> Callable[[dict[str, Any]], bool]:
        """What the forget looks for in an item: the target or a variant, case and punctuation folded."""
        needles = [n for n in (norm(v) for v in [body.target, *body.variants]) if n]
        return lambda item: any(n in norm(json.dumps(item)) for n in needles)

    def reset(self, tenant: str) -> dict[str, Any]:
        self.drop_sessions(tenant)
        self.memories.pop(tenant, None)
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
        """What a process restart does: the tenant's sessions and memories dropped and read back."""
        self.load_sessions(tenant)
        self.memories.pop(tenant, None)
        return {"ok": True}

    def dump(self, tenant: str) -> dict[str, Any]:
        items = [{"store": "memory", "id": m["id"], "text": m["text"]} for m in self.memories_of(tenant)]
        for sid, s in self.sessions.items():
            if s["tenant"] == tenant:
                for i, m in enumerate(s["messages"]):
                    items.append({"store": "conversation", "id": f"{sid}/{i}", "text": json.dumps(m)})
        return {"items": items}

    def files(self, tenant: str) -> dict[str, Any]:
        return {
            "paths": [str(self.sessions_file(tenant).resolve()), str(self.memories_file(tenant).resolve())]
        }


def main() -> None:
    ap = arguments(
        __doc__,
        9010,
        "minimal-agent-data",
        "a folder per tenant",
        forgets={
            "remove": "every memory and message that carries the target",
        },
    )
    args = ap.parse_args()
    agent = MinimalAgent(args.data, args.model, forget=args.forget)
    serve_agent(agent, "minimal-agent", args.port, tenant_model_url=True)


if __name__ == "__main__":
    main()
