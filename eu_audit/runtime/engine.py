"""The KV engine: prefill, decode, crop, branch — on an explicit cache, every token accounted.

Exactness rests on one rule, the *canonical schedule*: a position's KV values depend on how many
tokens shared its forward pass (measured: a one-shot prefill of a whole transcript differs from a
segment-wise one by 1e-5..7e-5). So the engine only ever materialises state one *segment* at a time:

* an observation (system prompt, memory, user message, tool result) is prefilled as one chunk;
* a model turn is decoded token by token and then *committed*: the engine crops back to the turn's
  start and prefills the finished turn as one chunk.

After every segment the cache therefore equals "each segment prefilled as one chunk, in order", a state
that depends only on the segment token ids. Cropping at a segment start and prefilling the same segments
again is bitwise identical to a fresh run, and a turn whose text is fixed can be re-materialised by one
prefill (what selective replay does for content fixed in the counterfactual world).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch

from eu_audit.errors import CropUnsupported, RunFailed
from eu_audit.registry import Registry
from eu_audit.runtime.models import LoadedModel, load_model


@dataclass
class TokenAccount:
    """Tokens run through the model, by kind; ``reused`` counts cached tokens kept by a restore."""

    prefilled: int = 0
    decoded: int = 0
    reused: int = 0
    forwards: int = 0

    def copy(self) -> TokenAccount:
        return TokenAccount(**{f.name: getattr(self, f.name) for f in fields(self)})

    def since(self, earlier: TokenAccount) -> TokenAccount:
        return TokenAccount(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


@dataclass(frozen=True)
class Sampling:
    """Greedy at temperature 0; otherwise sampling from softmax(logits / temperature) with ``seed``."""

    temperature: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.temperature > 0 and self.seed is None:
            raise ValueError("sampling needs an explicit seed (reproducibility is part of the contract)")


@dataclass(frozen=True)
class Branch:
    """One continuation of a state: segments prefilled one forward pass each (none: continue from the
    state's last logits), then up to ``max_tokens`` ids decoded under ``sampling``."""

    segments: tuple[tuple[int, ...], ...]
    max_tokens: int
    sampling: Sampling = Sampling()


class KVEngine(Protocol):
    """What the agent runtime, replay, methods and audits need from an engine. Kept narrow on purpose so
    that a served engine (where restore means re-sending the clean prefix) can implement it too.

    Every engine follows the canonical schedule (module docstring): ``prefill`` runs one segment as one
    chunk, ``generate_turn`` decodes token by token and commits the turn as one chunk, ``crop`` restores
    the state that held the first ``offset`` tokens."""

    name: str
    account: TokenAccount
    loaded: LoadedModel  # the model's identity (name, digests, dtype); ``.model`` is None off HF
    tokenizer: Any  # a Hugging Face tokenizer of the engine's model: text <-> ids

    @property
    def offset(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    def facts(self) -> dict[str, Any]:
        """What the engine's states depend on (library versions, threads, batch sizes, cache type):
        recorded in the bundle header, so a replay can tell it runs under the same conditions."""
        ...

    def reset(self) -> None: ...

    def prefill(self, ids: Sequence[int]) -> None: ...

    def decode(
        self,
        *,
        max_tokens: int,
        stop_ids: Sequence[int],
        sampling: Sampling,
        prefix_ids: Sequence[int] = (),
        stop_early: Callable[[Sequence[int]], bool] | None = None,
    ) -> list[int]: ...

    def generate_turn(
        self,
        *,
        prefix_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        closing_ids: Sequence[int],
        closing_after_stop: Sequence[int],
        sampling: Sampling,
    ) -> list[int]: ...

    def crop(self, offset: int) -> None: ...

    def branch(self) -> contextlib.AbstractContextManager[None]: ...

    def sibling(self) -> KVEngine:
        """A second, empty cache on the same model that accounts into this engine's account (isolated
        sub-tasks run there)."""
        ...


def run_branches(engine: KVEngine, branches: Sequence[Branch], stop_ids: Sequence[int]) -> list[list[int]]:
    """Every branch's decoded ids (a final stop id included); the state is unchanged afterwards. An
    engine with ``decode_branches`` decodes them together; any other runs them one by one, prefilling a
    first segment that consecutive branches share once (cropping back to it is restoring it)."""
    together = getattr(engine, "decode_branches", None)
    if together is not None:
        return list(together(branches, stop_ids=stop_ids))
    out: list[list[int]] = []
    i = 0
    while i < len(branches):
        first = branches[i].segments[:1]
        j = i
        while j < len(branches) and branches[j].segments[:1] == first:
            j += 1
        with engine.branch():
            for seg in first:
                engine.prefill(seg)
            for b in branches[i:j]:
                with engine.branch():
                    rest = b.segments[1:]
                    for seg in rest[:-1]:
                        engine.prefill(seg)
                    out.append(
                        engine.decode(
                            max_tokens=b.max_tokens,
                            stop_ids=stop_ids,
                            sampling=b.sampling,
                            prefix_ids=rest[-1] if rest else (),
                        )
                    )
        i = j
    return out


class EngineFactory(Protocol):
    def open(
        self, model: str, *, dtype: str, loaded: LoadedModel | None = None, **options: Any
    ) -> KVEngine: ...


#: engine name -> engine class; ``open_engine`` builds one on a model
ENGINES: Registry[Any] = Registry(
    "engines", builtins=("eu_audit.runtime.llamacpp", "eu_audit.runtime.served")
)
#: ``--engine auto``: llama.cpp for models shipped as GGUF (exact and faster), transformers otherwise
AUTO = "auto"


def resolve_engine(name: str, model: str) -> str:
    """The engine ``auto`` means for ``model``: ``llamacpp`` when the model has a GGUF file and the
    llama.cpp wheel is installed, else ``hf``. Any other name is returned as is (validated)."""
    if name != AUTO:
        ENGINES.get(name)
        return name
    import importlib.util

    from eu_audit.runtime.models import has_gguf, resolve_model

    if has_gguf(resolve_model(model)) and importlib.util.find_spec("ik_llama_cpp") is not None:
        return "llamacpp"
    return "hf"


def open_engine(
    name: str,
    model: str,
    *,
    dtype: str = "float32",
    loaded: LoadedModel | None = None,
    **options: Any,
) -> KVEngine:
    """The engine ``name`` (or ``auto``) on ``model`` (a registered name, a local directory or a .gguf
    file). ``loaded`` reuses a model already loaded; ``options`` go to the engine (``server=URL``)."""
    factory: EngineFactory = ENGINES.get(resolve_engine(name, model))
    return factory.open(model, dtype=dtype, loaded=loaded, **options)


@ENGINES.register("hf")
class HFEngine:
    """Hugging Face transformers with an explicit ``DynamicCache`` (batch 1, CPU or one device)."""

    name = "hf"

    def __init__(self, loaded: LoadedModel) -> None:
        from transformers import DynamicCache

        if loaded.model is None:
            raise RunFailed("the engine needs a loaded model, not only its tokenizer")
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = next(self.model.parameters()).device
        self._cache_cls = DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        self._check_croppable()
        self.account = TokenAccount()
        self._tokens: list[int] = []
        self._last_logits: torch.Tensor | None = None

    @classmethod
    def open(
        cls, model: str, *, dtype: str = "float32", loaded: LoadedModel | None = None, **options: Any
    ) -> HFEngine:
        if dtype == "gguf":
            dtype = "float32"  # a GGUF bundle replayed on transformers: the de-quantized weights
        if loaded is not None and loaded.model is None:
            loaded = None  # a tokenizer-only or llama.cpp load: transformers needs the weights
        return cls(loaded if loaded is not None else load_model(model, dtype=dtype))

    def _check_croppable(self) -> None:
        kinds = {type(layer).__name__ for layer in getattr(self.cache, "layers", [])}
        if kinds - {"DynamicLayer"}:
            raise CropUnsupported(
                f"model '{self.loaded.name}' has cache layers {sorted(kinds)}: sliding-window or recurrent "
                "layers cannot be cropped exactly, so checkpoints could not be restored by a crop"
            )

    # -- state ---------------------------------------------------------------------------------
    @property
    def offset(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self._tokens = []
        self._last_logits = None

    def facts(self) -> dict[str, Any]:
        import transformers

        return {
            "library": f"torch {torch.__version__}, transformers {transformers.__version__}",
            "dtype": self.loaded.dtype,
            "device": str(self.device),
            "cache": "DynamicCache",
        }

    def sibling(self) -> HFEngine:
        side = HFEngine(self.loaded)
        side.account = self.account
        return side

    def kv_tensors(self) -> dict[str, torch.Tensor]:
        """The cache as named tensors (for an optional safetensors sidecar)."""
        out = {}
        for i, layer in enumerate(self.cache.layers):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or values is None:
                continue  # a layer not yet written to
            out[f"layer{i}.keys"] = keys[0].contiguous().cpu()
            out[f"layer{i}.values"] = values[0].contiguous().cpu()
        return out

    # -- primitives ----------------------------------------------------------------------------
    @torch.inference_mode()
    def _forward(self, ids: Sequence[int]) -> torch.Tensor:
        inp = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=inp, cache=self.cache, use_cache=True, logits_to_keep=1)
        self._tokens.extend(ids)
        self.account.forwards += 1
        logits = out.logits[0, -1].float()
        self._last_logits = logits
        return logits

    def prefill(self, ids: Sequence[int]) -> None:
        """Run one segment through the model as a single chunk."""
        if not ids:
            return
        self._forward(ids)
        self.account.prefilled += len(ids)

    def _truncate(self, offset: int) -> None:
        if not 0 <= offset <= self.offset:
            raise ValueError(f"cannot crop to {offset}: the cache holds {self.offset} tokens")
        remove = offset - self.offset
        if remove:
            self.cache.crop(remove)  # transformers 5.x: a negative count of tokens to drop
            del self._tokens[offset:]
        self._last_logits = None  # logits belong to the dropped position; a prefill comes next

    def crop(self, offset: int) -> None:
        """Restore the state that held the first ``offset`` tokens (a segment start). O(1) in compute."""
        self._truncate(offset)
        self.account.reused += offset

    def excise(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Delete token positions from the middle of the cache, keeping every other position's KV as
        computed (span-only excision, the invalidation ablation). The kept keys still carry their old
        rotary positions while later tokens are placed by the shorter length: the state the model
        then reads is one no prefill of any text produces, which is the point of the ablation."""
        drop: set[int] = set()
        for a, b in ranges:
            drop.update(range(a, b))
        keep = torch.tensor([i for i in range(self.offset) if i not in drop], dtype=torch.long)
        for layer in self.cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or values is None:
                continue
            layer.keys = keys.index_select(-2, keep.to(keys.device))  # type: ignore[union-attr]
            layer.values = values.index_select(-2, keep.to(values.device))  # type: ignore[union-attr]
        self._tokens = [t for i, t in enumerate(self._tokens) if i not in drop]
        self._last_logits = None

    @contextlib.contextmanager
    def branch(self) -> Iterator[None]:
        """Run continuations from the current state, then come back to it by a crop."""
        start, logits = self.offset, self._last_logits
        try:
            yield
        finally:
            self._truncate(start)
            self._last_logits = logits
            self.account.reused += start

    def _pick(self, logits: torch.Tensor, sampling: Sampling, gen: torch.Generator | None) -> int:
        if sampling.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=gen))

    def decode(
        self,
        *,
        max_tokens: int,
        stop_ids: Sequence[int],
        sampling: Sampling,
        prefix_ids: Sequence[int] = (),
        stop_early: Callable[[Sequence[int]], bool] | None = None,
    ) -> list[int]:
        """Decode token by token after an optional forced prefix; returns the new ids (a final stop id
        included). The state is left token-by-token: call ``commit`` to make it canonical."""
        if prefix_ids:
            self.prefill(prefix_ids)
        logits = self._last_logits
        if logits is None:
            raise RunFailed("decode needs a prefilled segment first (the state ends at a crop point)")
        gen = None
        if sampling.temperature > 0:
            gen = torch.Generator().manual_seed(int(sampling.seed or 0))
        stops = set(stop_ids)
        out: list[int] = []
        for i in range(max_tokens):
            tok = self._pick(logits, sampling, gen)
            out.append(tok)
            if tok in stops or i == max_tokens - 1 or (stop_early is not None and stop_early(out)):
                break  # the last id is not fed here: commit feeds the whole turn
            logits = self._forward([tok])
        self.account.decoded += len(out)
        return out

    def commit(self, start: int, ids: Sequence[int]) -> None:
        """Make the turn canonical: crop to its start, prefill its ids as one chunk."""
        self._truncate(start)
        self._forward(ids)
        self.account.prefilled += len(ids)

    def generate_turn(
        self,
        *,
        prefix_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        closing_ids: Sequence[int],
        closing_after_stop: Sequence[int],
        sampling: Sampling,
    ) -> list[int]:
        """One model turn under the canonical schedule; returns the committed ids of the turn:
        forced prefix + generated ids + the closing marker the chat format needs."""
        start = self.offset
        gen = self.decode(max_tokens=max_tokens, stop_ids=stop_ids, sampling=sampling, prefix_ids=prefix_ids)
        ended = bool(gen) and gen[-1] in set(stop_ids)
        turn = [*prefix_ids, *gen, *(closing_after_stop if ended else closing_ids)]
        self.commit(start, turn)
        return turn


def bare_decode_loop(model: Any, ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float]:
    """A plain transformers greedy loop (no engine), for the benchmark: returns (ids, prefill s, decode s)."""
    import time

    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([list(ids)]), cache=cache, use_cache=True, logits_to_keep=1)
        t1 = time.perf_counter()
        toks: list[int] = []
        for i in range(max_tokens):
            tok = int(torch.argmax(out.logits[0, -1]))
            toks.append(tok)
            if i < max_tokens - 1:  # same number of forwards as the engine's decode
                out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True, logits_to_keep=1)
        t2 = time.perf_counter()
    return toks, t1 - t0, t2 - t1
