"""OpenAI's Responses API (``/v1/responses``) on serve: a request becomes the chat request it means (input
items as messages, instructions as the system message, function tools, ``text.format`` as the response
format), is answered by the same chat handler (so the same prompt rendering, pinned decoding, lanes, marks,
bounds and log entry, with the chat-shaped ``messages`` every residue tier reads), and the answer is
returned as a ``response`` object, or as its stream of typed events.

``previous_response_id`` is a memory kept by the server: serve stores each response (``store``, on by
default) with the conversation it ended, per lane, and a request naming one continues that conversation.
What a stored response holds reaches the model again, so the log entry's ``messages`` are the whole
conversation the model read: z a forget left in a stored response shows in the prompts after the forget
(``residue_context``), like any other tier.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from eu_audit.errors import BadInput


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    previous_response_id: str | None = Field(None, max_length=200)
    store: bool = True
    text: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for p in content or []:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise BadInput(f"field 'input': content of type {kind!r} is not served (text only)")
        parts.append(str(p.get("text", "")))
    return "".join(parts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: a message item as itself, a run of function calls as one assistant
    message with those tool calls, a function call's output as a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadInput(
                    f"field 'input.{i}.role': {role!r} is not user, system, developer or assistant"
                )
            out.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {
                    "name": str(item.get("name", "")),
                    "arguments": str(item.get("arguments", "{}")),
                },
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text_of(output)
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        else:
            served = "message, function_call, function_call_output"
            raise BadInput(f"field 'input.{i}.type': {kind!r} is not served ({served})")
    return out


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools as chat tools; any other kind (web search, file search) is refused."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.get("type") != "function":
            raise BadInput(f"field 'tools.{i}.type': {t.get('type')!r} is not served (function tools only)")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def function_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise BadInput(
                f"field 'tool_choice': {choice.get('type')!r} is not served (a function, or a string)"
            )
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return choice


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt.get("type")}


class Stored:
    """Responses kept for ``previous_response_id``: per lane, the conversation each one ended (its input
    messages, without its instructions, and its answer), the oldest dropped past ``capacity``."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()
        self._cap = capacity
        self._lock = threading.Lock()

    def get(self, lane: str, response_id: str) -> list[dict[str, Any]]:
        with self._lock:
            got = self._items.get((lane, response_id))
        if got is None:
            raise BadInput(f"field 'previous_response_id': no stored response {response_id!r} on this lane")
        return [dict(m) for m in got]

    def put(self, lane: str, response_id: str, conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[(lane, response_id)] = conversation
            while len(self._items) > self._cap:
                self._items.popitem(last=False)


def chat_of_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request a Responses request means (``history``: a previous response's conversation)."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {"messages": [*system, *history, *input_messages(req.input)]}
    if (tools := function_tools(req.tools)) is not None:
        body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = function_choice(req.tool_choice)
    if (fmt := chat_response_format(req.text)) is not None:
        body["response_format"] = fmt
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    return body


def new_ids() -> dict[str, str]:
    """A response's id and its message item's, made before it decodes (a live stream names both first)."""
    return {"response": f"resp_{secrets.token_hex(12)}", "message": f"msg_{secrets.token_hex(8)}"}


def response_opening(req: ResponsesRequest, model: str) -> dict[str, Any]:
    """What a response is before it decodes: its ids and its object with no output yet (``serve.live``
    streams them first, so the ids its first events name are the whole answer's)."""
    ids = new_ids()
    return {"ids": ids, "object": response_object({"choices": [{"message": {}}], "model": model}, req, ids)}


def response_object(
    chat: dict[str, Any], req: ResponsesRequest, ids: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ``chat.completion`` as the Responses API's ``response`` (``ids``: its own and its message's)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    ids = ids or new_ids()
    rid = ids["response"]
    output: list[dict[str, Any]] = []
    if msg.get("content"):
        text = {"type": "output_text", "text": msg["content"], "annotations": []}
        mid = ids["message"]
        output.append(
            {"type": "message", "id": mid, "status": "completed", "role": "assistant", "content": [text]}
        )
    for c in msg.get("tool_calls") or []:
        fn = c["function"]
        item = {"type": "function_call", "id": f"fc_{secrets.token_hex(8)}", "call_id": c["id"]}
        output.append(item | {"name": fn["name"], "arguments": fn["arguments"], "status": "completed"})
    usage = chat.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    cut = choice.get("finish_reason") == "length"  # an upstream may leave it out
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": chat.get("model"),
        "instructions": req.instructions,
        "previous_response_id": req.previous_response_id,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "temperature": req.temperature,
        "text": req.text or {"format": {"type": "text"}},
        "store": req.store,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.get("total_tokens", 0),
        },
    }


def conversation_after(
    messages: list[dict[str, Any]], resp: dict[str, Any], has_system: bool
) -> list[dict[str, Any]]:
    """What a stored response continues: the conversation it read (its instructions left out: a later
    request brings its own) and its answer."""
    kept = messages[1:] if has_system else list(messages)
    calls = [
        {"id": o["call_id"], "type": "function", "function": {"name": o["name"], "arguments": o["arguments"]}}
        for o in resp["output"]
        if o["type"] == "function_call"
    ]
    text = "".join(p["text"] for o in resp["output"] if o["type"] == "message" for p in o["content"])
    answer: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        answer["tool_calls"] = calls
    return [*kept, answer]


def response_events(
    resp: dict[str, Any], include_usage: bool = True
) -> list[tuple[str | None, dict[str, Any]]]:
    """The Responses API's stream of a finished response: created, each output item added, its text or
    arguments as a delta, done, and completed (the usage rides on the response objects)."""
    from eu_audit.serve.stream import pieces

    start = resp | {"status": "in_progress", "output": [], "usage": None}
    out: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": start}),
        ("response.in_progress", {"response": start}),
    ]
    for i, item in enumerate(resp["output"]):
        at = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            opened = item | {"content": [], "status": "in_progress"}
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(("response.output_item.added", {"output_index": i, "item": opened}))
            out.append(("response.content_part.added", at | {"content_index": 0, "part": part}))
            for p in pieces(text):
                out.append(
                    ("response.output_text.delta", at | {"content_index": 0, "delta": p, "logprobs": []})
                )
            out.append(("response.output_text.done", at | {"content_index": 0, "text": text, "logprobs": []}))
            out.append(
                ("response.content_part.done", at | {"content_index": 0, "part": part | {"text": text}})
            )
        else:
            opened = item | {"arguments": "", "status": "in_progress"}
            out.append(("response.output_item.added", {"output_index": i, "item": opened}))
            out.append(("response.function_call_arguments.delta", at | {"delta": item["arguments"]}))
            out.append(("response.function_call_arguments.done", at | {"arguments": item["arguments"]}))
        out.append(("response.output_item.done", {"output_index": i, "item": item}))
    last = "response.completed" if resp["status"] == "completed" else "response.incomplete"
    out.append((last, {"response": resp}))
    return [(name, {"type": name, "sequence_number": n, **data}) for n, (name, data) in enumerate(out)]
