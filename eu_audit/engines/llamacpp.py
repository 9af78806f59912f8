"""The ``llamacpp`` engine: llama.cpp (the ik_llama.cpp fork, prebuilt wheel ``ik-llama-cpp-python``) on
the GGUF files eu-audit ships, under the same canonical schedule as the HF engine.

The schedule itself is ``eu_audit.engines.schedule``'s; this module is llama.cpp's primitives:

- one ``llama_decode`` per segment (an observation, a committed turn), with ``n_ubatch`` at least as
  large as any segment, so a segment is always one forward pass;
- a model turn is decoded token by token and then committed: the turn's positions are removed and the
  whole turn is decoded again as one chunk;
- restore is a sequence removal, ``llama_kv_cache_seq_rm(ctx, 0, offset, -1)``; its boolean result is
  checked, and a model whose memory cannot drop a partial sequence is refused.

Measured on this machine kind (bench/RESULTS.md, tests/test_llamacpp.py): crop + replay equals a fresh
run bitwise on logits and KV bytes at every segment boundary, 1 and 2 threads give bitwise the same
logits, and a one-shot prefill of the same tokens does not: the schedule is what makes it exact. The
state depends on the library, the thread count only through timing, the batch sizes and the KV type:
``facts()`` records them in the bundle header.

Tokenisation is the model's Hugging Face tokenizer (converted from the same GGUF), so token ids are the
ones the HF engine would use; llama.cpp only ever sees ids.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from eu_audit.engines.base import ENGINES, Abilities, Branch
from eu_audit.engines.schedule import LocalEngine, generator, pick
from eu_audit.errors import BadInput, CropUnsupported, RunFailed
from eu_audit.models import LoadedModel, gguf_digest_unloaded, load_gguf_model

WHEEL = "ik-llama-cpp-python"
DEFAULT_CTX = 8192
DEFAULT_UBATCH = 4096  # a segment longer than this would be split across forward passes: refused


def micro_batch_for(n_ctx: int) -> int:
    """The micro-batch a recording in a context of ``n_ctx`` tokens gets: half of it, as the default
    (8192 / 4096), never less than the default, so one long segment (a tool result) is still one forward
    pass. Neither size changes a logit (tests/test_llamacpp.py)."""
    return max(DEFAULT_UBATCH, n_ctx // 2)


BRANCH_SEQS = 24  # sequences per context: seq 0 holds the state, the others batched branches of it
GGML_TYPE_F16 = 1


def _threads() -> int:
    return int(os.environ.get("EU_AUDIT_THREADS", 0)) or max(1, os.cpu_count() or 1)


class _Lib:
    """The llama.cpp C API through the wheel's ctypes bindings, plus the calls the wheel leaves unbound
    (bound here by hand from the fork's llama.h)."""

    _instance: _Lib | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        try:
            from ik_llama_cpp import _ctypes_api as capi
        except ImportError as exc:
            raise BadInput(
                f"the llamacpp engine needs the '{WHEEL}' wheel (pip install '{WHEEL}==0.1.5'); "
                "or use --engine hf"
            ) from exc
        except OSError as exc:  # the shared library would not load (glibc too old, wrong CPU)
            raise RunFailed(f"llama.cpp's library would not load: {exc}; use --engine hf") from exc
        self.C = capi
        lib = capi._lib
        lib.llama_kv_cache_seq_rm.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
        lib.llama_kv_cache_seq_rm.restype = ctypes.c_bool
        lib.llama_state_seq_get_size.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32]
        lib.llama_state_seq_get_size.restype = ctypes.c_size_t
        lib.llama_state_seq_get_data.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint8),
            ctypes.c_size_t,
            ctypes.c_int32,
            ctypes.c_uint32,
        ]
        lib.llama_state_seq_get_data.restype = ctypes.c_size_t
        lib.llama_kv_cache_seq_cp.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_int32,
        ]
        lib.llama_kv_cache_seq_cp.restype = None
        lib.llama_vocab_n_tokens.argtypes = [ctypes.c_void_p]
        lib.llama_vocab_n_tokens.restype = ctypes.c_int32
        lib.llama_n_ctx_train.argtypes = [ctypes.c_void_p]
        lib.llama_n_ctx_train.restype = ctypes.c_int32
        # llama.cpp logs every load to stderr: keep the CLI's output readable
        self._quiet = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
            lambda level, text, data: None
        )
        lib.llama_log_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.llama_log_set(ctypes.cast(self._quiet, ctypes.c_void_p), None)
        self.lib = lib
        capi.llama_backend_init()
        self.models: dict[str, int] = {}

    @classmethod
    def get(cls) -> _Lib:
        with cls._lock:
            if cls._instance is None:
                cls._instance = _Lib()
            return cls._instance

    def model(self, gguf: Path) -> int:
        """One llama_model per GGUF file and process; contexts (engines) share its weights."""
        key = str(gguf)
        if key not in self.models:
            params = self.C.llama_model_default_params()
            params.n_gpu_layers = 0
            params.use_mmap = True
            handle = self.C.llama_model_load_from_file(key.encode(), params)
            if not handle:
                raise RunFailed(f"llama.cpp could not load the model file {gguf}")
            self.models[key] = handle
        return self.models[key]


def wheel_version() -> str:
    try:
        return version(WHEEL)
    except PackageNotFoundError:
        return "not installed"


@ENGINES.register("llamacpp")
class LlamaCppEngine(LocalEngine):
    """llama.cpp on one sequence (seq 0), batch 1, CPU; branches of the state (probes, samples) decode
    together on sequences 1.. (``run_branches``)."""

    name = "llamacpp"
    abilities: ClassVar[Abilities] = Abilities(exact=True, batched_branches=True)

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        n_ctx: int = DEFAULT_CTX,
        n_ubatch: int = DEFAULT_UBATCH,
        n_threads: int | None = None,
    ) -> None:
        gguf = loaded.extra.get("gguf")
        if gguf is None:
            raise BadInput(
                f"model '{loaded.name}' has no GGUF file: the llamacpp engine needs one (--engine hf)"
            )
        super().__init__(loaded)
        self.n_ctx, self.n_ubatch = n_ctx, min(n_ubatch, n_ctx)
        self.n_threads = n_threads or _threads()
        self._api = _Lib.get()
        self._model = self._api.model(Path(gguf))
        trained = int(self._api.lib.llama_n_ctx_train(self._model))
        if trained > 0 and n_ctx > trained:  # positions past training: llama.cpp runs, the model degrades
            raise BadInput(
                f"a context of {n_ctx} tokens is more than '{loaded.name}' was trained on ({trained})"
            )
        C = self._api.C
        params = C.llama_context_default_params()
        params.seed = 0
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = self.n_ubatch
        params.n_seq_max = BRANCH_SEQS
        params.n_threads = params.n_threads_batch = self.n_threads
        params.flash_attn = False  # the fork's flash attention asserts on some CPUs and shapes
        params.type_k = params.type_v = GGML_TYPE_F16
        self._ctx = C.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RunFailed(f"llama.cpp could not create a context of {n_ctx} tokens for '{loaded.name}'")
        vocab = C.llama_model_get_vocab(self._model)
        self.n_vocab = int(self._api.lib.llama_vocab_n_tokens(vocab))
        self._check_croppable()

    @classmethod
    def reopen_options(cls, facts: Mapping[str, Any], *, server: str | None = None) -> dict[str, Any]:
        """The context and micro-batch the run was recorded in (``record --ctx``)."""
        return {k: int(facts[k]) for k in ("n_ctx", "n_ubatch") if facts.get(k)}

    @classmethod
    def context_options(cls, n_ctx: int) -> dict[str, Any]:
        return {"n_ctx": n_ctx, "n_ubatch": micro_batch_for(n_ctx)}

    @classmethod
    def weights_digest_unloaded(cls, model: str) -> str | None:
        return gguf_digest_unloaded(model)

    @classmethod
    def open(
        cls, model: str, *, dtype: str = "gguf", loaded: LoadedModel | None = None, **options: Any
    ) -> LlamaCppEngine:
        if loaded is not None and loaded.extra.get("gguf") is None:
            loaded = None  # an HF load of the same model: the GGUF is still needed
        n_ctx = int(options.get("n_ctx") or DEFAULT_CTX)
        n_ubatch = int(options.get("n_ubatch") or DEFAULT_UBATCH)
        return cls(loaded if loaded is not None else load_gguf_model(model), n_ctx=n_ctx, n_ubatch=n_ubatch)

    def __del__(self) -> None:
        ctx = getattr(self, "_ctx", None)
        if ctx:
            try:  # noqa: SIM105  (plain try: at interpreter exit contextlib may already be gone)
                self._api.C.llama_free(ctx)
            except Exception:
                pass
            self._ctx = None

    def _check_croppable(self) -> None:
        """A partial sequence removal must work (recurrent or hybrid memories refuse it)."""
        bos = [int(self.tokenizer.eos_token_id or 0)] * 2
        self._forward(bos)
        ok = bool(self._api.lib.llama_kv_cache_seq_rm(self._ctx, 0, 1, -1))
        self.reset()
        if not ok:
            raise CropUnsupported(
                f"model '{self.loaded.name}': llama.cpp cannot remove part of a sequence from its memory "
                "(recurrent or hybrid layers), so checkpoints could not be restored by a crop"
            )

    # -- state ---------------------------------------------------------------------------------
    @property
    def context_size(self) -> int:
        return self.n_ctx

    @property
    def max_segment(self) -> int | None:
        return self.n_ubatch

    @property
    def vocab_size(self) -> int:
        return self.n_vocab

    def facts(self) -> dict[str, Any]:
        return {
            "library": f"{WHEEL} {wheel_version()} (ik_llama.cpp)",
            "threads": self.n_threads,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_ctx,
            "n_ubatch": self.n_ubatch,
            "kv_type": "f16",
            "flash_attn": False,
            "weights": "GGUF as shipped",
        }

    def sibling(self, id_slot: int | None = None) -> LlamaCppEngine:
        side = LlamaCppEngine(self.loaded, n_ctx=self.n_ctx, n_ubatch=self.n_ubatch, n_threads=self.n_threads)
        side.account = self.account
        return side

    def kv_state(self) -> bytes:
        """The sequence's KV cache as llama.cpp serialises it (for exactness checks; opaque bytes)."""
        lib = self._api.lib
        size = lib.llama_state_seq_get_size(self._ctx, 0, 0)
        buf = (ctypes.c_uint8 * size)()
        n = lib.llama_state_seq_get_data(self._ctx, buf, size, 0, 0)
        return bytes(buf[:n])

    @property
    def last_logits(self) -> np.ndarray | None:
        return None if self._last_logits is None else np.array(self._last_logits, copy=True)

    # -- primitives ----------------------------------------------------------------------------
    def _run(self, ids: Sequence[int]) -> np.ndarray:
        n = len(ids)
        if self.offset + n > self.n_ctx:
            raise RunFailed(
                f"the session needs {self.offset + n} tokens, more than the engine's context of {self.n_ctx} "
                "(record --ctx sets it; later commands use the bundle's)"
            )
        items = [(int(t), self.offset + i, 0, i == n - 1) for i, t in enumerate(ids)]
        return self._llama_decode(items, f"at position {self.offset}")[0]

    def _drop(self, offset: int) -> None:
        if not self._api.lib.llama_kv_cache_seq_rm(self._ctx, 0, offset, -1):
            raise CropUnsupported(f"llama.cpp refused to remove positions {offset}.. of the sequence")

    def _clear(self) -> None:
        self._api.C.llama_kv_cache_clear(self._ctx)

    def _llama_decode(self, items: Sequence[tuple[int, int, int, bool]], where: str) -> list[np.ndarray]:
        """One ``llama_decode`` of (token, position, sequence, wants logits) items; returns the logits
        asked for, in order. The caller accounts the forward pass."""
        n = len(items)
        if n > self.n_ubatch:
            raise RunFailed(
                f"a segment of {n} tokens exceeds the engine's micro-batch ({self.n_ubatch}): it would be "
                "split across forward passes, off the canonical schedule (record --ctx 2N gives a "
                "micro-batch of N)"
            )
        C = self._api.C
        batch = C.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, (tok, pos, seq, want) in enumerate(items):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 1 if want else 0
            rc = C.llama_decode(self._ctx, batch)
        finally:
            C.llama_batch_free(batch)
        if rc != 0:
            raise RunFailed(f"llama_decode failed (code {rc}) {where}")
        return [
            np.ctypeslib.as_array(C.llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,)).copy()
            for i, item in enumerate(items)
            if item[3]
        ]

    # -- branches decoded together -------------------------------------------------------------
    def run_branches(self, branches: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]:
        """Continuations of the current state, each on its own sequence, decoded as one batch per step
        (one token of every unfinished branch per ``llama_decode``). Segments keep the canonical
        schedule: each is one forward pass on its branch's sequence, and a first segment that branches
        share is prefilled once and copied (``llama_kv_cache_seq_cp``, which shares cells). The state
        (seq 0) is untouched; the branches' sequences are removed at the end. Returns the decoded ids
        of each branch, as ``decode`` would (a final stop id included)."""
        out: list[list[int]] = []
        group: list[Branch] = []
        room, used = self.n_ctx - self.offset, 0  # cache cells past the state, and the group's share
        for b in branches:
            need = sum(len(s) for s in b.segments) + b.max_tokens
            if need > room:
                raise RunFailed(f"a branch needs {need} tokens past the state's {self.offset}: beyond n_ctx")
            if group and (len(group) == BRANCH_SEQS - 1 or used + need > room):
                out += self._decode_group(group, stop_ids)
                group, used = [], 0
            group.append(b)
            used += need
        if group:
            out += self._decode_group(group, stop_ids)
        return out

    def _segment(self, ids: Sequence[int], pos: int, seq: int) -> np.ndarray:
        """One segment on one branch sequence as a single forward pass; the logits of its last id."""
        n = len(ids)
        items = [(int(t), pos + i, seq, i == n - 1) for i, t in enumerate(ids)]
        logits = self._llama_decode(items, f"on a branch segment at position {pos}")[0]
        self.account.forwards += 1
        self.account.prefilled += n
        return logits

    def _decode_group(self, group: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]:
        lib, start = self._api.lib, self.offset
        seqs = list(range(1, len(group) + 1))
        pos = [start] * len(group)
        logits: list[np.ndarray | None] = [self._last_logits] * len(group)
        try:
            for seq in seqs:
                lib.llama_kv_cache_seq_cp(self._ctx, 0, seq, 0, start)
            self.account.reused += start * len(group)
            # a first segment already computed on another branch's sequence -> (that sequence, its logits)
            firsts: dict[tuple[int, ...], tuple[int, np.ndarray]] = {}
            for i, b in enumerate(group):
                for r, seg in enumerate(b.segments):
                    if not seg:
                        continue
                    if r == 0 and seg in firsts:  # the same segment at the same position: share its cells
                        lead, logits[i] = firsts[seg]
                        lib.llama_kv_cache_seq_cp(self._ctx, lead, seqs[i], start, start + len(seg))
                    else:
                        logits[i] = lg = self._segment(seg, pos[i], seqs[i])
                        if r == 0:
                            firsts[seg] = (seqs[i], lg)
                    pos[i] += len(seg)
            outs = self._decode_steps(group, seqs, pos, logits, set(stop_ids))
        finally:
            for seq in seqs:
                lib.llama_kv_cache_seq_rm(self._ctx, seq, -1, -1)
        return outs

    def _decode_steps(
        self,
        group: Sequence[Branch],
        seqs: Sequence[int],
        pos: list[int],
        logits: list[np.ndarray | None],
        stops: set[int],
    ) -> list[list[int]]:
        gens = [generator(b.sampling) for b in group]
        outs: list[list[int]] = [[] for _ in group]
        active = [i for i, b in enumerate(group) if b.max_tokens > 0]
        while active:
            feed = []
            for i in active:
                lg = logits[i]
                if lg is None:
                    raise RunFailed("a branch needs a prefilled segment first (the state ends at a crop)")
                tok = pick(lg, group[i].sampling, gens[i])
                outs[i].append(tok)
                if tok not in stops and len(outs[i]) < group[i].max_tokens:
                    feed.append(i)  # the last id is not fed, as in decode
            if not feed:
                break
            items = [(outs[i][-1], pos[i], seqs[i], True) for i in feed]
            fresh = self._llama_decode(items, f"on a batch of {len(feed)} branch tokens")
            self.account.forwards += 1
            for i, lg in zip(feed, fresh, strict=True):
                logits[i] = lg
                pos[i] += 1
            active = feed
        self.account.decoded += sum(len(o) for o in outs)
        return outs


def bare_generate(
    engine: LlamaCppEngine, ids: Sequence[int], max_tokens: int
) -> tuple[list[int], float, float]:
    """llama.cpp's own greedy loop on the same wheel (no eu-audit schedule, no accounting), for the
    benchmark: one prompt batch, then one token per llama_decode. Returns (ids, prefill s, decode s)."""
    import time

    engine.reset()
    t0 = time.perf_counter()
    logits = engine._forward(ids)
    t1 = time.perf_counter()
    out: list[int] = []
    for i in range(max_tokens):
        tok = int(np.argmax(logits))
        out.append(tok)
        if i < max_tokens - 1:
            logits = engine._forward([tok])
    t2 = time.perf_counter()
    engine.reset()
    return out, t1 - t0, t2 - t1
