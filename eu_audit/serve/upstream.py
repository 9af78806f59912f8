"""Proxy mode's upstream: a hosted model behind ``serve --upstream URL``, spoken to in its own API.

serve answers every API an agent speaks (chat completions, completions, embeddings, the Responses and the
Messages APIs) by the one chat request it means; in proxy mode that chat request goes to the upstream,
under serve's pinned decoding and with only the fields serve forwards. A provider speaks one of two kinds:

- ``chat``: an OpenAI-compatible endpoint (``/v1/chat/completions``; OpenAI's own, vLLM, llama.cpp's
  server, most hosted models); the key goes as ``Authorization: Bearer``;
- ``messages``: an Anthropic-compatible endpoint (``/v1/messages``); the chat request is translated into
  a Messages request (system, content blocks, ``tool_use`` / ``tool_result``, tools with input schemas)
  and its answer back into a chat completion; the key goes as ``x-api-key``.

The key is read from ``EU_AUDIT_UPSTREAM_API_KEY`` (never a command-line argument: ``ps`` shows those),
sent only to the upstream, never logged and never echoed: an upstream's error is reported by its status.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Literal

from eu_audit.errors import BadInput
from eu_audit.http import HttpFailure, request_json
from eu_audit.serve.api import UNASKED_CHAT_TOKENS
from eu_audit.serve.fields import CHAT, MESSAGES
from eu_audit.serve.messages_api import STOP_REASONS

UpstreamApi = Literal["chat", "messages"]
UPSTREAM_APIS: tuple[UpstreamApi, ...] = ("chat", "messages")
KEY_ENV = "EU_AUDIT_UPSTREAM_API_KEY"
#: the Messages API version serve writes its requests in
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Upstream:
    """The upstream endpoint: its base URL and the API it speaks."""

    url: str
    api: UpstreamApi = "chat"

    def headers(self) -> dict[str, str]:
        key = os.environ.get(KEY_ENV, "")
        if self.api == "messages":
            return {"anthropic-version": ANTHROPIC_VERSION, **({"x-api-key": key} if key else {})}
        return {"Authorization": f"Bearer {key}"} if key else {}

    def model_name(self, fallback: str) -> str:
        """The first model the upstream lists (its ``/v1/models``), else ``fallback``; refused (exit 2) when
        the upstream cannot be reached at all."""
        try:
            listed = request_json(self._at("/v1/models"), headers=self.headers(), timeout=30)
        except HttpFailure as exc:
            raise BadInput(f"--upstream {self.url}: {exc}") from None
        return str((listed.get("data") or [{}])[0].get("id", fallback))

    def unsupported(self, path: str) -> str:
        """Why the upstream cannot answer a request of ``path`` ("" when it can): an Anthropic-compatible
        one has chat (as Messages) and nothing else."""
        if self.api == "messages" and path != CHAT:
            return f"{path}: the upstream speaks the Messages API (--upstream-api messages), which has none"
        return ""

    def post(self, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """``body`` (a request of ``path``, in OpenAI's shape) answered by the upstream, in OpenAI's shape
        (``unsupported`` first)."""
        headers = self.headers()
        if self.api == "messages":
            got = request_json(
                self._at(MESSAGES), "POST", messages_request(body), headers=headers, timeout=timeout
            )
            return chat_completion(dict(got))
        return dict(request_json(self._at(path), "POST", body, headers=headers, timeout=timeout))

    def _at(self, path: str) -> str:
        return self.url.rstrip("/") + path

    def facts(self) -> dict[str, str]:
        return {"upstream": self.url, "upstream_api": self.api}


def _text(content: Any) -> str:
    """A chat message's content as one text (a list of parts: their texts joined)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"arguments": raw}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def _blocks(m: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """One chat message as (Messages role, content blocks)."""
    if m.get("role") == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(m.get("tool_call_id", "")),
            "content": _text(m.get("content")),
        }
        return "user", [result]
    blocks: list[dict[str, Any]] = []
    text = _text(m.get("content"))
    if text:
        blocks.append({"type": "text", "text": text})
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(c.get("id", "")),
                "name": str(fn.get("name", "")),
                "input": _arguments(fn.get("arguments")),
            }
        )
    return ("assistant" if m.get("role") == "assistant" else "user"), blocks


def messages_request(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat request (serve's forwarded fields) as the Messages request it means: system messages joined
    into ``system``; consecutive turns of one role merged (the Messages API alternates roles); tools as
    ``input_schema`` tools; ``tool_choice`` in its kind; decoding as pinned."""
    system = "\n\n".join(
        _text(m.get("content")) for m in chat.get("messages", []) if m.get("role") in ("system", "developer")
    )
    turns: list[dict[str, Any]] = []
    for m in chat.get("messages", []):
        if m.get("role") in ("system", "developer"):
            continue
        role, blocks = _blocks(m)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    out: dict[str, Any] = {
        "model": chat.get("model", ""),
        "messages": turns,
        "max_tokens": chat.get("max_tokens") or chat.get("max_completion_tokens") or UNASKED_CHAT_TOKENS,
        "temperature": chat.get("temperature", 0.0),
    }
    if system:
        out["system"] = system
    if chat.get("stop"):
        out["stop_sequences"] = [chat["stop"]] if isinstance(chat["stop"], str) else list(chat["stop"])
    tools = [t.get("function") or t for t in chat.get("tools") or []]
    if tools:
        out["tools"] = [
            {
                "name": t.get("name", ""),
                "description": t.get("description", ""),
                "input_schema": t.get("parameters") or {"type": "object"},
            }
            for t in tools
        ]
    choice = chat.get("tool_choice")
    if choice in ("auto", "required", "none"):
        out["tool_choice"] = {"type": {"required": "any"}.get(choice, choice)}
    elif isinstance(choice, dict):
        out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    return out


#: a Messages answer's stop_reason -> the chat completion's finish_reason (serve's own mapping, read back)
FINISH = {reason: finish for finish, reason in STOP_REASONS.items()} | {"stop_sequence": "stop"}


def chat_completion(message: dict[str, Any]) -> dict[str, Any]:
    """A Messages answer as the chat completion it means: its text blocks the content, its ``tool_use``
    blocks the tool calls, its usage in OpenAI's names."""
    blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
    calls = [
        {
            "id": str(b.get("id", "")),
            "type": "function",
            "function": {"name": str(b.get("name", "")), "arguments": json.dumps(b.get("input") or {})},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    usage = message.get("usage") or {}
    prompt, completion = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "id": str(message.get("id", "")),
        "object": "chat.completion",
        "model": str(message.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})},
                "finish_reason": FINISH.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
