"""``stream: true``: an answer as server-sent events, in the route's own chunk format (OpenAI's
``chat.completion.chunk`` and ``text_completion`` chunks, then ``data: [DONE]``), with a last chunk
holding the usage where ``stream_options.include_usage`` asks for it.

The answer is decoded exactly as the same request without ``stream`` (the same pinned decoding, lane,
mark, bounds and deadline: the handler is the same), then sent as events: the chunks' text joined is the
non-streamed answer character for character, and their tool calls are its tool calls. A chat answer that
is decoding is streamed as it comes instead (``serve.live``); what this module sends leaves once the
answer is whole (completions, the Responses and Messages APIs, formats, forced calls, reused answers).
The log entry is written when the stream ends and says how many of its events reached the client
(``LogEntry.streamed``): a client that leaves mid-stream is logged with what was sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

#: the pieces an answer's text is sent in: a word with the space after it (joined, the text again)
_PIECE = re.compile(r"\S+\s*|\s+")


def pieces(text: str) -> list[str]:
    return _PIECE.findall(text) if text else []


def chat_chunks(resp: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A ``chat.completion`` as the chunks OpenAI streams it in: the role, the content in pieces, each
    tool call whole (its index, id, name and arguments), the finish reason, and the usage if asked."""
    choice = resp["choices"][0]
    msg = choice["message"]
    head = {k: resp.get(k) for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces(msg.get("content") or "")]
    for i, call in enumerate(msg.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append(head | {"choices": [], "usage": resp.get("usage")})
    return out


def completion_chunks(resp: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A ``text_completion`` as OpenAI streams it: the text in pieces, then the finish reason (eu-audit's
    ``token_ids``, where asked, ride on the last chunk)."""
    choice = resp["choices"][0]
    head = {k: resp.get(k) for k in ("id", "object", "created", "model")}
    extra = {"token_ids": choice["token_ids"]} if "token_ids" in choice else {}

    def chunk(text: str, finish: str | None = None, **more: Any) -> dict[str, Any]:
        return head | {
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, **more}]
        }

    out = [chunk(p) for p in pieces(choice["text"])]
    out.append(chunk("", choice["finish_reason"], **extra))
    if include_usage:
        out.append(head | {"choices": [], "usage": resp.get("usage")})
    return out


#: an event: its name (the ``event:`` line; None: data only, as OpenAI's chat streams) and its data
Event = tuple[str | None, dict[str, Any]]


def data_only(make: Callable[[dict[str, Any], bool], list[dict[str, Any]]]) -> Callable[..., list[Event]]:
    """OpenAI's chat and completions chunks as events without a name (data lines only)."""
    return lambda resp, usage: [(None, c) for c in make(resp, usage)]


def event(name: str | None, obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data}\n\n".encode()


async def events(
    chunks: list[Event], done: Callable[[int, int], None], *, end_with_done: bool = True
) -> AsyncIterator[bytes]:
    """The events, then ``[DONE]`` where the API ends with it; ``done(sent, total)`` is called once,
    however the stream ends (the client may leave mid-stream: then ``sent`` < ``total``)."""
    sent, total = 0, len(chunks) + end_with_done
    try:
        for name, data in chunks:
            yield event(name, data)
            sent += 1
        if end_with_done:
            yield event(None, "[DONE]")
            sent += 1
    finally:
        done(sent, total)
