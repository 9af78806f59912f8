"""Streamed answers as HTTP responses: a chat completion, a response or a message token by token while the
model decodes it (``live_events``, in each API's frames), and any route's whole answer as its API's events
(``streamed_response``).

A streamed chat, Responses or Messages request is decoded by the same handler as any other (the same
pinned decoding, lane, mark, bounds and deadline); while it decodes, the text decoded so far is sent as
its API's deltas (``chat.completion.chunk`` content, ``response.output_text.delta``,
``content_block_delta``), and when it ends the rest follows (the text not sent yet, the tool calls, the
finish reason, the usage where asked). What is sent early is only what cannot change: the decoded text up
to the first character that may open a tool call's markup or a JSON value (``HOLD_FROM``), without
trailing spaces (the answer is stripped) or a character still incomplete. So the deltas joined are the
answer's content character for character, as without ``stream`` (``tests/test_serve_apis.py`` holds it);
an answer whose text would not extend what was sent is logged ``diverged`` (never seen; a test fails on
it). A response's and a message's ids are made before they decode, so the first events name the ids the
whole answer has.

A reply held to a format, a forced call, or an answer given again (``serve.reuse``) has no decoding to
watch: it is sent as events once it is whole (``serve.stream``). The log entry is written when the stream
ends, with how many events reached the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from eu_audit.serve.backend import Backend, Refused
from eu_audit.serve.stream import event
from eu_audit.serve.surface import Call

#: one server-sent event: its name (none for OpenAI's chunks) and its data ("[DONE]" is a string)
Frame = tuple[str | None, Any]

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


class ChatFrames:
    """OpenAI's ``chat.completion.chunk`` stream: the role first, content deltas, then the rest of the
    whole answer (text not sent yet, tool calls, the finish reason, the usage where asked), ``[DONE]``."""

    def __init__(self, backend: Backend, call: Call) -> None:
        self.call = call
        self.head = {"id": f"chatcmpl-{backend.requests}", "object": "chat.completion.chunk"}
        self.head["model"] = backend.model_name

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return None, self.head | {"choices": [choice]}

    def start(self) -> list[Frame]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def first_text(self) -> list[Frame]:
        return []

    def delta(self, text: str) -> Frame:
        return self._chunk({"content": text})

    @staticmethod
    def text_of(resp: dict[str, Any]) -> str:
        return str(resp["choices"][0]["message"].get("content") or "")

    def finish(self, resp: dict[str, Any], rest: str, opened: bool) -> list[Frame]:
        choice = resp["choices"][0]
        out = [self.delta(rest)] if rest else []
        for i, tool_call in enumerate(choice["message"].get("tool_calls") or []):
            out.append(self._chunk({"tool_calls": [{"index": i, **tool_call}]}))
        out.append(self._chunk({}, choice["finish_reason"]))
        if self.call.stream:  # stream_options.include_usage
            out.append((None, self.head | {"choices": [], "usage": resp.get("usage")}))
        return [*out, (None, "[DONE]")]

    def error(self, message: str) -> Frame:
        return None, {"error": {"message": message, "type": "server_error"}}


class ResponseFrames:
    """The Responses API's typed events: created and in progress at once; the message item and its text
    part opened with the first text; ``output_text.delta`` events; then the whole response's events
    (``responses_api.response_events``) less those already sent, the text not sent yet as one delta.
    Every event is numbered in the order sent (``sequence_number``)."""

    def __init__(self, call: Call) -> None:
        self.skeleton = call.opening["object"] | {"status": "in_progress", "output": [], "usage": None}
        self.mid = call.opening["ids"]["message"]
        self.n = 0

    def _ev(self, name: str, data: dict[str, Any]) -> Frame:
        self.n += 1
        return name, {"type": name, "sequence_number": self.n - 1, **data}

    def start(self) -> list[Frame]:
        return [
            self._ev("response.created", {"response": self.skeleton}),
            self._ev("response.in_progress", {"response": self.skeleton}),
        ]

    def first_text(self) -> list[Frame]:
        item = {
            "type": "message",
            "id": self.mid,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": []}
        at = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        return [
            self._ev("response.output_item.added", {"output_index": 0, "item": item}),
            self._ev("response.content_part.added", at | {"part": part}),
        ]

    def delta(self, text: str) -> Frame:
        name, data = self.rest(text)
        return self._ev(str(name), data)

    def rest(self, text: str) -> Frame:
        """The text not sent yet as one delta, unnumbered (``finish`` numbers it in the order sent)."""
        at = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        return "response.output_text.delta", at | {"delta": text, "logprobs": []}

    @staticmethod
    def text_of(resp: dict[str, Any]) -> str:
        first = resp["output"][0] if resp["output"] else {}
        return str(first["content"][0]["text"]) if first.get("type") == "message" else ""

    def finish(self, resp: dict[str, Any], rest: str, opened: bool) -> list[Frame]:
        from eu_audit.serve.responses_api import response_events

        whole = response_events(resp)[2:]  # created and in progress were sent first
        return [self._ev(str(name), _unnumbered(d)) for name, d in _less_sent(whole, rest, opened, self)]

    def error(self, message: str) -> Frame:
        return self._ev("error", {"code": "server_error", "message": message, "param": None})


class MessageFrames:
    """Anthropic's Messages events: ``message_start`` at once; the text block opened with the first
    text; ``text_delta`` events; then the whole message's events (``messages_api.message_events``) less
    those already sent, the text not sent yet as one delta."""

    def __init__(self, call: Call) -> None:
        usage = {"input_tokens": call.prompt_tokens, "output_tokens": 0}
        self.skeleton = call.opening["object"] | {"stop_reason": None, "content": []}
        self.skeleton["usage"] = self.skeleton["usage"] | usage

    def start(self) -> list[Frame]:
        return [("message_start", {"type": "message_start", "message": self.skeleton})]

    def first_text(self) -> list[Frame]:
        block = {"type": "text", "text": ""}
        return [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})]

    def delta(self, text: str) -> Frame:
        delta = {"type": "text_delta", "text": text}
        return "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}

    def rest(self, text: str) -> Frame:
        """The text not sent yet as one delta (the Messages API numbers no event)."""
        return self.delta(text)

    @staticmethod
    def text_of(msg: dict[str, Any]) -> str:
        first = msg["content"][0] if msg["content"] else {}
        return str(first.get("text") or "") if first.get("type") == "text" else ""

    def finish(self, msg: dict[str, Any], rest: str, opened: bool) -> list[Frame]:
        from eu_audit.serve.messages_api import message_events

        return _less_sent(message_events(msg)[1:], rest, opened, self)  # message_start was sent first

    def error(self, message: str) -> Frame:
        return "error", {"type": "error", "error": {"type": "api_error", "message": message}}


Frames = ChatFrames | ResponseFrames | MessageFrames
#: the first block's text deltas and its opening, by API (the events a live stream sent already)
_OPENING = {"response.output_item.added", "response.content_part.added", "content_block_start"}
_TEXT_DELTA = {"response.output_text.delta", "content_block_delta"}
_TEXT_DONE = {"response.output_text.done", "content_block_stop"}


def _first_block(data: dict[str, Any]) -> bool:
    return data.get("output_index", data.get("index")) == 0


def _unnumbered(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("type", "sequence_number")}


def _less_sent(
    whole: list[Frame], rest: str, opened: bool, frames: ResponseFrames | MessageFrames
) -> list[Frame]:
    """The whole answer's events after its stream's first (sent already): where its text block was
    opened live, the block's opening and text deltas left out and the text not sent yet put in as one
    delta before the block's text ends."""
    if not opened:
        return whole
    out: list[Frame] = []
    for name, data in whole:
        first = _first_block(data)
        if first and name in _OPENING | _TEXT_DELTA:  # the text block, opened live: its text is sent
            continue
        if first and name in _TEXT_DONE and rest:
            out.append(frames.rest(rest))
        out.append((name, data))
    return out


def frames_for(endpoint: str, backend: Backend, call: Call) -> Frames:
    from eu_audit.serve.fields import MESSAGES, RESPONSES

    if endpoint == RESPONSES:
        return ResponseFrames(call)
    if endpoint == MESSAGES:
        return MessageFrames(call)
    return ChatFrames(backend, call)


async def live_events(
    backend: Backend,
    work: asyncio.Future[Any],
    call: Call,
    log: Callable[[int, str], None],
    frames: Frames,
) -> AsyncIterator[bytes]:
    """The events of a request decoding in ``work``, in its API's frames: its opening, text deltas while
    it decodes, then the rest of the whole answer. ``log(status, error)`` writes the request's log entry
    once, however the stream ends."""
    sent, events, status, error, complete, opened = "", 0, 200, "", False, False
    try:
        for name, data in frames.start():
            yield event(name, data)
            events += 1
        while not work.done():
            await asyncio.wait({work}, timeout=POLL_S)
            now = stable_text(backend, call.live)
            if len(now) > len(sent) and now.startswith(sent):
                more = [] if opened else frames.first_text()
                for name, data in [*more, frames.delta(now[len(sent) :])]:
                    yield event(name, data)
                events, sent, opened = events + len(more) + 1, now, True
        try:
            resp = work.result()
        except Refused as exc:  # the answer failed after the stream began: said in the stream, and logged
            status, error = exc.status, exc.message
            yield event(*frames.error(exc.message))
            return
        content = frames.text_of(resp)
        if not content.startswith(sent):
            call.log["diverged"] = True  # never expected: the early text was not the answer's beginning
        rest = content[len(sent) :] if content.startswith(sent) else content
        tail = frames.finish(resp, rest, opened)
        for name, data in tail[:-1]:
            yield event(name, data)
            events += 1
        # logged before the last event: a client that has read the stream's end finds the entry written
        complete = True
        call.log["streamed"] = {"events": events + 1, "sent": events + 1, "live": True}
        log(status, error)
        yield event(*tail[-1])
    finally:
        if not complete:
            if status == 200:  # the client left: decoding (if any is left) stops at once
                call.gone.set()
                error = "the client left mid-stream"
            call.log["streamed"] = {"events": events, "sent": events, "live": True}
            log(status, error)


def live_response(
    backend: Backend, work: asyncio.Future[Any], call: Call, log: Callable[[int, str], None], endpoint: str
) -> Any:
    """``live_events``' events as the HTTP response, in ``endpoint``'s API."""
    from fastapi.responses import StreamingResponse

    frames = frames_for(endpoint, backend, call)
    return StreamingResponse(live_events(backend, work, call, log, frames), media_type="text/event-stream")


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
