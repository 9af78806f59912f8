"""OpenAI chat messages as segments of token ids, the way eu-audit's engines keep state.

Each message is one segment (a system prompt, a user message, a tool result); an assistant message is
two: its header (``<|im_start|>assistant\\n``, the generation prompt) and its body with the closing
marker, exactly as an engine committed it when it generated the turn. So a conversation that grows by
appending messages reuses the cache segment by segment, and every state the server holds is the
canonical one (each segment prefilled as one chunk), whatever requests came before.

A generated answer is remembered by its text (and tool calls): when the agent sends it back as an
assistant message, the server uses the ids it generated instead of re-tokenising the text, which can
split differently.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Any

from eu_audit.errors import BadInput
from eu_audit.runtime.chat import ChatFormat
from eu_audit.runtime.tools import parse_tool_calls
from eu_audit.serve.api import MAX_FUNCTION_NAME

TOOL_PROMPT = (
    'To use a tool, write <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.\nTools:\n{tools}'
)


def tools_text(tools: list[dict[str, Any]]) -> str:
    """OpenAI function specs rendered as the runtime's tool list (name(params) [description])."""
    lines = []
    for t in tools:
        fn = t.get("function", t)
        params = ", ".join((fn.get("parameters") or {}).get("properties", {}))
        lines.append(f"- {fn.get('name', '?')}({params}): {fn.get('description', '')}".rstrip(": "))
    return TOOL_PROMPT.format(tools="\n".join(lines))


def message_text(msg: dict[str, Any]) -> str:
    content = msg.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def assistant_text(msg: dict[str, Any]) -> str:
    """An assistant message as the text the model wrote: content, then its tool calls."""
    text = message_text(msg)
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", {})
        args = fn.get("arguments", "{}")
        try:
            args_obj = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            args_obj = args
        text += "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args_obj}) + "</tool_call>"
    return text


#: how a forced call opens before its function is named (``tool_choice: "required"``)
CALL_OPENING = '<tool_call>{"name": "'


def call_opening(name: str) -> str:
    """The opening of a call to ``name``: the model writes its arguments from here."""
    return '<tool_call>{"name": ' + json.dumps(name) + ', "arguments": '


def forced_call(tool_choice: str | dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> str | None:
    """The function OpenAI's ``tool_choice`` asks the reply to call: its name, ``""`` for any offered one
    (``"required"``: the model begins the name), None when the model chooses (``"auto"``, ``"none"``,
    absent). A choice the request's tools cannot meet is refused (``BadInput``, naming the field)."""
    if tool_choice in (None, "auto", "none"):
        return None
    names = [str((t.get("function") or t).get("name", "")) for t in tools or []]
    if not names:
        raise BadInput("field 'tool_choice': a tool call is asked for and the request has no tools")
    if tool_choice == "required":
        return ""
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = str((tool_choice.get("function") or {}).get("name", ""))
        if name not in names:
            raise BadInput(f"field 'tool_choice': function {name!r} is not among the request's tools")
        return name
    raise BadInput(f"field 'tool_choice': {tool_choice!r} is not auto, none, required or a function")


def still_naming(began: str, names: list[str]) -> bool:
    """Whether the name the model has begun after ``CALL_OPENING`` can still become one of ``names``."""
    return '"' not in began and any(n.startswith(began) for n in names)


def offered_name(began: str, names: list[str]) -> str:
    """The offered function a forced call names, from the name the model began: that name when it is one
    of ``names``; otherwise the offered name sharing the longest start with it (the first offered one on a
    tie). OpenAI's ``required`` promises a call to one of the request's functions, so a name the model
    invents (a small model at temperature 0.7 does) is never what the reply carries."""
    began = began.split('"')[0]
    if began in names:
        return began
    # commonprefix compares character by character, which is what the start of a name is
    return max(names, key=lambda n: (len(os.path.commonprefix([n, began])), -names.index(n)))  # noqa: RUF071


def split_reply(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of a generated text."""
    calls = []
    for k, (name, args, _raw) in enumerate(parse_tool_calls(text)):
        # a name longer than a request may carry is not a call: echoed back, it would be refused
        if name and len(name) <= MAX_FUNCTION_NAME:
            calls.append(
                {
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args if args is not None else {})},
                }
            )
    content = text.split("<tool_call>")[0].strip() if calls else text
    return content, calls


class Generations:
    """Generated turns by (content, tool calls), so an echoed assistant message maps back to its ids."""

    def __init__(self, capacity: int = 4096) -> None:
        self._items: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self._cap = capacity
        self._lock = threading.Lock()

    @staticmethod
    def key(content: str, tool_calls: list[dict[str, Any]] | None) -> tuple[str, str]:
        fns = [c.get("function", {}) for c in tool_calls or []]
        calls = [(fn.get("name"), fn.get("arguments")) for fn in fns]
        return content.strip(), json.dumps(calls, sort_keys=True)

    def remember(self, content: str, tool_calls: list[dict[str, Any]], body_ids: list[int]) -> None:
        with self._lock:
            self._items[self.key(content, tool_calls)] = list(body_ids)
            while len(self._items) > self._cap:
                self._items.popitem(last=False)

    def lookup(self, msg: dict[str, Any]) -> list[int] | None:
        with self._lock:
            return self._items.get(self.key(message_text(msg), msg.get("tool_calls")))


class ChatSegments:
    """Renders a chat request into segments for one chat format and tokenizer."""

    def __init__(self, chat: ChatFormat, tokenizer: Any, generations: Generations) -> None:
        self.chat, self.tokenizer, self.generations = chat, tokenizer, generations

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[list[int]]:
        if not messages:
            raise BadInput("a chat request needs at least one message")
        segs: list[list[int]] = []
        system = [message_text(m) for m in messages if m.get("role") in ("system", "developer")]
        head = "\n\n".join([*system, *([tools_text(tools)] if tools else [])])
        if head:
            segs.append(self.encode(self.chat.bos + self.chat.message("system", head)))
        for m in messages:
            role = m.get("role")
            if role in ("system", "developer"):
                continue
            if role == "assistant":
                segs.append(self.encode(self.chat.generation_prompt()))
                body = self.generations.lookup(m)
                if body is None:
                    body = self.encode(assistant_text(m) + self.chat.end)
                segs.append(body)
            elif role == "tool":
                text = "<tool_response>\n" + message_text(m) + "\n</tool_response>"
                segs.append(self.encode(self.chat.message("user", text)))
            elif role == "user":
                segs.append(self.encode(self.chat.message("user", message_text(m))))
            else:
                raise BadInput(f"unknown message role {role!r}")
        if segs and not head:
            segs[0] = self.encode(self.chat.bos) + segs[0] if self.chat.bos else segs[0]
        segs.append(self.encode(self.chat.generation_prompt()))
        return segs
