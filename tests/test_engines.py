"""Every engine keeps the canonical schedule, written once: an engine that claims exactness restores a
state by a crop and replays it to exactly the fresh run's turns and logits, and a new engine gets there
by implementing the primitives alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from eu_audit.engines import ENGINES, Abilities, Branch, KVEngine, LocalEngine, Sampling, open_engine
from eu_audit.models import FAST_MODEL, LoadedModel, load_model


class RecomputeEngine(LocalEngine):
    """A plug-in engine written from the primitives only: no cache at all, every forward pass runs the
    whole token list again. Slow, and exact by construction: the schedule layer does the rest."""

    name = "recompute"
    abilities: ClassVar[Abilities] = Abilities(exact=True)

    @classmethod
    def open(cls, model: str, *, dtype: str = "float32", loaded: LoadedModel | None = None, **_: Any) -> Any:
        return cls(loaded if loaded is not None and loaded.model is not None else load_model(model))

    def facts(self) -> dict[str, Any]:
        return {"library": "transformers, no cache"}

    def sibling(self, id_slot: int | None = None) -> RecomputeEngine:
        side = RecomputeEngine(self.loaded)
        side.account = self.account
        return side

    @torch.inference_mode()
    def _run(self, ids: Sequence[int]) -> torch.Tensor:
        assert self.loaded.model is not None
        whole = torch.tensor([[*self._tokens, *ids]], dtype=torch.long)
        return self.loaded.model(input_ids=whole, use_cache=False).logits[0, -1].float()

    def _drop(self, offset: int) -> None:
        pass  # nothing is cached: the token list the schedule keeps is the whole state

    def _clear(self) -> None:
        pass


if "recompute" not in ENGINES:
    ENGINES.add("recompute", RecomputeEngine)
EXACT = sorted(name for name, cls in ENGINES.items() if cls.abilities.exact)


@pytest.fixture(scope="module")
def smol_once() -> LoadedModel:
    return load_model(FAST_MODEL)


def _loaded(name: str, smol: LoadedModel, tiny: LoadedModel) -> LoadedModel | None:
    """llama.cpp loads its GGUF itself; the plug-in engine runs on the tiny model (it recomputes everything,
    so it is only a check of the mechanics); hf on the real model."""
    return {"llamacpp": None, "recompute": tiny}.get(name, smol)


def _segments(tok: Any) -> list[list[int]]:
    texts = [
        "<|im_start|>system\nYou are brief.<|im_end|>\n",
        "<|im_start|>user\nMy IBAN is DE89 3704 0044 0532 0130 00.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWhat is my IBAN?<|im_end|>\n<|im_start|>assistant\n",
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _turn(e: KVEngine, sampling: Sampling) -> list[int]:
    tok = e.tokenizer
    return e.generate_turn(
        prefix_ids=[],
        max_tokens=6,
        stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")],
        closing_ids=tok("<|im_end|>\n", add_special_tokens=False)["input_ids"],
        closing_after_stop=tok("\n", add_special_tokens=False)["input_ids"],
        sampling=sampling,
    )


def _logits(e: KVEngine, segment: Sequence[int]) -> np.ndarray:
    """The logits after one more segment, read through a branch (the state is unchanged after it)."""
    with e.branch():
        e.prefill(segment)
        return np.asarray(torch.as_tensor(e._last_logits))  # type: ignore[attr-defined]


@pytest.mark.real_model
@pytest.mark.parametrize("name", EXACT)
def test_every_exact_engine_crops_and_replays_to_the_fresh_run(
    name: str, smol_once: LoadedModel, tiny: LoadedModel
) -> None:
    sampled = Sampling(temperature=0.7, seed=3)
    fresh = open_engine(name, FAST_MODEL, loaded=_loaded(name, smol_once, tiny))
    segs = _segments(fresh.tokenizer)
    fresh.prefill(segs[0])
    fresh.prefill(segs[1])
    turns = [_turn(fresh, Sampling())]
    fresh.prefill(segs[2])
    turns.append(_turn(fresh, sampled))
    probe = _logits(fresh, segs[2])
    # restore to the end of the first segment, replay the same segments and decodes
    fresh.crop(len(segs[0]))
    fresh.prefill(segs[1])
    again = [_turn(fresh, Sampling())]
    fresh.prefill(segs[2])
    again.append(_turn(fresh, sampled))
    assert again == turns
    assert np.array_equal(_logits(fresh, segs[2]), probe)
    # branches (one by one, or batched where the engine can) agree and leave the state as it was
    before, stop = fresh.tokens, [fresh.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    outs = fresh.run_branches([Branch((tuple(segs[2]),), 4)] * 2, stop)
    assert outs[0] == outs[1] and len(outs[0]) >= 1
    assert fresh.tokens == before and np.array_equal(_logits(fresh, segs[2]), probe)


def test_an_engine_declares_its_abilities_and_methods_declare_what_they_need() -> None:
    from eu_audit.methods import METHODS
    from eu_audit.unlearn import check_engine, runs_on

    assert ENGINES.get("hf").abilities.excise and not ENGINES.get("llamacpp").abilities.excise
    assert ENGINES.get("llamacpp").abilities.batched_branches
    assert ENGINES.get("openai").abilities.concurrent_sessions and not ENGINES.get("openai").abilities.exact
    assert METHODS.get("excise").needs == {"excise"}
    assert runs_on("excise", "hf") and not runs_on("excise", "llamacpp") and runs_on("b7", "llamacpp")
    from eu_audit.errors import BadInput

    with pytest.raises(BadInput, match="needs an engine that can excise"):
        check_engine(["b7", "excise"], "llamacpp")


def test_an_engine_answers_whether_it_is_exact_and_how_to_reopen_a_recorded_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Verdicts ask the engine (``is_exact`` reads its ``Abilities``), and ``unlearn`` reopens a bundle's
    engine from the engine's own ``reopen_options``: no module outside the engines names one to decide."""
    from eu_audit.engines.base import factory_of, is_exact

    # ours, and this file's recompute engine (exact by its own declaration)
    assert [name for name in ENGINES.names() if is_exact(name)] == ["hf", "llamacpp", "recompute"]
    assert not is_exact("agent")  # a black-box run's engine is no engine of ours

    class Mine(LocalEngine):
        name = "mine-exact"
        abilities: ClassVar[Abilities] = Abilities(exact=True)

    monkeypatch.setitem(ENGINES._items, "mine-exact", Mine)
    assert is_exact("mine-exact") and factory_of("mine-exact").reopen_options({"n_ctx": 1}) == {}

    facts = {"n_ctx": "4096", "n_ubatch": 512, "threads": 2}
    assert factory_of("llamacpp").reopen_options(facts) == {"n_ctx": 4096, "n_ubatch": 512}
    monkeypatch.delenv("EU_AUDIT_SERVER", raising=False)
    served = factory_of("openai")
    assert served.reopen_options({"server": {"base_url": "http://a"}}) == {"server": "http://a"}
    assert served.reopen_options({"server": {"base_url": "http://a"}}, server="http://b") == {
        "server": "http://b"
    }
    monkeypatch.setenv("EU_AUDIT_SERVER", "http://c")
    assert served.reopen_options({"server": {"base_url": "http://a"}}) == {"server": "http://c"}
