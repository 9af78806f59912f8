"""``eu-audit serve``'s wire types: what its clients may send, what the harness may set, what it logs.

One definition per contract: the request bodies of the OpenAI-compatible surface (validated before any
token is computed, so a wrong-typed field is a 400 naming the field, never a 500), the control bodies only
the harness may send (a mark, pinned decoding), a log entry (``eu-audit schema serve-log``) and the limits
every request runs under.

Two surfaces, two keys. The agent under test reaches the model surface (``/v1/...``); the control surface
(marks, decoding, the log) answers only a request that carries the run's control secret in
``X-EU-Audit-Control``. The secret is made by serve at start and written to a 0600 file the harness reads;
the agent is never given it. Each mark carries the secret's key id, so the audit can say which key marked
the requests it counted as post-forget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: "forensics": the harness's own calls (embedding z to search an agent's stored vectors), no tenant's
LogPhase = Literal["stream", "forget", "future", "probe", "sample", "choice", "recheck", "forensics"]


#: completion tokens for a request that names none (no ``max_tokens`` / ``max_completion_tokens``), within
#: ``Limits.max_tokens``: 256 on chat, where OpenAI sets no default (a looping small model costs a CPU every
#: token it writes; the log's ``finish`` says "length" when a reply ran to it), 16 on /v1/completions,
#: OpenAI's own default there
UNASKED_CHAT_TOKENS = 256
UNASKED_COMPLETION_TOKENS = 16


@dataclass(frozen=True)
class Limits:
    """What one request may cost. Defaults suit a CI job on a small local model."""

    max_body_bytes: int = 4 << 20  # a request body larger than this is refused (413)
    max_tokens: int = 1024  # completion tokens per request, after the context's own bound
    request_timeout_s: float = 300.0  # wall time per request, the wait for the engine included
    repetition_guard: bool = True  # stop decoding that loops on one short pattern (logged: "repetition")
    lane_caches: int = 8  # KV caches serve keeps, one per recently used lane and prompt family
    #: prefill each message in pieces of this many tokens (0: whole, up to the engine's micro-batch), so a
    #: prompt whose first message changes only at its end (a timestamp) reuses its unchanged pieces
    piece_tokens: int = 0
    #: answers of identical greedy requests kept for reuse (``eu_audit.serve.reuse``); 0 decodes each anew
    reuse_answers: int = 4096


# -- control (harness only) ---------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mark(_Strict):
    """Which tenant and phase the requests that follow belong to. The tenant is an opaque name: serve's log
    is a file an agent of the same user could read, so no role (reference, control, the method) and no
    session appears in it; the mapping from tenant to role stays with the harness."""

    tenant: str = Field("", max_length=200)
    phase: LogPhase
    event: str = Field("", max_length=50)  # phase "recheck": which event (``eu_audit.blackbox.recheck``)


#: a lane: one tenant's own door to the model (``/lanes/{lane}/v1/...``), so tenants driven at the same
#: time are told apart by where their calls arrive, never by anything the agent writes in them
LANE_PATTERN = r"^[0-9a-f]{32}$"


class MarkRequest(_Strict):
    tag: Mark | None = None  # None clears the mark
    lane: str | None = Field(None, pattern=LANE_PATTERN)  # None: the root lane (/v1/...)


class DecodingRequest(_Strict):
    """Pinned decoding: greedy; sampled at ``temperature`` with ``seed``; or the agent's own settings."""

    mode: Literal["greedy", "sampled", "agent"] = "greedy"
    temperature: float = Field(0.0, ge=0.0, le=10.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**32)
    lane: str | None = Field(None, pattern=LANE_PATTERN)

    @model_validator(mode="after")
    def _sampled_needs_both(self) -> DecodingRequest:
        if self.mode == "sampled" and (self.temperature <= 0 or self.seed is None):
            raise ValueError("sampled decoding needs a temperature > 0 and a seed")
        return self


# -- the model surface (anyone) -------------------------------------------------------------------------


class _Open(BaseModel):
    """OpenAI clients send many optional fields (``user``, ``n``, ``top_p`` ...): parsed, then each served
    or refused by its route's table (``eu_audit.serve.fields``), never silently ignored. Proxy mode
    forwards only the named ones."""

    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str = "text"
    text: str = ""


#: the longest function name a request may carry; serve never answers with a longer one (chat_segments)
MAX_FUNCTION_NAME = 200


class FunctionCall(_Open):
    name: str = Field(max_length=MAX_FUNCTION_NAME)
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


#: what a JSON reply is held to when no schema says more (OpenAI's json_object, a schema-less json_schema)
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


class JsonSchemaFormat(_Open):
    name: str = Field("", max_length=64)
    #: the reply's JSON schema (``schema`` on the wire); absent: any JSON object (non-strict OpenAI)
    json_schema: dict[str, Any] = Field(default_factory=lambda: dict(ANY_JSON_OBJECT), alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON matching a schema. A local model
    is held to it token by token (``eu_audit.engines.constraint``) when the request offers no tools."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object with the 'schema'")
        return self

    def wanted(self) -> tuple[str, dict[str, Any]] | None:
        """(the log's name for it, the JSON schema) a JSON reply must match; None for plain text."""
        if self.type == "json_object":
            return "json_object", dict(ANY_JSON_OBJECT)
        if self.type == "json_schema" and self.json_schema is not None:
            return f"json_schema {self.json_schema.name}".strip(), self.json_schema.json_schema
        return None


class StreamOptions(_Open):
    include_usage: bool = False  # other options (OpenAI's include_obfuscation) shape padding only


class _Streamable(_Open):
    """``stream`` (server-sent events: ``eu_audit.serve.stream``) and its options."""

    stream: bool = False
    stream_options: StreamOptions | None = None

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Streamable):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    response_format: ResponseFormat | None = None
    #: OpenAI's: "auto" (the default), "none", "required", or {"type": "function", "function": {"name"}}
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    parallel_tool_calls: bool | None = None

    _t = field_validator("temperature")(_finite)

    def wanted_tokens(self) -> int:
        return self.max_tokens or self.max_completion_tokens or UNASKED_CHAT_TOKENS


class CompletionRequest(_Streamable):
    prompt: str | list[int] = Field(min_length=1)
    segments: list[int] | None = None  # lengths: eu-audit's canonical schedule, for clients that keep it
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    return_token_ids: bool = False
    stop_token_ids: list[int] | None = None  # vLLM's; served only as the end-of-turn id (serve.fields)

    _t = field_validator("temperature")(_finite)


class EmbeddingRequest(_Open):
    input: str | list[str] = Field(min_length=1)


#: the routes whose requests are chat messages (the Responses and Messages APIs are rendered and logged as
#: chat: ``eu_audit.serve.responses_api``, ``messages_api``), and every route that reaches the model
CHAT_SHAPED = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
MODEL_ENDPOINTS = (*CHAT_SHAPED, "/v1/completions", "/v1/embeddings")

#: fields proxy mode forwards upstream, per endpoint; decoding is the pin's, never the client's
FORWARDED = {
    "/v1/chat/completions": (
        "model",
        "messages",
        "tools",
        "tool_choice",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "response_format",
        "parallel_tool_calls",
    ),
    "/v1/completions": ("model", "prompt", "max_tokens", "stop"),
    "/v1/embeddings": ("model", "input", "encoding_format", "dimensions"),
}


# -- the log ----------------------------------------------------------------------------------------------


class LogMark(Mark):
    key: str = ""  # the key id of the control secret that set the mark


class LogEntry(BaseModel):
    """One request as ``serve`` saw it, failed ones included (``status`` >= 400, ``error`` says why)."""

    model_config = ConfigDict(extra="forbid")

    seq: int
    time: float
    mark: LogMark | None = None  # the harness's mark when the request arrived
    endpoint: str
    status: int = 200
    error: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[str] | None = None  # the offered functions' names
    #: the offered tools as sent (names, descriptions, parameter schemas): what the template renders for
    #: the model, so z in a tool's description reaches it (``eu_audit.blackbox.residue`` reads them)
    tool_specs: list[dict[str, Any]] | None = None
    #: the request's response_format as sent: a JSON schema's descriptions reach the model too
    response_format: dict[str, Any] | None = None
    #: sha256 of the prompt the engine received, rendered by its chat template (token ids, segment by
    #: segment): two calls with the same digest sent the model the same prompt
    prompt_digest: str | None = None
    #: the answer of an identical greedy request served before, given again, not decoded again
    #: (``eu_audit.serve.reuse``): the same tokens a decoding would give
    reused: bool | None = None
    tool_choice: str | None = None  # "required" or a function's name: the reply was opened as a call to it
    #: what the reply was held to token by token: "json_object", "json_schema NAME" (its response_format),
    #: "arguments of NAME" (a forced call's parameters); or why a format asked for was not enforced
    held_to: str | None = None
    #: under "required": the name the model began and the offered function the call was given
    named_call: dict[str, str] | None = None
    prompt_text: str | None = None
    segments: list[str] | None = None  # a token-id prompt's segments, each with its chat markers
    input: list[str] | None = None  # embedding inputs
    body_excerpt: str | None = None  # a body that could not be read as a request (first 2000 chars)
    reply: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    decoding: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    finish: str | None = None  # stop | length | cancelled | deadline
    #: ``stream: true``: the events the answer was sent in, and how many were sent before the stream
    #: ended (fewer: the client left mid-stream)
    streamed: dict[str, int | bool] | None = None  # "live": sent while it decoded (serve.live)
    #: a chat answer streamed while it decoded (``serve.live``) whose text did not begin with what had been
    #: sent early: never expected, and a test fails on it
    diverged: bool | None = None
    #: ``parallel_tool_calls: false``: the calls the model wrote past the first, left out of the reply
    calls_dropped: int | None = None
    #: the Responses API: the stored response this request continued (its conversation is in ``messages``)
    previous_response_id: str | None = None
    ms: float | None = None
    #: the lane the request came in on ("" the root URL; "-" a lane serve never opened, refused 404)
    lane: str | None = None
    #: a control call: the harness's running number for it (``X-EU-Audit-Call``), so a control call the
    #: harness never made, by anyone else holding the secret, stands out in the log
    control_call: str | None = None
    path: str | None = None  # a route serve does not have, as asked (refused 404)
