"""What answers serve's requests: a KV engine under the canonical schedule (one model thread, a prefix
cache per lane) or an upstream endpoint (proxy mode)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from eu_audit.engines import KVEngine, Sampling
from eu_audit.engines.constraint import Constraint, StructuredOutput
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.serve.api import (
    LogMark,
)
from eu_audit.serve.chat_segments import (
    ChatSegments,
    Generations,
)
from eu_audit.serve.upstream import Upstream, UpstreamApi


class Refused(Exception):
    """A request answered with an error status (logged like any other)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class PinnedDecoding:
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

    pin: PinnedDecoding
    mark: LogMark | None = None
    name: str = ""  # "" for the root lane; the KV cache serve keeps for it goes by this name


@dataclass
class LaneCache:
    """One lane's KV cache in serve: its engine and the segments that engine holds canonically."""

    engine: KVEngine
    held: list[list[int]] = field(default_factory=list)


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
    upstream: Upstream | None = None
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


def open_backend(
    model: str, engine: str, upstream: str | None, ctx: int | None = None, upstream_api: UpstreamApi = "chat"
) -> Backend:
    if upstream:
        up = Upstream(upstream, upstream_api)
        return Backend(upstream=up, model_name=up.model_name(model))
    from eu_audit.engines import open_engine
    from eu_audit.engines.base import factory_of, resolve_engine

    options = factory_of(resolve_engine(engine, model)).context_options(ctx) if ctx is not None else {}
    worker = ThreadPoolExecutor(1, thread_name_prefix="model")  # the model's one thread, from its load on
    eng = worker.submit(open_engine, engine, model, **options).result()
    return Backend(
        engine=eng, model_name=eng.loaded.name, weight_digest=eng.loaded.weight_digest, worker=worker
    )
