"""serve's routes: the OpenAI-compatible model surface, the harness's control surface, and what every
request runs under (its deadline, its lane, its log entry)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from eu_audit.engines import Sampling
from eu_audit.errors import BadInput, RunFailed
from eu_audit.http import HttpFailure, HttpStatus
from eu_audit.jsonl import check_text
from eu_audit.serve.api import (
    FORWARDED,
    MAX_FUNCTION_NAME,
    UNASKED_COMPLETION_TOKENS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from eu_audit.serve.backend import Backend, Refused
from eu_audit.serve.chat_segments import (
    CALL_OPENING,
    call_opening,
    forced_call,
    offered_name,
    split_reply,
    still_naming,
)
from eu_audit.serve.fields import CHAT, COMPLETIONS, MESSAGES, RESPONSES, check_fields
from eu_audit.serve.reply_shape import call_shape, format_shape, hold
from eu_audit.serve.surface import _CLOSE, Call, Surface

#: the routes whose text is sent while it decodes (``serve.live``); completions send it whole
LIVE = (CHAT, RESPONSES, MESSAGES)


def _usage(prompt: int, cached: int | None, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def name_the_call(
    b: Backend, segs: list[list[int]], names: list[str], sampling: Sampling, call: Call, cap: int
) -> str:
    """``tool_choice: "required"``: the model writes the function's name after the call's opening,
    stopped as soon as it can no longer become an offered name; returns the offered function it began
    (``offered_name``), whose arguments the model then writes. What it began and what was named are
    logged (``named_call``)."""
    assert b.engine is not None
    tokenizer = b.engine.tokenizer
    opened = [*segs[:-1], segs[-1] + b.segments.encode(CALL_OPENING)]
    longest = max(len(b.segments.encode(n)) for n in names) + 2
    budget = b.budget(opened, longest, cap)

    def named_or_astray(tokens: Sequence[int]) -> bool:
        began = str(tokenizer.decode(list(tokens), skip_special_tokens=True))
        # cancellation only: the repetition guard is for the answer, and would stay tripped for it
        return call.cancelled() or not still_naming(began, names)

    ids, cached, _, _ = b.generate(opened, budget, sampling, named_or_astray, call.deadline, call.lane_name)
    began = str(tokenizer.decode(ids, skip_special_tokens=True)).split('"')[0]
    name = offered_name(began, names)
    # the request's first pass over its prompt: what it reused from before is counted here (the arguments'
    # pass then finds this pass's prefix in the cache, which the request itself prefilled)
    call.log["named_call"] = {"began": began[:MAX_FUNCTION_NAME], "named": name}
    call.cached_before = cached
    return name


class Routes(Surface):
    """The OpenAI-compatible model surface: body read under the size cap, validated, run in a worker thread
    under the request's deadline (cancelled when the client leaves), logged whatever happens."""

    async def _serve(
        self, request: Any, endpoint: str, handler: Callable[[bytes, Call], Any], lane: str = ""
    ) -> Any:
        """Run ``handler`` in a worker thread, watching the client; log the request whatever happens."""
        from fastapi.responses import JSONResponse

        t0 = time.perf_counter()
        handed_on = False  # a streamed answer's entry is logged when its stream ends
        call = Call(
            deadline=time.monotonic() + self.limits.request_timeout_s,
            stopping=self.stopping,
            guard=self.limits.repetition_guard,
            lane=self.lanes.get(lane),
        )
        self.backend.requests += 1
        status, error = 200, ""
        try:
            if call.lane is None:  # only the harness opens lanes (by marking them)
                call.log["path"] = str(request.url.path)[:300]
                raise Refused(404, f"no such lane: {request.url.path}")
            raw = await self._body(request, call.deadline)
            work = asyncio.ensure_future(asyncio.to_thread(handler, raw, call))
            while not work.done():
                await asyncio.wait({work}, timeout=0.05)  # a streamed answer's decoding is noticed at once
                if call.decoding.is_set() and endpoint in LIVE and not work.done():
                    handed_on = True  # streamed as it decodes; logged when the stream ends
                    return self._live(work, call, lane, t0, endpoint)
                if not work.done() and await _disconnected(request):
                    call.gone.set()
            result = work.result()
            if call.stream is not None:
                handed_on = True
                return self._streamed(endpoint, result, call, lane, t0)
            return result
        except asyncio.CancelledError:  # uvicorn gave up on the request (shutdown): stop decoding
            call.gone.set()
            status, error = 503, "cancelled by the server's shutdown"
            raise
        except Refused as exc:
            status, error = exc.status, exc.message
        except BadInput as exc:
            status, error = 400, exc.message
        except RunFailed as exc:
            status, error = 502, str(exc)
        except Exception as exc:  # a bug of ours: kept visible on stderr, a short message to the client
            import traceback

            traceback.print_exception(exc)
            status, error = 500, f"internal error ({type(exc).__name__})"
        finally:
            if not handed_on:
                self._log(call, endpoint, status, error, t0, lane)
        kind = "invalid_request_error" if status < 500 else "server_error"
        headers = _CLOSE if status in (400, 408, 413) else None  # a body half read: end the connection
        return JSONResponse({"error": {"message": error, "type": kind}}, status_code=status, headers=headers)

    def _log(self, call: Call, endpoint: str, status: int, error: str, t0: float, lane: str) -> None:
        self.log.add(
            mark=call.lane.mark if call.lane is not None else None,
            endpoint=endpoint,
            status=status,
            error=error,
            ms=round(1000 * (time.perf_counter() - t0), 1),
            lane=lane,
            **call.log,
        )

    def _live(self, work: asyncio.Future[Any], call: Call, lane: str, t0: float, endpoint: str) -> Any:
        """An answer streamed while it decodes (``eu_audit.serve.live``), logged when the stream ends."""
        from eu_audit.serve.live import live_response

        def log(status: int, error: str) -> None:
            self._log(call, endpoint, status, error, t0, lane)

        return live_response(self.backend, work, call, log, endpoint)

    def _streamed(self, endpoint: str, result: dict[str, Any], call: Call, lane: str, t0: float) -> Any:
        """The whole answer as server-sent events (``eu_audit.serve.stream``), logged when the stream ends
        with how many of its events were sent."""
        from eu_audit.serve.live import streamed_response

        def done(sent: int, total: int) -> None:
            call.log["streamed"] = {"events": total, "sent": sent}
            self._log(call, endpoint, 200, "" if sent == total else "the client left mid-stream", t0, lane)

        return streamed_response(endpoint, result, bool(call.stream), done)

    def _forward(self, path: str, req: BaseModel, sampling: Sampling, call: Call) -> dict[str, Any]:
        """Proxy mode: the upstream answers, under the pinned decoding, with only the allowed fields."""
        assert self.backend.upstream is not None
        given = req.model_dump(exclude_none=True, by_alias=True)
        body = {k: v for k, v in given.items() if k in FORWARDED[path]}
        if path != "/v1/embeddings":
            body["temperature"] = sampling.temperature
            if sampling.temperature > 0:
                body["seed"] = sampling.seed
        if why := self.backend.upstream.unsupported(path):
            raise Refused(400, why)
        timeout = max(1.0, call.deadline - time.monotonic())
        try:
            return self.backend.upstream.post(path, body, timeout)
        except HttpStatus as exc:
            raise Refused(502, f"the upstream answered HTTP {exc.status}") from None
        except HttpFailure as exc:
            raise Refused(502, f"the upstream failed ({type(exc).__name__})") from None

    async def chat(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/chat/completions", self._chat, lane)

    async def completions(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/completions", self._completions, lane)

    async def embeddings(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/embeddings", self._embeddings, lane)

    async def responses(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, RESPONSES, self._responses, lane)

    async def messages(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, MESSAGES, self._messages, lane)

    def _chat(self, raw: bytes, call: Call) -> dict[str, Any]:
        req: ChatRequest = self._parse(raw, ChatRequest, call)
        check_fields(CHAT, req.model_dump(exclude_unset=True, by_alias=True), upstream=self._proxy)
        call.stream = req.include_usage() if req.stream else None
        return self._answer_chat(req, call)

    @property
    def _proxy(self) -> bool:
        return self.backend.upstream is not None

    def _as_chat(self, endpoint: str, body: dict[str, Any]) -> ChatRequest:
        """Another API's request as the chat request it means: answered by the local model, or in proxy
        mode forwarded as that chat request to the upstream (an OpenAI-compatible endpoint, as
        ``--upstream`` requires) and its answer translated back."""
        try:
            return ChatRequest.model_validate(body)
        except ValidationError as exc:
            raise Refused(400, f"{endpoint}: {exc.errors()[0].get('msg')}") from None

    def _responses(self, raw: bytes, call: Call) -> dict[str, Any]:
        from eu_audit.serve import responses_api as api

        req: api.ResponsesRequest = self._parse(raw, api.ResponsesRequest, call)
        check_fields(RESPONSES, req.model_dump(exclude_unset=True))
        call.stream = True if req.stream else None  # the usage rides on the response objects
        lane = call.lane_name
        history = self.stored.get(lane, req.previous_response_id) if req.previous_response_id else []
        if req.previous_response_id:
            call.log["previous_response_id"] = req.previous_response_id
        chat = self._as_chat(RESPONSES, api.chat_of_request(req, history))
        call.opening = api.response_opening(req, self.backend.model_name)  # a live stream names these first
        resp = api.response_object(self._answer_chat(chat, call), req, call.opening["ids"])
        if req.store:
            said = [m.model_dump(exclude_none=True) for m in chat.messages]
            self.stored.put(lane, resp["id"], api.conversation_after(said, resp, bool(req.instructions)))
        return resp

    def _messages(self, raw: bytes, call: Call) -> dict[str, Any]:
        from eu_audit.serve import messages_api as api

        req: api.MessagesRequest = self._parse(raw, api.MessagesRequest, call)
        check_fields(MESSAGES, req.model_dump(exclude_unset=True))
        call.stream = True if req.stream else None
        call.opening = api.message_opening(self.backend.model_name)  # a live stream names its id first
        chat = self._as_chat(MESSAGES, api.chat_of_messages(req))
        return api.message_object(self._answer_chat(chat, call), call.opening["object"]["id"])

    def _answer_chat(self, req: ChatRequest, call: Call) -> dict[str, Any]:
        """A chat request answered (the one handler every chat-shaped API shares), as a chat.completion."""
        b = self.backend
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        _check_strings(messages)
        pin = call.lane.pin if call.lane is not None else self.pin
        sampling = pin.sampling(req.temperature, req.seed)
        call.log.update(
            messages=messages,
            tools=[str((t.get("function") or t).get("name", "?")) for t in req.tools or []],
            decoding=pin.facts(sampling),
        )
        if req.tools:
            call.log["tool_specs"] = req.tools
        if req.response_format is not None:
            call.log["response_format"] = req.response_format.model_dump(mode="json", by_alias=True)
        if b.upstream is not None:
            resp = self._forward("/v1/chat/completions", req, sampling, call)
            msg = (resp.get("choices") or [{}])[0].get("message") or {}
            call.log.update(reply=str(msg.get("content") or ""), tool_calls=msg.get("tool_calls") or [])
            call.log["usage"] = resp.get("usage") or {}
            return resp
        tools = None if req.tool_choice == "none" else req.tools
        try:
            name = forced_call(req.tool_choice, tools)
            segs = b.segments.render(messages, tools)
            call.log["prompt_digest"] = hashlib.sha256(json.dumps(segs).encode()).hexdigest()
        except BadInput as exc:
            raise Refused(400, str(exc)) from None
        except (AttributeError, TypeError) as exc:
            raise Refused(400, f"field 'tools': not OpenAI function specs ({exc})") from None
        if name == "":  # "required": which function, the model begins and serve holds it to an offered one
            name = name_the_call(b, segs, list(call.log["tools"]), sampling, call, self.limits.max_tokens)
        # a call the request asks for is opened for the model: its reply's first tokens are the call's
        forced = b.segments.encode(call_opening(name)) if name is not None else []
        if name is not None:
            segs[-1] = segs[-1] + forced
            call.log["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else name
        budget = b.budget(segs, req.wanted_tokens(), self.limits.max_tokens)
        shape = call_shape(name, tools or []) if name else format_shape(req.response_format, tools, call.log)
        try:
            constraint = hold(b.structured, shape, call.log)
        except BadInput as exc:
            raise Refused(400, str(exc)) from None
        call.prompt_tokens = sum(map(len, segs))
        ids, cached, prompt_n, finish = self._decode(segs, budget, sampling, constraint, bool(forced), call)
        body = forced + ids
        # a JSON reply is content, whatever keys it has; it never holds a call's markup
        as_json = constraint is not None and not name
        text, calls = (b.text_of(body), []) if as_json else split_reply(b.text_of(body))
        shown = "length" if finish == "repetition" else finish
        if req.parallel_tool_calls is False and len(calls) > 1:
            # one call, as asked; the ids hold every call the model wrote, so the echoed message is
            # rendered from its text instead of mapped back to them
            call.log["calls_dropped"] = len(calls) - 1
            calls = calls[:1]
        else:
            b.generations.remember(text, calls, body)
        if call.cached_before is not None:  # cached from before the request, not from its naming pass
            cached = min(cached, call.cached_before)
        usage = _usage(prompt_n, cached, len(b.decoded(ids, finish)))  # what it decoded, as OpenAI counts
        call.log.update(reply=text, tool_calls=calls, usage=usage, finish=finish)
        message = {"role": "assistant", "content": text or None, "tool_calls": calls or None}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else shown}
        return {
            "id": f"chatcmpl-{b.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": b.model_name,
            "choices": [choice],
            "usage": usage,
        }

    def _decode(
        self,
        segs: list[list[int]],
        budget: int,
        sampling: Sampling,
        constraint: Any,
        forced: bool,
        call: Call,
    ) -> tuple[list[int], int, int, str]:
        """(ids, cached, prompt tokens, finish) of a chat request: decoded, or the answer of an identical
        greedy request served before (``serve.reuse``; never one held to a format or a forced call)."""
        free = constraint is None and not forced
        reuse = self.reuse.key(segs, budget, sampling, call.guard) if free else None
        again = self.reuse.get(reuse)
        if again is not None:
            call.log["reused"] = True
            ids, prompt_n, finish = again
            return ids, prompt_n, prompt_n, call.finish(finish)
        stop_early = call.stop_early
        if call.stream is not None and free:  # streamed text: sent as it is decoded (serve.live)

            def stop_early(tokens: Sequence[int]) -> bool:
                call.live = list(tokens)
                return call.stop_early(tokens)

            call.decoding.set()
        ids, cached, prompt_n, finish = self.backend.generate(
            segs, budget, sampling, stop_early, call.deadline, call.lane_name, constraint
        )
        finish = call.finish(finish)  # raises where it did not end on its own terms: never kept
        self.reuse.put(reuse, (ids, prompt_n, finish))
        return ids, cached, prompt_n, finish

    def _prompt_segments(self, req: CompletionRequest) -> tuple[list[int], list[list[int]]]:
        prompt = req.prompt
        ids = (
            self.backend.segments.encode(check_text(prompt, "prompt")) if isinstance(prompt, str) else prompt
        )
        lengths = req.segments or [len(ids)]
        if sum(lengths) != len(ids) or any(n <= 0 for n in lengths):
            raise Refused(400, "field 'segments': positive lengths that add up to the prompt's tokens")
        segs, pos = [], 0
        for n in lengths:
            segs.append(ids[pos : pos + n])
            pos += n
        return ids, segs

    def _completions(self, raw: bytes, call: Call) -> dict[str, Any]:
        req: CompletionRequest = self._parse(raw, CompletionRequest, call)
        b = self.backend
        given = req.model_dump(exclude_unset=True, by_alias=True)
        check_fields(COMPLETIONS, given, upstream=b.upstream is not None)
        if req.stop_token_ids and b.upstream is None and (other := set(req.stop_token_ids) - set(b.stop_ids)):
            raise Refused(
                400,
                f"field 'stop_token_ids': serve stops only on the end-of-turn id {list(b.stop_ids)}, "
                f"not on {sorted(other)}",
            )
        call.stream = req.include_usage() if req.stream else None
        pin = call.lane.pin if call.lane is not None else self.pin
        sampling = pin.sampling(req.temperature, req.seed)
        call.log["decoding"] = pin.facts(sampling)
        if b.upstream is not None:
            if isinstance(req.prompt, str):
                check_text(req.prompt, "prompt")
            call.log["prompt_text"] = req.prompt if isinstance(req.prompt, str) else json.dumps(req.prompt)
            resp = self._forward("/v1/completions", req, sampling, call)
            call.log["reply"] = str((resp.get("choices") or [{}])[0].get("text", ""))
            return resp
        try:
            ids, segs = self._prompt_segments(req)
        except ValueError as exc:
            raise Refused(400, f"field 'prompt': {exc}") from None
        budget = b.budget(segs, req.max_tokens or UNASKED_COMPLETION_TOKENS, self.limits.max_tokens)
        call.log["prompt_text"] = b.text_of(ids)
        if (
            b.engine is not None and len(segs) > 1
        ):  # each segment with its chat markers: which role carried what
            call.log["segments"] = [b.engine.tokenizer.decode(seg, skip_special_tokens=False) for seg in segs]
        gen, cached, prompt_n, finish = b.generate(
            segs, budget, sampling, call.stop_early, call.deadline, call.lane_name
        )
        finish = call.finish(finish)
        stripped = b.decoded(gen, finish)
        text = b.text_of(stripped)
        usage = _usage(prompt_n, cached, len(stripped))
        call.log.update(reply=text, usage=usage, finish=finish)
        shown = "length" if finish == "repetition" else finish
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": shown}
        if req.return_token_ids:
            choice["token_ids"] = stripped
        return {
            "id": f"cmpl-{b.requests}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": b.model_name,
            "choices": [choice],
            "usage": usage,
        }

    def _embeddings(self, raw: bytes, call: Call) -> dict[str, Any]:
        req: EmbeddingRequest = self._parse(raw, EmbeddingRequest, call)
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        _check_strings(texts)
        call.log["input"] = texts
        if self.backend.upstream is not None:
            return self._forward("/v1/embeddings", req, Sampling(), call)
        from eu_audit.audits.embed import embed

        vectors = self.backend.compute(lambda: embed(texts), call.deadline)
        data = [
            {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
            for i, v in enumerate(vectors)
        ]
        return {"object": "list", "model": "all-MiniLM-L6-v2", "data": data, "usage": {"prompt_tokens": 0}}


def _check_strings(obj: Any) -> None:
    """Text UTF-8 cannot encode (a lone surrogate sent as an escape) is a bad request, not a crash later."""
    try:
        check_text(json.dumps(obj, ensure_ascii=False))
    except ValueError as exc:
        raise Refused(400, str(exc)) from None


async def _disconnected(request: Any) -> bool:
    try:
        return bool(await request.is_disconnected())
    except Exception:
        return False
