"""The ``hf`` engine: Hugging Face transformers with an explicit ``DynamicCache`` (batch 1, CPU or one
device), on the canonical schedule of ``eu_audit.engines.schedule``. The only engine that holds its cache
as tensors, so the one that can excise positions (B6) and write a KV sidecar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from eu_audit.engines.base import ENGINES, Abilities
from eu_audit.engines.schedule import LocalEngine
from eu_audit.errors import CropUnsupported, RunFailed
from eu_audit.models import LoadedModel, load_model

if TYPE_CHECKING:  # torch is imported where a tensor is made: listing engines or abilities never loads it
    import torch


@ENGINES.register("hf")
class HFEngine(LocalEngine):
    name = "hf"
    abilities: ClassVar[Abilities] = Abilities(exact=True, excise=True, kv_tensors=True)

    def __init__(self, loaded: LoadedModel) -> None:
        from transformers import DynamicCache

        if loaded.model is None:
            raise RunFailed("the engine needs a loaded model, not only its tokenizer")
        super().__init__(loaded)
        self.model = loaded.model
        self.device = next(self.model.parameters()).device
        self._cache_cls = DynamicCache
        self.cache = DynamicCache(config=self.model.config)
        self._check_croppable()

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

    def facts(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "library": f"torch {torch.__version__}, transformers {transformers.__version__}",
            "dtype": self.loaded.dtype,
            "device": str(self.device),
            "cache": "DynamicCache",
        }

    def sibling(self, id_slot: int | None = None) -> HFEngine:
        side = HFEngine(self.loaded)
        side.account = self.account
        return side

    # -- primitives ----------------------------------------------------------------------------------
    def _run(self, ids: Sequence[int]) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            inp = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
            out = self.model(input_ids=inp, cache=self.cache, use_cache=True, logits_to_keep=1)
            return out.logits[0, -1].float()

    def _drop(self, offset: int) -> None:
        self.cache.crop(offset - self.offset)  # transformers 5.x: a negative count of tokens to drop

    def _clear(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)

    # -- abilities -----------------------------------------------------------------------------------
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

    def excise(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Delete token positions from the middle of the cache, keeping every other position's KV as
        computed (span-only excision, the invalidation ablation). The kept keys still carry their old
        rotary positions while later tokens are placed by the shorter length: the state the model
        then reads is one no prefill of any text produces, which is the point of the ablation."""
        import torch

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


def bare_decode_loop(model: Any, ids: Sequence[int], max_tokens: int) -> tuple[list[int], float, float]:
    """A plain transformers greedy loop (no engine), for the benchmark: returns (ids, prefill s, decode s)."""
    import time

    import torch
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
