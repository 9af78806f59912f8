"""What every route of serve stands on: a request's deadline and body, validation, lanes, the control
surface only the harness may use (with the secret), and status."""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from eu_audit import __version__
from eu_audit.jsonl import parse_line
from eu_audit.serve.api import (
    DecodingRequest,
    Limits,
    LogMark,
    MarkRequest,
)
from eu_audit.serve.backend import Backend, Lane, PinnedDecoding, Refused
from eu_audit.serve.control import CALL_HEADER, CONTROL_HEADER, DECODING_ROUTE, LOG_ROUTE, MARK_ROUTE, key_id
from eu_audit.serve.log import RequestLog
from eu_audit.serve.responses_api import Stored
from eu_audit.serve.reuse import AnswerReuse


def _validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "(body)"
    return f"field '{where}': {err.get('msg')}"


def runaway(tokens: Sequence[int], *, span: int = 48, max_period: int = 24) -> bool:
    """The last tokens are one short pattern over and over: at least ``span`` tokens (and six turns of the
    pattern) with a period of at most ``max_period``. Greedy decoding of a small model under a pinned
    temperature falls into such loops and would decode to the token cap; no answer needs them."""
    for period in range(1, max_period + 1):
        n = max(span, 6 * period)
        if len(tokens) < n:
            break
        tail = tokens[-n:]
        if all(tail[i] == tail[i % period] for i in range(n)):
            return True
    return False


@dataclass
class Call:
    """One request in flight: why it may stop early, and what the log says of it."""

    deadline: float
    stopping: threading.Event
    gone: threading.Event = field(default_factory=threading.Event)  # the client disconnected
    log: dict[str, Any] = field(default_factory=dict)

    guard: bool = True  # stop a loop no agent asked for (``runaway``)
    looped: bool = False
    lane: Lane | None = None  # where the call arrived (its mark and pinned decoding)
    #: prompt tokens the request's first pass found cached, where it makes two (a forced call's naming)
    cached_before: int | None = None
    #: ``stream: true``: whether a last chunk carries the usage (``stream_options.include_usage``)
    stream: bool | None = None
    #: set when a streamed chat request starts decoding text that may be sent as it comes (``serve.live``)
    decoding: threading.Event = field(default_factory=threading.Event)
    live: list[int] = field(default_factory=list)  # the tokens decoded so far, while ``decoding``
    #: what a streamed Responses or Messages answer opens with before its text is known (``serve.live``):
    #: the API object's ids and skeleton, set by the route before it decodes
    opening: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0  # the prompt's length, known before decoding (a Messages stream's first event)

    @property
    def lane_name(self) -> str:
        return self.lane.name if self.lane is not None else ""

    def cancelled(self) -> bool:
        return self.gone.is_set() or self.stopping.is_set() or time.monotonic() > self.deadline

    def stop_early(self, tokens: Sequence[int]) -> bool:
        """Checked after each decoded token: the request was cancelled, or it is repeating itself."""
        if self.cancelled():
            return True
        if self.guard and len(tokens) % 8 == 0 and runaway(tokens):
            self.looped = True
        return self.looped

    def finish(self, natural: str) -> str:
        """The finish reason: why decoding ended (a cut is never reported as a natural stop)."""
        if self.looped:
            return "repetition"
        if self.stopping.is_set():
            raise Refused(503, "the server is shutting down")
        if self.gone.is_set():
            raise Refused(499, "the client left; decoding stopped at its next token")
        if time.monotonic() > self.deadline:
            raise Refused(504, "decoding passed this request's deadline")
        return natural


#: sent with an answer given before the body was read whole: the connection ends with it
_CLOSE = {"Connection": "close"}


class Surface:
    """What every route stands on (the body under its deadline and size cap, validation, lanes), the
    control surface (the harness's marks, pinned decoding and log, with the secret), and status."""

    def __init__(
        self, backend: Backend, log: RequestLog, pin: PinnedDecoding, secret: str, limits: Limits
    ) -> None:
        self.backend, self.log, self.limits = backend, log, limits
        self.default_pin = PinnedDecoding(**pin.__dict__)  # what a new lane starts with
        self.lanes: dict[str, Lane] = {"": Lane(pin)}  # "" is the root lane
        self._lanes_lock = threading.Lock()
        self.secret, self.key = secret, key_id(secret)
        self.started = time.time()
        self.stopping = threading.Event()  # set on SIGTERM / SIGINT: in-flight decoding ends
        self.stored = Stored()  # the Responses API's stored responses (previous_response_id), per lane
        self.reuse = AnswerReuse(self.limits.reuse_answers)  # identical greedy requests answered once

    # -- plumbing ------------------------------------------------------------------------------
    async def _body(self, request: Any, deadline: float) -> bytes:
        """The request's body, under the size cap and the request's deadline: a body that drips in (a
        slow-loris client) is a 408 when the deadline passes, a client that leaves mid-body a 400."""
        declared = request.headers.get("content-length")
        cap = self.limits.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise Refused(413, f"the body is {int(declared)} bytes; this server takes at most {cap}")

        async def read() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise Refused(413, f"the body is over {cap} bytes, the most this server takes")
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(read(), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise Refused(408, "the body did not arrive within the request's deadline") from None
        except ClientDisconnect:
            raise Refused(400, "the client left before its body was whole") from None

    def _parse(self, raw: bytes, model: type[BaseModel], call: Call) -> Any:
        try:
            raw.decode("utf-8")  # strict: encoded surrogates and stray bytes are refused here
            obj = parse_line(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            call.log["body_excerpt"] = raw[:2000].decode("utf-8", errors="replace")
            raise Refused(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise Refused(400, "the body must be a JSON object")
        try:
            req = model.model_validate(obj)
        except ValidationError as exc:
            call.log["body_excerpt"] = raw[:2000].decode("utf-8", errors="replace")
            raise Refused(400, _validation_message(exc)) from None
        return req

    @property
    def pin(self) -> PinnedDecoding:
        """The root lane's pinned decoding."""
        return self.lanes[""].pin

    def lane(self, name: str) -> Lane:
        """The lane ``name``, made on the harness's first mark or pin for it."""
        with self._lanes_lock:
            if name not in self.lanes:
                self.lanes[name] = Lane(PinnedDecoding(**self.default_pin.__dict__), name=name)
            return self.lanes[name]

    def _controlled(self, request: Any) -> None:
        given = request.headers.get(CONTROL_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            raise Refused(403, f"the control surface needs the run's control secret in {CONTROL_HEADER}")

    async def _control(self, request: Any, endpoint: str, fn: Callable[[bytes], Any]) -> Any:
        """A control call: refused (403) without the secret; its body validated. Every control call is
        logged, refused or not, with the harness's number for it (``CALL_HEADER``) and the root lane's mark
        when it came: a control call the harness never made is someone else using the secret."""
        from fastapi.responses import JSONResponse

        status, error = 200, ""
        mark = self.lanes[""].mark
        try:
            self._controlled(request)
            return fn(await self._body(request, time.monotonic() + self.limits.request_timeout_s))
        except Refused as exc:
            status, error = exc.status, exc.message
            return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status, headers=_CLOSE)
        finally:
            number = request.headers.get(CALL_HEADER, "")[:40]
            self.log.add(
                mark=mark, endpoint=endpoint, status=status, error=error, control_call=number or None
            )

    async def unknown_route(self, request: Any, path: str) -> Any:
        """A route serve does not have: 404, logged with the path asked (a probe of the surface is counted
        as a tamper attempt when the run is audited)."""
        from fastapi.responses import JSONResponse

        asked = "/" + path[:200]
        self.log.add(
            mark=self.lanes[""].mark, endpoint="unknown", status=404, error="no such route", path=asked
        )
        return JSONResponse(
            {"error": {"message": f"no such route: {asked}"}}, status_code=404, headers=_CLOSE
        )

    # -- status --------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.backend.model_name, "requests": self.backend.requests}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.backend.model_name, "object": "model", "owned_by": "eu-audit"}],
        }

    def info(self) -> dict[str, Any]:
        eng = self.backend.engine
        return {
            "version": __version__,
            "model": self.backend.model_name,
            "weight_digest": self.backend.weight_digest,
            "engine": eng.name if eng else "upstream",
            "engine_facts": eng.facts()
            if eng
            else self.backend.upstream.facts()
            if self.backend.upstream
            else {},
            "control_key": self.key,
            "limits": self.limits.__dict__,
        }

    def progress(self) -> dict[str, Any]:
        return {
            "requests": self.backend.requests,
            "busy": self.backend.busy,
            "uptime_s": round(time.time() - self.started, 1),
        }

    # -- control (the harness only) ------------------------------------------------------------
    async def mark(self, request: Any) -> Any:
        def apply(raw: bytes) -> Any:
            req = self._parse(raw, MarkRequest, Call(0.0, self.stopping))
            lane = self.lane(req.lane or "")
            lane.mark = None if req.tag is None else LogMark(**req.tag.model_dump(), key=self.key)
            return {"mark": None if lane.mark is None else lane.mark.model_dump()}

        return await self._control(request, MARK_ROUTE, apply)

    async def decoding(self, request: Any) -> Any:
        def apply(raw: bytes) -> Any:
            req = self._parse(raw, DecodingRequest, Call(0.0, self.stopping))
            pin = self.lane(req.lane or "").pin
            pin.mode, pin.temperature, pin.seed = req.mode, req.temperature, req.seed
            return {"decoding": pin.__dict__}

        return await self._control(request, DECODING_ROUTE, apply)

    async def read_log(self, request: Any, since: int = 0) -> Any:
        def read(_: bytes) -> Any:
            entries = self.log.since(max(0, since))
            total = len(self.log.entries)
            return {
                "entries": entries,
                "next": max(0, since) + len(entries),
                "total": total,
                "digest": self.log.digest(),
            }

        return await self._control(request, LOG_ROUTE, read)

    # -- the OpenAI-compatible API -------------------------------------------------------------
