"""The KV engine: the canonical schedule makes crop + replay bitwise identical to a fresh run."""

from __future__ import annotations

import pytest
import torch

from eu_audit.engines import Sampling
from eu_audit.engines.hf import HFEngine
from eu_audit.errors import CropUnsupported
from eu_audit.models import LoadedModel

from .helpers import kv_equal


def _segments(loaded: LoadedModel) -> list[list[int]]:
    tok = loaded.tokenizer
    texts = [
        "<|im_start|>system\nYou are brief.<|im_end|>\n",
        "<|im_start|>user\nMy IBAN is DE89 3704 0044 0532 0130 00.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWhat is my IBAN?<|im_end|>\n<|im_start|>assistant\n",
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _turn(engine: HFEngine, loaded: LoadedModel, sampling: Sampling | None = None, n: int = 12) -> list[int]:
    tok = loaded.tokenizer
    stop = [tok.convert_tokens_to_ids("<|im_end|>")]
    return engine.generate_turn(
        prefix_ids=[],
        max_tokens=n,
        stop_ids=stop,
        closing_ids=tok("<|im_end|>\n", add_special_tokens=False)["input_ids"],
        closing_after_stop=tok("\n", add_special_tokens=False)["input_ids"],
        sampling=sampling or Sampling(),
    )


def _session(engine: HFEngine, loaded: LoadedModel, segs: list[list[int]]) -> list[list[int]]:
    engine.prefill(segs[0])
    engine.prefill(segs[1])
    t1 = _turn(engine, loaded)
    engine.prefill(segs[2])
    t2 = _turn(engine, loaded)
    return [t1, t2]


@pytest.mark.parametrize("which", ["tiny", pytest.param("smol", marks=pytest.mark.real_model)])
def test_crop_and_replay_is_bitwise_identical_to_a_fresh_run(
    which: str, request: pytest.FixtureRequest
) -> None:
    loaded: LoadedModel = request.getfixturevalue(which)
    segs = _segments(loaded)
    a = HFEngine(loaded)
    turns = _session(a, loaded, segs)
    final = {k: v.clone() for k, v in a.kv_tensors().items()}
    # restore to the end of the first segment by a crop, replay the rest
    a.crop(len(segs[0]))
    assert _session_from_first(a, loaded, segs) == turns
    assert kv_equal(a.kv_tensors(), final)
    fresh = HFEngine(loaded)
    assert _session(fresh, loaded, segs) == turns
    assert kv_equal(fresh.kv_tensors(), final)


def _session_from_first(engine: HFEngine, loaded: LoadedModel, segs: list[list[int]]) -> list[list[int]]:
    engine.prefill(segs[1])
    t1 = _turn(engine, loaded)
    engine.prefill(segs[2])
    return [t1, _turn(engine, loaded)]


@pytest.mark.real_model
def test_one_shot_prefill_differs_which_is_why_the_schedule_exists(smol: LoadedModel) -> None:
    segs = _segments(smol)
    a = HFEngine(smol)
    turns = _session(a, smol, segs)
    b = HFEngine(smol)
    b.prefill([i for s in (segs[0], segs[1], turns[0], segs[2], turns[1]) for i in s])
    assert a.tokens == b.tokens
    # same tokens, other chunking: close (~1e-5) but not equal, so replay must follow the segment schedule
    diff = max(
        float((x - y).abs().max())
        for x, y in zip(a.kv_tensors().values(), b.kv_tensors().values(), strict=True)
    )
    assert 0 < diff < 1e-3


def test_branch_returns_to_the_same_state(tiny: LoadedModel) -> None:
    segs = _segments(tiny)
    e = HFEngine(tiny)
    e.prefill(segs[0])
    e.prefill(segs[1])
    before = {k: v.clone() for k, v in e.kv_tensors().items()}
    with e.branch():
        first = _turn(e, tiny)
        assert e.offset > sum(map(len, segs[:2]))
    with e.branch():
        second = _turn(e, tiny)
    assert first == second
    assert kv_equal(e.kv_tensors(), before)


def test_every_call_is_accounted(tiny: LoadedModel) -> None:
    segs = _segments(tiny)
    e = HFEngine(tiny)
    e.prefill(segs[0])
    e.prefill(segs[1])
    assert e.account.prefilled == len(segs[0]) + len(segs[1])
    turn = _turn(e, tiny, n=5)
    # decoded = tokens picked; the committed turn (plus its closing marker) is prefilled once
    assert e.account.decoded == 5
    assert e.account.prefilled == len(segs[0]) + len(segs[1]) + len(turn)
    e.crop(len(segs[0]))
    assert e.account.reused == len(segs[0])
    assert e.offset == len(segs[0])


def test_sampling_with_a_seed_is_reproducible_and_seeds_matter(tiny: LoadedModel) -> None:
    segs = _segments(tiny)
    e = HFEngine(tiny)
    e.prefill(segs[0])
    e.prefill(segs[1])
    draws = []
    for seed in (1, 1, 2):
        with e.branch():
            draws.append(_turn(e, tiny, Sampling(temperature=1.5, seed=seed), n=10))
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]


def test_sampling_without_a_seed_is_refused() -> None:
    with pytest.raises(ValueError, match="seed"):
        Sampling(temperature=0.7)


def test_models_with_sliding_window_layers_are_refused(tiny: LoadedModel) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
        layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    fake = LoadedModel(
        name="sliding",
        model=model,
        tokenizer=tiny.tokenizer,
        weight_digest="x",
        chat_template_digest="y",
        dtype="float32",
    )
    with pytest.raises(CropUnsupported, match="cannot be cropped exactly"):
        HFEngine(fake)
