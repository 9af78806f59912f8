"""Every request field serve's generation routes take, and what serve does with it: served, pinned by the
harness, of no effect on the answer, or refused (400 naming the field) unless it has its default value.

A field serve does not implement is never silently ignored: a client that asks for three choices, log
probabilities or a stop sequence and gets one plain answer would be measured on an answer it did not ask
for. A field no row names is refused too. ``docs/serve-fields.md`` is this table, written from it
(``fields_markdown``); a test walks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

How = Literal["served", "pinned", "no effect", "refused"]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


@dataclass(frozen=True)
class FieldRule:
    name: str
    how: How
    note: str
    #: a "refused" field's values that ask for nothing serve lacks (its default): accepted
    defaults: tuple[Any, ...] = (None,)
    #: proxy mode (``serve --upstream``) forwards it, so the upstream serves it
    forwarded: bool = False

    def refusal(self, value: Any, *, upstream: bool = False) -> str | None:
        """Why ``value`` is refused (a 400's message), or None when it is served."""
        if self.how != "refused" or value in self.defaults or (upstream and self.forwarded):
            return None
        shown = ", ".join(repr(d) for d in self.defaults if d is not None)
        accepted = f" (accepted: {shown}, or leave it out)" if shown else " (leave it out)"
        return f"field '{self.name}': {self.note}{accepted}"


_STREAMING = (
    FieldRule(
        "stream", "served", "server-sent events in the route's own chunk format (`eu_audit.serve.stream`)"
    ),
    FieldRule("stream_options", "served", "`include_usage`: a last chunk with the usage"),
)
_PINNED = (
    FieldRule("temperature", "pinned", "the harness's pinned decoding decides; the agent's value is logged"),
    FieldRule("seed", "pinned", "as temperature"),
    FieldRule("top_p", "pinned", "as temperature (greedy, or sampled at the pin's temperature and seed)"),
    FieldRule("top_k", "pinned", "as top_p (vLLM's and llama.cpp's extension)"),
)
_NO_EFFECT = (
    FieldRule(
        "model", "no effect", "serve runs one model (`/v1/models` names it); any name is answered by it"
    ),
    FieldRule("user", "no effect", "an end-user id for the provider's abuse monitoring"),
)
_REFUSED_BOTH = (
    FieldRule(
        "n", "refused", "one choice per request: serve answers each call once, as it is logged", (None, 1)
    ),
    FieldRule(
        "stop", "refused", "stop sequences are not applied (with --upstream, forwarded)", (None, [], ""), True
    ),
    FieldRule("frequency_penalty", "refused", "penalties change decoding under the pin", (None, 0, 0.0)),
    FieldRule("presence_penalty", "refused", "penalties change decoding under the pin", (None, 0, 0.0)),
    FieldRule("logit_bias", "refused", "a bias changes decoding under the pin", (None, {})),
)

FIELDS: dict[str, tuple[FieldRule, ...]] = {
    CHAT: (
        FieldRule(
            "messages", "served", "system, developer, user, assistant (with tool calls) and tool messages"
        ),
        FieldRule("tools", "served", "function tools, rendered into the prompt; calls parsed from the reply"),
        FieldRule(
            "tool_choice", "served", '"auto", "none", "required" or a named function (held token by token)'
        ),
        FieldRule(
            "parallel_tool_calls",
            "served",
            "false: the reply carries its first tool call only; true: every one",
        ),
        FieldRule(
            "response_format", "served", "text, json_object or json_schema, held token by token without tools"
        ),
        FieldRule("max_tokens", "served", "within serve's --max-tokens"),
        FieldRule("max_completion_tokens", "served", "as max_tokens"),
        *_STREAMING,
        *_PINNED,
        *_NO_EFFECT,
        FieldRule("metadata", "no effect", "tags for the provider's dashboard"),
        FieldRule(
            "store", "no effect", "the provider's storage for distillation; serve stores nothing", (None,)
        ),
        FieldRule("service_tier", "no effect", "a provider's latency tier"),
        FieldRule("safety_identifier", "no effect", "as user"),
        FieldRule(
            "prompt_cache_key", "no effect", "a provider's cache routing hint; serve's cache is per lane"
        ),
        *_REFUSED_BOTH,
        FieldRule("logprobs", "refused", "log probabilities are not returned", (None, False)),
        FieldRule("top_logprobs", "refused", "log probabilities are not returned", (None, 0)),
        FieldRule("modalities", "refused", "text only", (None, ["text"])),
        FieldRule("audio", "refused", "text only"),
        FieldRule("prediction", "refused", "predicted outputs change what is decoded"),
        FieldRule("reasoning_effort", "refused", "the served models do not reason apart from their answer"),
        FieldRule("verbosity", "refused", "the served models take no verbosity setting"),
        FieldRule("web_search_options", "refused", "serve runs no tools of its own"),
        FieldRule("functions", "refused", "the deprecated functions field: send tools"),
        FieldRule("function_call", "refused", "the deprecated function_call field: send tool_choice"),
    ),
    COMPLETIONS: (
        FieldRule("prompt", "served", "a string, or token ids"),
        FieldRule(
            "segments", "served", "eu-audit's own: the prompt's segment lengths (the canonical schedule)"
        ),
        FieldRule("return_token_ids", "served", "eu-audit's own: the answer's token ids"),
        FieldRule(
            "stop_token_ids",
            "served",
            "vLLM's: only the end-of-turn id serve stops on (eu-audit's engines send it); others refused",
        ),
        FieldRule("max_tokens", "served", "within serve's --max-tokens (OpenAI's default 16)"),
        *_STREAMING,
        *_PINNED,
        *_NO_EFFECT,
        *_REFUSED_BOTH,
        FieldRule("logprobs", "refused", "log probabilities are not returned", (None, 0)),
        FieldRule("echo", "refused", "the prompt is not echoed", (None, False)),
        FieldRule("suffix", "refused", "no insertion mode", (None, "")),
        FieldRule("best_of", "refused", "one candidate per request", (None, 1)),
    ),
}


FIELDS[RESPONSES] = (
    FieldRule("input", "served", "a string, or message, function_call and function_call_output items (text)"),
    FieldRule("instructions", "served", "the system message (not carried to a later response)"),
    FieldRule("tools", "served", "function tools; other kinds refused"),
    FieldRule("tool_choice", "served", "as chat's"),
    FieldRule("parallel_tool_calls", "served", "as chat's"),
    FieldRule("text", "served", "format: text, json_object or json_schema, as chat's response_format"),
    FieldRule("max_output_tokens", "served", "within serve's --max-tokens"),
    FieldRule("previous_response_id", "served", "continues a stored response's conversation (per lane)"),
    FieldRule("store", "served", "true (the default): kept for previous_response_id"),
    FieldRule(
        "stream", "served", "the Responses API's typed events (response.created ... response.completed)"
    ),
    *_PINNED,
    *_NO_EFFECT,
    FieldRule("metadata", "no effect", "tags for the provider's dashboard"),
    FieldRule("service_tier", "no effect", "a provider's latency tier"),
    FieldRule("safety_identifier", "no effect", "as user"),
    FieldRule("prompt_cache_key", "no effect", "a provider's cache routing hint; serve's cache is per lane"),
    FieldRule("stream_options", "no effect", "obfuscation padding only"),
    FieldRule("truncation", "refused", "serve never drops input to fit", (None, "disabled")),
    FieldRule("include", "refused", "no extra outputs (reasoning, logprobs, search results)", (None, [])),
    FieldRule("reasoning", "refused", "the served models do not reason apart from their answer", (None, {})),
    FieldRule("background", "refused", "answered in the request", (None, False)),
    FieldRule("conversation", "refused", "no conversations API: chain with previous_response_id"),
    FieldRule("max_tool_calls", "refused", "no built-in tools"),
    FieldRule("top_logprobs", "refused", "log probabilities are not returned", (None, 0)),
    FieldRule("prompt", "refused", "no stored prompt templates"),
)
FIELDS[MESSAGES] = (
    FieldRule("messages", "served", "user and assistant turns: text, tool_use and tool_result blocks"),
    FieldRule("system", "served", "the system message (a string or text blocks)"),
    FieldRule("max_tokens", "served", "required by the API; within serve's --max-tokens"),
    FieldRule("tools", "served", "client tools (input_schema); server tools refused"),
    FieldRule("tool_choice", "served", "auto, any, tool (named) or none; disable_parallel_tool_use"),
    FieldRule("stream", "served", "Anthropic's events (message_start ... message_stop)"),
    *_PINNED,
    *_NO_EFFECT,
    FieldRule("metadata", "no effect", "a user id for the provider's abuse monitoring"),
    FieldRule("service_tier", "no effect", "a provider's capacity tier"),
    FieldRule("stop_sequences", "refused", "stop sequences are not applied", (None, [])),
    FieldRule(
        "thinking",
        "refused",
        "the served models do not think apart from their answer",
        (None, {"type": "disabled"}),
    ),
    FieldRule("container", "refused", "serve runs no tools of its own"),
    FieldRule("mcp_servers", "refused", "serve runs no tools of its own", (None, [])),
)


def check_fields(endpoint: str, body: Mapping[str, Any], *, upstream: bool = False) -> None:
    """Refuse (``BadInput``: a 400 naming the field) a field the route does not serve, or a refused
    field's value other than its default (with ``upstream``, a field proxy mode forwards is served)."""
    from eu_audit.errors import BadInput

    table = {f.name: f for f in FIELDS[endpoint]}
    for name, value in body.items():
        rule = table.get(name)
        if rule is None:
            raise BadInput(
                f"field '{name}': not a field serve takes on {endpoint} (docs/serve-fields.md lists them); "
                "left out, it would be silently ignored"
            )
        if (why := rule.refusal(value, upstream=upstream)) is not None:
            raise BadInput(why)


def fields_markdown() -> str:
    """``docs/serve-fields.md``'s tables, from ``FIELDS``."""
    out = []
    for endpoint, rules in FIELDS.items():
        out += [f"### `{endpoint}`", "", "| field | how | what serve does |", "|---|---|---|"]
        for f in rules:
            shown = [repr(d) for d in f.defaults if d is not None]
            unless = f" unless {' or '.join(shown)}" if f.how == "refused" and shown else ""
            out.append(f"| `{f.name}` | {f.how}{unless} | {f.note} |")
        out.append("")
    return "\n".join(out)
