"""A chat agent on Anthropic's Python SDK (``anthropic``), at its defaults: ``Anthropic().messages.create``
with a system prompt, tools as ``input_schema``, ``tool_use`` and ``tool_result`` content blocks. An
agent built for Claude is gated as its team runs it: only its base URL points at ``eu-audit serve``, which
answers the Messages API (``/v1/messages``) with the pinned local model.

It keeps, per tenant, a list of memories (the records the harness injects) and, per session, the
conversation in the Messages API's own shape (content blocks); every call gets the memories in its system
prompt. Its forget removes every memory and every message that carries the target or a variant (a case- and
punctuation-blind match over the message's blocks), and rewrites the conversation so that a ``tool_result``
never outlives its ``tool_use`` (the API refuses one without the other). Files: one JSON file per tenant
for the sessions (the kit's) and one for its memories.

    pip install anthropic fastapi uvicorn
    ANTHROPIC_BASE_URL=http://127.0.0.1:8088 \\
        python examples/agents/anthropic-sdk/agent.py --port 9012 --data /tmp/anthropic-agent

The harness sends each tenant's model URL the OpenAI way (``.../lanes/ID/v1``); the SDK adds ``/v1/messages``
itself, so the agent gives it the URL without its ``/v1``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

import anthropic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract kit beside the agents
from contract_kit import (
    ForgetRequest,
    MemoryRecord,
    Message,
    StartSession,
    Tenants,
    action,
    arguments,
    needles,
    norm,
    serve_agent,
)

SYSTEM = "You are a brief personal assistant. Use the tools when a task needs them."
MAX_TOKENS = 96  # the Messages API requires it


def sdk_base(url: str) -> str:
    """An OpenAI-style base URL (``http://host/lanes/ID/v1``) as the Anthropic SDK takes it."""
    return url[: -len("/v1")] if url.rstrip("/").endswith("/v1") else url.rstrip("/")


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The contract's offered tools (OpenAI function specs) as the Messages API's tools."""
    out = []
    for t in tools:
        f = t.get("function", t)
        out.append(
            {
                "name": f["name"],
                "description": f.get("description", ""),
                "input_schema": f.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return out


class AnthropicAgent(Tenants):
    def __init__(self, data: Path, model: str, forget: str = "remove") -> None:
        super().__init__(data)
        self.base = os.environ.get("ANTHROPIC_BASE_URL", self.base)
        self.model, self.forget_mode = model, forget
        self.memories: dict[str, list[dict[str, str]]] = {}

    # --- state -------------------------------------------------------------------------------------

    def memories_file(self, tenant: str) -> Path:
        return self.folder(tenant) / "memories.json"

    def memories_of(self, tenant: str) -> list[dict[str, str]]:
        if tenant not in self.memories:
            path = self.memories_file(tenant)
            self.memories[tenant] = json.loads(path.read_text()) if path.exists() else []
        return self.memories[tenant]

    def save(self, tenant: str) -> None:
        self.save_sessions(tenant)
        tmp = self.memories_file(tenant).with_suffix(".tmp")
        tmp.write_text(json.dumps(self.memories_of(tenant)))
        tmp.replace(self.memories_file(tenant))

    # --- the model ---------------------------------------------------------------------------------

    def reply(self, session_id: str) -> dict[str, Any]:
        s = self.session(session_id)
        system = SYSTEM + "".join(f"\nYou remember: {m['text']}" for m in self.memories_of(s["tenant"]))
        client = anthropic.Anthropic(
            base_url=sdk_base(self.base_of(s["tenant"])), api_key=os.environ.get("ANTHROPIC_API_KEY", "none")
        )
        kw: dict[str, Any] = {"model": self.model, "max_tokens": MAX_TOKENS}  # serve pins decoding
        if s["tools"]:
            kw["tools"] = anthropic_tools(s["tools"])
        got = client.messages.create(system=system, messages=paired(s["messages"]), **kw)
        blocks = [b.model_dump(exclude_none=True) for b in got.content]
        s["messages"].append({"role": "assistant", "content": blocks})
        self.save(s["tenant"])
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
        calls = [
            action(b["id"], b["name"], json.dumps(b.get("input") or {}))
            for b in blocks
            if b["type"] == "tool_use"
        ]
        return {"text": text, "actions": calls}

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
        last = messages[-1]["content"] if messages and messages[-1]["role"] == "assistant" else []
        pending = {b["id"] for b in last if isinstance(b, dict) and b.get("type") == "tool_use"}
        if body.role == "tool" and body.tool_call_id in pending:  # the result of a call this agent made
            block = {"type": "tool_result", "tool_use_id": body.tool_call_id, "content": body.content}
            messages.append({"role": "user", "content": [block]})
        elif body.role == "tool":  # a tool the scaffold ran: context for the model
            messages.append({"role": "user", "content": f"Tool result ({body.name}): {body.content}"})
        else:
            messages.append({"role": "user", "content": body.content})
        return self.reply(session_id)

    def fork(self, session_id: str) -> dict[str, Any]:
        return {"session_id": self.fork_session(session_id)}

    def inject_memory(self, tenant: str, body: MemoryRecord) -> dict[str, Any]:
        self.memories_of(tenant).append({"id": body.id, "text": body.text})
        self.save(tenant)
        return {"text": "", "actions": []}

    def forget(self, tenant: str, body: ForgetRequest) -> dict[str, Any]:
        """Every memory and message that carries the target goes; a tool_result whose tool_use went goes
        with it (and the other way round). ``--forget none``: acknowledged, nothing removed (B0)."""
        if self.forget_mode == "none":
            return {"status": "ok", "detail": "forget disabled (--forget none)", "receipt": {"removed": 0}}
        found = needles(body.target, body.variants)

        def carries(item: Any) -> bool:
            return any(n in norm(json.dumps(item, ensure_ascii=False)) for n in found)

        removed = len(self.memories_of(tenant))
        self.memories[tenant] = [m for m in self.memories_of(tenant) if not carries(m)]
        removed -= len(self.memories[tenant])
        for s in self.sessions.values():
            if s["tenant"] == tenant:
                kept = paired([m for m in s["messages"] if not carries(m)])
                removed += len(s["messages"]) - len(kept)
                s["messages"] = kept
        self.save(tenant)
        return {"status": "ok", "detail": f"removed {removed} items", "receipt": {"removed": removed}}

    def reset(self, tenant: str) -> dict[str, Any]:
        self.drop_sessions(tenant)
        self.memories.pop(tenant, None)
        shutil.rmtree(self.folder(tenant), ignore_errors=True)
        return {"ok": True}

    def restart(self, tenant: str) -> dict[str, Any]:
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


def paired(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with every tool_use answered by its tool_result and no tool_result without its
    tool_use (the Messages API refuses either): an assistant turn whose result went loses its tool_use
    blocks, a result whose call went is dropped."""
    used = {
        b["id"]
        for m in messages
        if m["role"] == "assistant"
        for b in _blocks(m)
        if b.get("type") == "tool_use"
    }
    answered = {
        b["tool_use_id"]
        for m in messages
        if m["role"] == "user"
        for b in _blocks(m)
        if b.get("type") == "tool_result"
    }
    out = []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        keep = [
            b
            for b in m["content"]
            if not (b.get("type") == "tool_use" and b["id"] not in answered)
            and not (b.get("type") == "tool_result" and b["tool_use_id"] not in used)
        ]
        if keep:
            out.append({**m, "content": keep})
    return out


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    return (
        [b for b in message["content"] if isinstance(b, dict)] if isinstance(message["content"], list) else []
    )


def main() -> None:
    ap = arguments(
        __doc__,
        9012,
        "anthropic-agent-data",
        "a folder per tenant",
        forgets={
            "remove": "every memory and message that carries the target, tool_use/tool_result kept paired"
        },
    )
    args = ap.parse_args()
    serve_agent(
        AnthropicAgent(args.data, args.model, forget=args.forget),
        "anthropic-sdk-agent",
        args.port,
        tenant_model_url=True,
    )


if __name__ == "__main__":
    main()
