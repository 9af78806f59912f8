"""Anthropic's Messages API (``/v1/messages``) on serve, for agents built on Claude's SDK (or LangChain's
``ChatAnthropic``, LlamaIndex's ``Anthropic``): a request becomes the chat request it means (``system``
as the system message, text blocks as content, ``tool_use`` blocks as the assistant's tool calls,
``tool_result`` blocks as tool messages, ``input_schema`` tools as function tools), is answered by the
same chat handler (prompt rendering, pinned decoding, lanes, marks, bounds, and a log entry in the chat
shape every residue tier reads), and the answer is returned as a ``message``, or as Anthropic's stream of
events.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eu_audit.errors import BadInput


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)  # required by the API
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    stream: bool = False


def _block_text(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    parts = []
    for i, b in enumerate(blocks or []):
        if not isinstance(b, dict) or b.get("type") != "text":
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise BadInput(f"field '{where}.{i}.type': {kind!r} is not served here (text)")
        parts.append(str(b.get("text", "")))
    return "".join(parts)


def chat_messages(req: MessagesRequest) -> list[dict[str, Any]]:
    """The request's messages in the chat shape, its system prompt first."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _block_text(req.system, "system")})
    for i, m in enumerate(req.messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise BadInput(f"field 'messages.{i}.role': {role!r} is not user or assistant")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        text, calls, results = [], [], []
        for j, b in enumerate(content or []):
            kind = b.get("type") if isinstance(b, dict) else None
            where = f"messages.{i}.content.{j}"
            if kind == "text":
                text.append(str(b.get("text", "")))
            elif kind == "tool_use" and role == "assistant":
                args = json.dumps(b.get("input") or {})
                fn = {"name": str(b.get("name", "")), "arguments": args}
                calls.append({"id": str(b.get("id", "")), "type": "function", "function": fn})
            elif kind == "tool_result" and role == "user":
                result = _block_text(b.get("content", ""), f"{where}.content")
                results.append(
                    {"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": result}
                )
            else:
                raise BadInput(f"field '{where}.type': {kind!r} is not served in a {role} message")
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        else:
            out += results  # the results answer the calls just before them; the user's words follow
            if text:
                out.append({"role": "user", "content": "".join(text)})
    return out


def client_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") not in (None, "custom"):
            raise BadInput(f"field 'tools.{i}.type': {t.get('type')!r} is not served (client tools only)")
        fn = {"name": t.get("name", ""), "description": t.get("description", "")}
        fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def anthropic_choice(choice: dict[str, Any] | None) -> tuple[str | dict[str, Any] | None, bool | None]:
    """(the chat tool_choice, parallel_tool_calls) of Anthropic's tool_choice."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name", "")}}, parallel
    raise BadInput(f"field 'tool_choice.type': {kind!r} is not auto, any, tool or none")


def chat_of_messages(req: MessagesRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": chat_messages(req), "max_tokens": req.max_tokens}
    if (tools := client_tools(req.tools)) is not None:
        body["tools"] = tools
    choice, parallel = anthropic_choice(req.tool_choice)
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    if req.temperature is not None:
        body["temperature"] = req.temperature
    return body


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def message_opening(model: str) -> dict[str, Any]:
    """What a message is before it decodes: its object, id made, no content yet (``serve.live``)."""
    return {"object": message_object({"choices": [{"message": {}}], "model": model}, new_id())}


def message_object(chat: dict[str, Any], mid: str = "") -> dict[str, Any]:
    """A ``chat.completion`` as Anthropic's ``message`` (``mid``: its id, made before it decoded)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or []:
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            args = {}
        content.append(
            {"type": "tool_use", "id": f"toolu_{c['id']}", "name": c["function"]["name"], "input": args}
        )
    usage = chat.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "id": mid or new_id(),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model"),
        "content": content,
        "stop_reason": STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        },
    }


def message_events(
    msg: dict[str, Any], include_usage: bool = True
) -> list[tuple[str | None, dict[str, Any]]]:
    """Anthropic's stream of a finished message: message_start, each content block's start, delta(s) and
    stop, message_delta with the stop reason and output tokens, message_stop."""
    from eu_audit.serve.stream import pieces

    usage = msg["usage"]
    start = msg | {"content": [], "stop_reason": None, "usage": usage | {"output_tokens": 0}}
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"message": start})]
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            out.append(("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            for p in pieces(block["text"]):
                out.append(("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": p}}))
        else:
            out.append(("content_block_start", {"index": i, "content_block": block | {"input": {}}}))
            partial = json.dumps(block["input"])
            out.append(
                (
                    "content_block_delta",
                    {"index": i, "delta": {"type": "input_json_delta", "partial_json": partial}},
                )
            )
        out.append(("content_block_stop", {"index": i}))
    delta = {"stop_reason": msg["stop_reason"], "stop_sequence": None}
    out.append(("message_delta", {"delta": delta, "usage": {"output_tokens": usage["output_tokens"]}}))
    out.append(("message_stop", {}))
    return [(name, {"type": name, **data}) for name, data in out]
