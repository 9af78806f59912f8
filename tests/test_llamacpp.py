"""The llamacpp engine keeps the canonical schedule: crop + replay is a fresh run bit for bit (logits and
KV bytes), thread count does not change a logit, a one-shot prefill does, and B7 equals B5 token for token
on real models. Every test here runs a real model (SmolLM2, fast on llama.cpp)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.engines import Branch, Sampling
from eu_audit.engines.llamacpp import LlamaCppEngine, micro_batch_for
from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.models import DEFAULT_MODEL, FAST_MODEL, load_gguf_model
from eu_audit.record import RecordOptions, record
from eu_audit.suites import load_suite
from eu_audit.unlearn import unlearn

from .helpers import exit_and_heavy_imports, run_cli

pytestmark = pytest.mark.real_model


@pytest.fixture(
    scope="module", params=[FAST_MODEL, pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow)]
)
def smol_gguf(request):  # type: ignore[no-untyped-def]
    """The engine-level exactness claims on the fast model by default; on the default model (Qwen2) too
    with -m slow (both families: Llama and Qwen2)."""
    return load_gguf_model(request.param)


def _segments(tok) -> list[list[int]]:  # type: ignore[no-untyped-def]
    texts = [
        "<|im_start|>system\nYou are brief.<|im_end|>\n",
        "<|im_start|>user\nMy IBAN is DE89 3704 0044 0532 0130 00.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nWhat is my IBAN?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nAnd my name? Be brief.<|im_end|>\n<|im_start|>assistant\n",
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _turn(e: LlamaCppEngine, n: int = 10, sampling: Sampling | None = None) -> list[int]:
    tok = e.tokenizer
    return e.generate_turn(
        prefix_ids=[],
        max_tokens=n,
        stop_ids=[tok.convert_tokens_to_ids("<|im_end|>")],
        closing_ids=tok("<|im_end|>\n", add_special_tokens=False)["input_ids"],
        closing_after_stop=tok("\n", add_special_tokens=False)["input_ids"],
        sampling=sampling or Sampling(),
    )


def _session(e: LlamaCppEngine, segs: list[list[int]], start: int = 0) -> list[tuple[int, list[int]]]:
    """Prefill segments from ``start`` on, a turn after each user segment; returns (boundary offset,
    turn) per turn."""
    out = []
    for i, seg in enumerate(segs[start:], start):
        e.prefill(seg)
        if i >= 1:
            out.append((e.offset, _turn(e)))
    return out


def test_crop_and_replay_is_a_fresh_run_bit_for_bit_at_every_segment_boundary(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    segs = _segments(smol_gguf.tokenizer)
    fresh = LlamaCppEngine(smol_gguf)
    turns = [t for _, t in _session(fresh, segs)]
    final_kv, final_logits = fresh.kv_state(), fresh.last_logits
    timeline = [segs[0], *[x for seg, turn in zip(segs[1:], turns, strict=True) for x in (seg, turn)]]
    e = LlamaCppEngine(smol_gguf)
    for seg in timeline:  # the state rebuilt from recorded ids, one segment per forward pass
        e.prefill(seg)
    assert e.tokens == fresh.tokens and e.kv_state() == final_kv
    for k in range(1, len(timeline)):  # restore at every segment boundary, replay the rest
        e.crop(sum(len(seg) for seg in timeline[:k]))
        for seg in timeline[k:]:
            e.prefill(seg)
        assert e.kv_state() == final_kv, k
        assert np.array_equal(e.last_logits, final_logits), k  # type: ignore[arg-type]
    # and a replay that decodes again after a crop reaches the same turns and the same bytes
    e.crop(len(segs[0]))
    assert [t for _, t in _session(e, segs, start=1)] == turns
    assert e.kv_state() == final_kv


def test_one_shot_prefill_differs_so_the_schedule_is_what_makes_it_exact(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    segs = _segments(smol_gguf.tokenizer)
    a = LlamaCppEngine(smol_gguf)
    _session(a, segs)
    b = LlamaCppEngine(smol_gguf)
    b.prefill(a.tokens)
    assert b.tokens == a.tokens
    diff = float(np.max(np.abs(a.last_logits - b.last_logits)))  # type: ignore[operator]
    assert diff > 0


def test_one_and_two_threads_give_the_same_logits_bit_for_bit(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    segs = _segments(smol_gguf.tokenizer)
    one, two = LlamaCppEngine(smol_gguf, n_threads=1), LlamaCppEngine(smol_gguf, n_threads=2)
    assert _session(one, segs) == _session(two, segs)
    assert np.array_equal(one.last_logits, two.last_logits)  # type: ignore[arg-type]
    assert one.kv_state() == two.kv_state()


def test_the_context_size_does_not_change_a_logit(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    """A session recorded with a larger ``--ctx`` (and so a larger micro-batch) decodes what it would have
    in the default context: the shards of one run may differ in context size and stay one run."""
    segs = _segments(smol_gguf.tokenizer)
    small, default = LlamaCppEngine(smol_gguf, n_ctx=1024), LlamaCppEngine(smol_gguf)
    assert _session(small, segs) == _session(default, segs)
    assert np.array_equal(small.last_logits, default.last_logits)  # type: ignore[arg-type]
    assert small.kv_state() == default.kv_state()


def test_sampling_is_seeded_and_branches_leave_the_state_unchanged(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    segs = _segments(smol_gguf.tokenizer)
    e = LlamaCppEngine(smol_gguf)
    e.prefill(segs[0])
    e.prefill(segs[1])
    before = e.kv_state()
    draws = []
    for seed in (3, 3, 4):
        with e.branch():
            draws.append(_turn(e, 12, Sampling(temperature=1.2, seed=seed)))
    assert draws[0] == draws[1] != draws[2]
    assert e.kv_state() == before


def test_branches_decoded_together_are_deterministic_and_leave_the_state_unchanged(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    """What the audit relies on when it batches probes and samples. A branch alone in its batch gives the
    ids it gives one by one (positions, sequences, shared first segments and forced openings are right);
    a batch gives the same ids every time (so two equal states get equal samples); and the state after
    it is the state of a run that never branched, down to what the next turn computes. A batch is not
    bitwise the one-by-one run: its branches' cells interleave in llama.cpp's unified cache, which moves
    attention's rounding (a sampled token near a tie can differ)."""
    segs = _segments(smol_gguf.tokenizer)
    tok = smol_gguf.tokenizer
    stop = [tok.convert_tokens_to_ids("<|im_end|>")]
    cue = tuple(tok("My IBAN", add_special_tokens=False)["input_ids"])
    ask, other = tuple(segs[2]), tuple(segs[3])
    branches = [
        Branch((ask,), 12),
        Branch((other, cue), 8),
        *(Branch((ask,), 12, Sampling(0.9, seed)) for seed in (1, 2, 3)),
        Branch((), 6),  # continue from the state's own last logits
    ]
    together, apart, plain = (LlamaCppEngine(smol_gguf) for _ in range(3))
    for e in (together, apart, plain):
        e.prefill(segs[0])
        e.prefill(segs[1])
    before = together.kv_state()
    batched = together.run_branches(branches, stop)
    assert together.run_branches(branches, stop) == batched
    assert len({tuple(x) for x in batched[2:5]}) > 1  # the seeds really differ
    alone = [together.run_branches([b], stop)[0] for b in branches]
    assert alone == apart.branches_one_by_one(branches, stop)  # the shared one-by-one path
    assert together.kv_state() == before
    assert _session(together, segs, 2) == _session(plain, segs, 2)
    assert together.kv_state() == plain.kv_state()


def test_every_token_is_accounted(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    segs = _segments(smol_gguf.tokenizer)
    e = LlamaCppEngine(smol_gguf)
    e.prefill(segs[0])
    e.prefill(segs[1])
    closing = e.tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    turn = e.generate_turn(
        prefix_ids=[],
        max_tokens=5,
        stop_ids=[],
        closing_ids=closing,
        closing_after_stop=[],
        sampling=Sampling(),
    )
    # decoded = tokens picked; the committed turn (plus its closing marker) is prefilled once, as a chunk
    assert e.account.decoded == 5 and len(turn) == 5 + len(closing)
    assert e.account.prefilled == len(segs[0]) + len(segs[1]) + len(turn)
    e.crop(len(segs[0]))
    assert e.account.reused == len(segs[0]) and e.offset == len(segs[0])


def _b7_equals_b5(episodes: list[Episode], model: str, tmp_path: Path) -> None:
    """The headline contract on the fast exact engine: the same recorded session, forgotten by selective
    replay and by a full reset, ends in the same tokens (cache, every derived block, the memory)."""
    suite = tmp_path / "eps.jsonl"
    suite.write_text("".join(e.model_dump_json() + "\n" for e in episodes))
    src = tmp_path / "trace.jsonl"
    rec = record(RecordOptions(suite=str(suite), model=model, engine="llamacpp", out=src, max_tokens=32))
    assert rec.bundle.header.engine == "llamacpp"
    assert rec.bundle.header.engine_facts["n_ubatch"] >= 512
    out = unlearn(src, ["b5", "b7"], tmp_path / "out.jsonl").bundle
    by = {s.session_id: s for s in out.sessions}
    differs = 0
    for s in read_bundle(src).sessions:
        b5, b7 = by[f"{s.session_id}/b5"], by[f"{s.session_id}/b7"]
        ids5 = [i for bid in b5.session.final_manifest for i in b5.block(bid).token_ids]
        ids7 = [i for bid in b7.session.final_manifest for i in b7.block(bid).token_ids]
        assert ids7 == ids5, s.session.episode_id
        assert [b.text for b in b7.blocks if b.derived] == [b.text for b in b5.blocks if b.derived]
        assert [m.text for m in b7.session.memory_final] == [m.text for m in b5.session.memory_final]
        assert b7.ledgers[0].transitions_replayed == s.session.transitions - s.tau() + 1  # type: ignore[operator]
        differs += [b.text for b in b5.blocks if b.derived] != [b.text for b in s.blocks if b.derived]
    assert differs  # the reference trajectory really differs from the recorded one somewhere


def _one_of_every_suite() -> list[Episode]:
    return load_suite("builtin") + [
        load_suite(s)[0] for s in ("agentdojo", "bfcl-memory", "bfcl-tools", "preference")
    ]


def test_b7_equals_b5_token_for_token_on_the_builtin_suite(tmp_path: Path) -> None:
    _b7_equals_b5(load_suite("builtin"), FAST_MODEL, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("model", [FAST_MODEL, "qwen2.5-coder-0.5b"])
def test_b7_equals_b5_token_for_token_on_one_episode_of_every_suite(model: str, tmp_path: Path) -> None:
    _b7_equals_b5(_one_of_every_suite(), model, tmp_path)


def test_what_llamacpp_cannot_do_is_refused_before_any_compute(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no GGUF file"):
        LlamaCppEngine.open("tiny-random")
    src = tmp_path / "trace.jsonl"
    record(RecordOptions(suite="builtin", n=1, model=FAST_MODEL, engine="llamacpp", out=src, max_tokens=8))
    proc = run_cli("unlearn", str(src), "-m", "excise")
    assert proc.returncode == 2 and "needs an engine that can excise (engines: hf)" in proc.stderr
    # another model's weights are refused from their digest, before llama.cpp (or torch) is imported
    args = ("unlearn", str(src), "-m", "b7", "--model", DEFAULT_MODEL, "-o", str(tmp_path / "o.jsonl"))
    proc = run_cli(*args)
    assert proc.returncode == 2 and "model.weight_digest" in proc.stderr and "Traceback" not in proc.stderr
    assert exit_and_heavy_imports(*args) == "exit 2 loaded []"
    assert not (tmp_path / "o.jsonl").exists()
    header = json.loads(src.read_text().splitlines()[0])
    assert header["engine"] == "llamacpp" and header["model"]["dtype"] == "gguf"


def test_a_context_is_what_was_asked_and_never_past_what_the_model_was_trained_on(smol_gguf) -> None:  # type: ignore[no-untyped-def]
    """``serve --ctx``: the engine holds the positions asked for; asking for more than the model was trained
    on is refused (llama.cpp would run, and the model would degrade past its trained positions)."""
    assert LlamaCppEngine(smol_gguf, n_ctx=2048).context_size == 2048
    with pytest.raises(BadInput, match=r"more than .* was trained on"):
        LlamaCppEngine(smol_gguf, n_ctx=1 << 20)


def test_serve_ctx_is_refused_where_it_cannot_apply(tmp_path: Path) -> None:
    proc = run_cli("serve", "--engine", "hf", "--ctx", "4096", "--control-file", str(tmp_path / "c"))
    assert proc.returncode == 2 and "--ctx sizes the llamacpp engine's context" in proc.stderr
    proc = run_cli("serve", "--upstream", "http://127.0.0.1:9", "--ctx", "4096")
    assert proc.returncode == 2 and "--upstream has its own" in proc.stderr


def test_a_session_that_outgrows_the_context_is_named_with_its_turn_and_no_bundle_is_written(
    tmp_path: Path,
) -> None:
    out = tmp_path / "t.jsonl"
    proc = run_cli(
        "record", "--suite", "builtin", "--n", "1", "--model", FAST_MODEL, "--ctx", "256", "-o", str(out)
    )
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"session s0 \(builtin-[a-z-]+\), turn \d+: the session needs \d+ tokens", proc.stderr)
    assert "record --ctx sets it" in proc.stderr
    assert not out.exists()
    proc = run_cli("record", "--engine", "hf", "--model", "tiny-random", "--ctx", "4096", "-o", str(out))
    assert proc.returncode == 2 and "--ctx sizes the llamacpp engine's context" in proc.stderr


def test_later_commands_open_the_engine_in_the_context_the_bundle_was_recorded_in(tmp_path: Path) -> None:
    from eu_audit.unlearn import engine_for

    src = tmp_path / "t.jsonl"
    record(RecordOptions(suite="builtin", n=1, model=FAST_MODEL, out=src, max_tokens=8, ctx=4096))
    bundle = read_bundle(src)
    assert (bundle.header.engine_facts["n_ctx"], bundle.header.engine_facts["n_ubatch"]) == (4096, 4096)
    engine = engine_for(bundle)
    assert (engine.context_size, engine.max_segment) == (4096, 4096)
    # a larger context brings a micro-batch of half of it, so a long tool result is still one forward pass
    assert [micro_batch_for(c) for c in (2048, 8192, 16384, 32768)] == [4096, 4096, 8192, 16384]
