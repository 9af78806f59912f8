"""Streamed answers as HTTP responses: a chat completion token by token while the model decodes it
(``live_chat``), and any route's whole answer as its API's events (``streamed_response``).

A streamed chat request is decoded by the same handler as any other (the same pinned decoding, lane, mark,
bounds and deadline); while it decodes, the text decoded so far is sent as ``chat.completion.chunk``
content deltas, and when it ends the rest follows (the text not sent yet, the tool calls, the finish
reason, the usage where asked). What is sent early is only what cannot change: the decoded text up to the
first character that may open a tool call's markup or a JSON value (``HOLD_FROM``), without trailing
spaces (the answer is stripped) or a character still incomplete. So the deltas joined are the answer's
content character for character, as without ``stream`` (``tests/test_serve_apis.py`` holds it); an answer
whose text would not extend what was sent is logged ``diverged`` (never seen; a test fails on it).

A reply held to a format, a forced call, or an answer given again (``serve.reuse``) has no decoding to
watch: it is sent as events once it is whole (``serve.stream``). The Responses and Messages APIs stream
that way too. The log entry is written when the stream ends, with how many events reached the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from eu_audit.serve.backend import Backend, Refused
from eu_audit.serve.stream import event
from eu_audit.serve.surface import Call

#: where the text sent early stops: a tool call's markup, a JSON object or list, a code fence
HOLD_FROM = "<{[`"
#: how often the decoded text is looked at while a request decodes
POLL_S = 0.05


def stable_text(backend: Backend, ids: Sequence[int]) -> str:
    """The part of the text of ``ids`` (decoded so far) that the whole answer's content will begin with."""
    assert backend.engine is not None
    text = str(backend.engine.tokenizer.decode(list(ids), skip_special_tokens=True)).lstrip()
    cut = min((i for i in (text.find(c) for c in HOLD_FROM) if i >= 0), default=len(text))
    return text[:cut].rstrip().rstrip("\ufffd").rstrip()


async def live_chat(
    backend: Backend,
    work: asyncio.Future[Any],
    call: Call,
    log: Callable[[int, str], None],
) -> AsyncIterator[bytes]:
    """The events of a chat request decoding in ``work``: deltas while it decodes, then the rest.
    ``log(status, error)`` writes the request's log entry once, however the stream ends."""
    head = {
        "id": f"chatcmpl-{backend.requests}",
        "object": "chat.completion.chunk",
        "model": backend.model_name,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return event(None, head | {"choices": [choice]})

    sent, events, status, error, complete = "", 0, 200, "", False
    try:
        yield chunk({"role": "assistant", "content": ""})
        events += 1
        while not work.done():
            await asyncio.wait({work}, timeout=POLL_S)
            now = stable_text(backend, call.live)
            if len(now) > len(sent) and now.startswith(sent):
                yield chunk({"content": now[len(sent) :]})
                events, sent = events + 1, now
        try:
            resp = work.result()
        except Refused as exc:  # the answer failed after the stream began: said in the stream, and logged
            status, error = exc.status, exc.message
            yield event(None, {"error": {"message": exc.message, "type": "server_error"}})
            return
        choice = resp["choices"][0]
        msg = choice["message"]
        content = msg.get("content") or ""
        if not content.startswith(sent):
            call.log["diverged"] = True  # never expected: the early text was not the answer's beginning
        rest = content[len(sent) :] if content.startswith(sent) else content
        if rest:
            yield chunk({"content": rest})
            events += 1
        for i, tool_call in enumerate(msg.get("tool_calls") or []):
            yield chunk({"tool_calls": [{"index": i, **tool_call}]})
            events += 1
        yield chunk({}, choice["finish_reason"])
        events += 1
        if call.stream:  # stream_options.include_usage
            yield event(None, head | {"choices": [], "usage": resp.get("usage")})
            events += 1
        # logged before the last event: a client that has read [DONE] finds the entry written
        complete = True
        call.log["streamed"] = {"events": events + 1, "sent": events + 1, "live": True}
        log(status, error)
        yield event(None, "[DONE]")
    finally:
        if not complete:
            if status == 200:  # the client left: decoding (if any is left) stops at once
                call.gone.set()
                error = "the client left mid-stream"
            call.log["streamed"] = {"events": events, "sent": events, "live": True}
            log(status, error)


def live_response(
    backend: Backend, work: asyncio.Future[Any], call: Call, log: Callable[[int, str], None]
) -> Any:
    """``live_chat``'s events as the HTTP response."""
    from fastapi.responses import StreamingResponse

    return StreamingResponse(live_chat(backend, work, call, log), media_type="text/event-stream")


def streamed_response(
    endpoint: str, result: dict[str, Any], include_usage: bool, done: Callable[[int, int], None]
) -> Any:
    """``result`` (the route's whole answer) as its API's server-sent events: OpenAI's chat and completions
    chunks ending with ``data: [DONE]``, the Responses API's and the Messages API's typed events."""
    from fastapi.responses import StreamingResponse

    from eu_audit.serve.fields import CHAT, COMPLETIONS, MESSAGES, RESPONSES
    from eu_audit.serve.messages_api import message_events
    from eu_audit.serve.responses_api import response_events
    from eu_audit.serve.stream import chat_chunks, completion_chunks, data_only, events

    makers = {
        CHAT: (data_only(chat_chunks), True),
        COMPLETIONS: (data_only(completion_chunks), True),
        RESPONSES: (response_events, False),
        MESSAGES: (message_events, False),
    }
    make, end_with_done = makers[endpoint]
    chunks = make(result, include_usage)
    return StreamingResponse(
        events(chunks, done, end_with_done=end_with_done), media_type="text/event-stream"
    )
