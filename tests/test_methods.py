"""Forget methods on the paper's terms: every method branches from the same contaminated state; B7
equals the B5 reference token for token; the baselines fail in the ways the paper describes."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import evaluate
from eu_audit.bundle.io import Bundle, SessionTrace
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.engines.hf import HFEngine
from eu_audit.episodes import Episode
from eu_audit.errors import BadInput
from eu_audit.methods import all_methods
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record
from eu_audit.runtime.memory import Outbox
from eu_audit.trace.state import StateBuilder, rebuild_state, segments
from eu_audit.unlearn import parse_methods, unlearn

from .helpers import kv_equal, record_and_unlearn


def _paying(tool_episode: Episode) -> Episode:
    """The IBAN episode with the transfer fully cued, so the consequential call surely happens."""
    steps = list(tool_episode.steps)
    steps[3] = steps[3].model_copy(
        update={
            "cue": '<tool_call>\n{"name": "transfer", "arguments": {"iban": "DE89 3704 0044 0532 0130 00", '
            '"amount": 950}}</tool_call>',
            "max_tokens": 1,
        }
    )
    return tool_episode.model_copy(update={"id": "paying", "steps": steps})


def _by(bundle: Bundle) -> dict[str, SessionTrace]:
    return {s.session_id: s for s in bundle.sessions}


def _cache_tokens(trace: SessionTrace) -> list[int]:
    blocks = {b.id: b for b in trace.blocks}
    return [i for bid in trace.session.final_manifest for i in blocks[bid].token_ids]


@pytest.mark.real_model
def test_b7_equals_b5_token_for_token_and_bit_for_bit(smol: LoadedModel, smol_all) -> None:  # type: ignore[no-untyped-def]
    _, recorded, out = smol_all
    by = _by(out)
    differs = 0
    for s in recorded.sessions:
        b5, b7 = by[f"{s.session_id}/b5"], by[f"{s.session_id}/b7"]
        assert _cache_tokens(b7) == _cache_tokens(b5)
        assert [b.text for b in b7.blocks if b.derived] == [b.text for b in b5.blocks if b.derived]
        assert [m.text for m in b7.session.memory_final] == [m.text for m in b5.session.memory_final]
        differs += [b.text for b in b5.blocks if b.derived] != [b.text for b in s.blocks if b.derived]
        # bit for bit: B7's cache reached as B7 reaches it, the contaminated state cropped where the two
        # share their leading segments and the rest prefilled, against B5's prefilled whole in a fresh
        # engine: equal tensors, so the crop leaves nothing of the suffix it dropped
        shared = 0
        for mine, ref in zip(segments(s), segments(b7), strict=False):
            if mine != ref:
                break
            shared += 1
        assert 0 < shared < len(segments(b7))  # a real crop: a kept prefix and a replayed suffix
        crop = StateBuilder(HFEngine(smol))
        crop.rebuild(s)
        assert crop.rebuild(b7) == sum(len(x) for x in segments(b7)[:shared])  # kept: the shared prefix
        fresh = HFEngine(smol)
        rebuild_state(fresh, b5)
        assert crop.engine.tokens == fresh.tokens
        assert kv_equal(crop.engine.kv_tensors(), fresh.kv_tensors())  # type: ignore[attr-defined]
    assert differs  # the reference trajectory really differs from the recorded one


@pytest.mark.real_model
def test_on_smollm2_b7_sits_at_the_b5_floor_and_b0_keeps_the_record(smol: LoadedModel, smol_all) -> None:  # type: ignore[no-untyped-def]
    src, _, _ = smol_all  # the built-in suite recorded on SmolLM2 with every method applied
    states = src.parent / "out.jsonl"
    rep = audit(states, AuditOptions(methods=("b0", "b1", "b7"), k=2, max_tokens=16), loaded=smol)
    assert {s.method for s in rep.states} == {"b0", "b1", "b5", "b7"}
    by = {(s.session_id, s.method): s for s in rep.states}
    assert rep.errors == 0
    for sid in ("s0", "s1"):
        # B7's state is B5's token for token (cache, memory, questions), so the audit gives it B5's answers
        # (tests/test_audit.py holds those equal to what the state answers when asked itself)
        assert by[sid, "b7"].answers_reused and by[sid, "b7"].state_digest == by[sid, "b5"].state_digest
        assert [p.text for p in by[sid, "b7"].probes] == [p.text for p in by[sid, "b5"].probes]
        assert by[sid, "b7"].samples == by[sid, "b5"].samples
        assert by[sid, "b7"].values["agreement"] == 1.0 and by[sid, "b7"].values["cad"] == 0.0
        assert by[sid, "b5"].values["leak_any"] == 0.0
    # the memory-injected address stays in B0's persistent store; B1 deletes exactly that record. The
    # record is the user's own, not a write-back: it is counted as leak_record, never in any-leak
    assert by["s0", "b0"].values["leak_record"] == 1.0 and by["s0", "b1"].values["leak_record"] == 0.0
    assert not any(p.leaked for p in by["s0", "b5"].probes)
    held = evaluate(rep, ["b7.leak_probes<=floor", "b7.leak_any<=floor", "b7.cad==0", "b7.agreement>=0.99"])
    assert all(g.held for g in held), held


@pytest.mark.real_model
def test_b7_replays_exactly_t_minus_tau_plus_one_transitions(smol_all) -> None:  # type: ignore[no-untyped-def]
    _, recorded, out = smol_all
    by = _by(out)
    for s in recorded.sessions:
        tau = s.graph().first_entry(s.session.source_id)
        ledger = by[f"{s.session_id}/b7"].ledgers[0]
        assert ledger.tau == tau
        assert ledger.transitions_replayed == s.session.transitions - tau + 1
        assert ledger.checkpoint_id is not None
        b5 = by[f"{s.session_id}/b5"].ledgers[0]
        assert b5.transitions_replayed == s.session.transitions
        assert ledger.tokens_prefilled + ledger.tokens_decoded < b5.tokens_prefilled + b5.tokens_decoded


@pytest.mark.real_model
def test_b1_leaves_every_derived_artifact_unchanged(smol_all) -> None:  # type: ignore[no-untyped-def]
    _, recorded, out = smol_all
    by = _by(out)
    for s in recorded.sessions:
        b0, b1 = by[f"{s.session_id}/b0"], by[f"{s.session_id}/b1"]
        assert [b.model_dump() for b in b1.blocks] == [b.model_dump() for b in b0.blocks]
        assert b1.session.final_manifest == b0.session.final_manifest
        assert [m for m in b1.session.memory_final if m.derived] == [
            m for m in b0.session.memory_final if m.derived
        ]
        # and the receipt says so: whatever B0 leaves in context, B1 leaves too
        ctx0 = {o.id for o in b0.receipts[0].occurrences if o.where == "context"}
        ctx1 = {o.id for o in b1.receipts[0].occurrences if o.where == "context"}
        assert ctx0 == ctx1


@pytest.mark.real_model
def test_b4_removes_exactly_the_taint_closure(smol_all) -> None:  # type: ignore[no-untyped-def]
    _, recorded, out = smol_all
    by = _by(out)
    for s in recorded.sessions:
        closure = s.graph().taint_closure(s.session.source_id)
        b4 = by[f"{s.session_id}/b4"]
        assert {b.id for b in b4.blocks} == {b.id for b in s.blocks} - closure
        assert not any(s.session.source_id in m.source_ids for m in b4.session.memory_final)
        assert b4.receipts[0].clean


@pytest.mark.real_model
def test_the_target_flowed_and_the_replayed_states_are_clean(smol_all) -> None:  # type: ignore[no-untyped-def]
    _, recorded, out = smol_all
    by = _by(out)
    leaked = [s for s in recorded.sessions if not by[f"{s.session_id}/b0"].receipts[0].clean]
    assert leaked, "on SmolLM2 the target should reach some derived state of the built-in suite"
    for s in recorded.sessions:
        for m in ("b5", "b7"):
            assert by[f"{s.session_id}/{m}"].receipts[0].clean, (s.session_id, m)


@pytest.fixture(scope="module")
def paying(smol: LoadedModel, builtin: list[Episode], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The IBAN episode with its transfer cued, on SmolLM2, with B0, B5, B7, B8 and B9 applied: one
    recording for the sink's claims below."""
    episode = next(e for e in builtin if e.id == "builtin-tool-iban")
    return record_and_unlearn(smol, tmp_path_factory.mktemp("paying"), [_paying(episode)], ["b0,b5,b7,b8,b9"])


@pytest.mark.real_model
def test_a_consequential_tool_fires_exactly_once_across_record_and_every_replay(
    smol: LoadedModel,
    paying,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    src, _, out = paying
    box = Outbox(src.with_name(src.name + ".state") / "outbox.sqlite")
    rows = box.rows("s0")
    assert [r[2] for r in rows] == ["transfer"]  # the real sink: one row
    again = unlearn(src, ["b7"], tmp_path / "again.jsonl", loaded=smol)  # one more replay, same sink
    assert box.rows("s0") == rows
    by = _by(out)
    for s in [by["s0/b5"], by["s0/b7"], *again.bundle.sessions]:
        call = next(c for c in s.tool_calls if c.name == "transfer" and c.turn == 4)
        assert call.status == "shadowed" and call.committed  # deduplicated against the recorded call id
        assert s.receipts[0].shadowed_calls >= 1
    box.close()


@pytest.mark.real_model
def test_b8_blocks_the_identifier_sink_carrying_z_and_keeps_z_in_free_text_and_state(
    paying,  # type: ignore[no-untyped-def]
) -> None:
    """B8 is IFC at the sinks (FIDES): from tau on, a call whose identifier argument carries z is blocked
    and never runs; nothing else changes, so z stays in the context. B0 pays the IBAN; B9 (the policy over
    B7's replay) never meets it. A B8 that silently became B0 (policy never applied) or B9 fails here."""
    from eu_audit.audits.leakage import artifact_leak

    _, _, out = paying
    by = _by(out)
    tau = by["s0/b0"].session.episode.tau
    pay = {m: next(c for c in by[f"s0/{m}"].tool_calls if c.turn == 4) for m in ("b0", "b8", "b9")}
    assert pay["b0"].status == "executed" and pay["b8"].status == "blocked" and pay["b8"].result is not None
    assert "routing" in artifact_leak(by["s0/b0"], tau).action  # B0's transfer carries the IBAN
    assert artifact_leak(by["s0/b8"], tau).action == {}  # B8's is blocked at the sink
    assert by["s0/b8"].session.sink_policy is not None and by["s0/b8"].ledgers[0].transitions_replayed > 0
    # nothing is sanitized: B8 re-enacts the observation at tau as recorded, z in it; B9's is o_tau without z
    m = by["s0/b8"].matcher()

    def observed_at_tau(method: str) -> str:
        return next(
            b.text for b in by[f"s0/{method}"].blocks if b.turn == tau and b.type.value == "tool_result"
        )

    assert m.found_in(observed_at_tau("b8")) and not m.found_in(observed_at_tau("b9"))


@pytest.mark.real_model
def test_matched_seeds_at_temperature_0_7_give_b7_equal_to_b5(
    smol: LoadedModel, memory_episode: Episode, tmp_path: Path
) -> None:
    _, _, out = record_and_unlearn(smol, tmp_path, [memory_episode], ["b5,b7"], temperature=0.7, seed=3)
    by = _by(out)
    assert _cache_tokens(by["s0/b7"]) == _cache_tokens(by["s0/b5"])
    assert [b.text for b in by["s0/b7"].blocks] == [b.text for b in by["s0/b5"].blocks]


@pytest.mark.slow  # 28 s; by default on the tiny model for every policy (test_agent, test_sweeps)
@pytest.mark.real_model
def test_b7_is_the_same_whatever_the_checkpoint_policy(
    smol: LoadedModel, memory_episode: Episode, tmp_path: Path
) -> None:
    results = {}
    for policy in CheckpointPolicy:
        d = tmp_path / policy.value
        d.mkdir()
        # no compaction here: a compaction after tau leaves only R_init in the cache to crop to
        ep = memory_episode.model_copy(
            update={"steps": [x for x in memory_episode.steps if x.kind != "compact"]}
        )
        _, _, out = record_and_unlearn(smol, d, [ep], ["b7"], checkpoint_policy=policy)
        s = out.sessions[0]
        results[policy] = (_cache_tokens(s), s.ledgers[0])
    tokens = {tuple(t) for t, _ in results.values()}
    assert len(tokens) == 1  # granularity is an efficiency knob only
    ledgers = {p: led for p, (_, led) in results.items()}
    assert len({led.transitions_replayed for led in ledgers.values()}) == 1
    # coarser checkpoints reuse less and prefill more, never decode more
    every, start = ledgers[CheckpointPolicy.every_turn], ledgers[CheckpointPolicy.session_start]
    assert every.tokens_reused > start.tokens_reused > 0
    assert every.tokens_prefilled < start.tokens_prefilled
    assert len({led.tokens_decoded for led in ledgers.values()}) == 1


@pytest.fixture(scope="module")
def tiny_all(
    tiny: LoadedModel, builtin: list[Episode], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Bundle, Bundle]:
    """The built-in suite on the tiny model with every method: mechanics only."""
    return record_and_unlearn(tiny, tmp_path_factory.mktemp("tiny_all"), builtin, ["all"])


def test_every_method_runs_and_the_input_is_never_modified(
    tiny: LoadedModel, tiny_all: tuple[Path, Bundle, Bundle]
) -> None:
    src, _, out = tiny_all
    tmp_path = src.parent
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert out.header.parent_digest == digest
    assert {s.session.method for s in out.sessions} == set(all_methods())
    for s in out.sessions:
        assert s.session.parent_session in ("s0", "s1") and len(s.ledgers) == 1 and len(s.receipts) == 1
    unlearn(src, ["b7"], tmp_path / "b7.jsonl", loaded=tiny)
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    shown = subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", "inspect", str(tmp_path / "out.jsonl"), "--session", "s0/b4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr


def test_method_lists_are_parsed_and_unknown_methods_refused() -> None:
    assert parse_methods(["b0,b7", "b7", "B5P"]) == ["b0", "b7", "b5p"]
    assert parse_methods(["all"]) == all_methods()
    with pytest.raises(BadInput, match="unknown method 'b42'"):
        parse_methods(["b42"])


@pytest.fixture(scope="module")
def tiny_bundle(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "trace.jsonl"
    record(RecordOptions(model="tiny-random", out=out), loaded=tiny)
    return out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--method", "b42"], "unknown method 'b42'"),
        (["--target", "Atlantis Avenue 9"], "does not occur in any observation"),
        (["--source", "src-nothing"], "does not exist"),
        (["--model", "smollm2-135m"], "model.weight_digest"),
    ],
)
def test_unlearn_mistakes_exit_2_naming_what_and_where(
    tiny_bundle: Path, args: list[str], needle: str, tmp_path: Path
) -> None:
    before = hashlib.sha256(tiny_bundle.read_bytes()).hexdigest()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "eu_audit.cli",
            "unlearn",
            str(tiny_bundle),
            *args,
            "-o",
            str(tmp_path / "o.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.jsonl").exists()
    assert hashlib.sha256(tiny_bundle.read_bytes()).hexdigest() == before


@pytest.mark.parametrize(
    ("request_args", "needle"),
    [({"target": "Atlantis Avenue 9"}, "does not occur"), ({"source": "src-nothing"}, "does not exist")],
)
def test_a_target_or_source_that_never_entered_is_refused_before_a_model_loads(
    tiny_bundle: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request_args: dict[str, str],
    needle: str,
) -> None:
    def no_model(*_: object, **__: object) -> None:
        raise AssertionError("a model was opened before the forget request was checked")

    monkeypatch.setattr("eu_audit.unlearn.engine_for", no_model)
    with pytest.raises(BadInput, match=needle):
        unlearn(tiny_bundle, ["b7"], tmp_path / "o.jsonl", **request_args)  # type: ignore[arg-type]


def test_unlearn_refuses_to_overwrite_its_input(tiny_bundle: Path) -> None:
    with pytest.raises(BadInput, match="overwrite the input"):
        unlearn(tiny_bundle, ["b7"], tiny_bundle)


def test_each_method_is_the_papers_definition_and_no_other(tiny_all: tuple[Path, Bundle, Bundle]) -> None:
    """One distinguishing property per method, so a method that silently became another one fails here:
    what it keeps, what it drops, what it regenerates and how many transitions it invokes."""
    from eu_audit.methods.baselines import FORGET_INSTRUCTION, REDACTED

    _, recorded, out = tiny_all
    by = _by(out)
    for s in recorded.sessions:
        sid, src, T = s.session_id, s.session.source_id, s.session.transitions
        g = s.graph()
        tau, closure = g.first_entry(src), g.taint_closure(src)
        entries = {b.id for b in g.entry_blocks(src)}
        z = s.matcher()
        ids = {m: [b.id for b in by[f"{sid}/{m}"].blocks] for m in all_methods()}
        replayed = {m: by[f"{sid}/{m}"].ledgers[0].transitions_replayed for m in all_methods()}
        recorded_ids = [b.id for b in s.blocks]
        # B0 keeps everything; B1 keeps every block and drops only the source's own memory record
        assert ids["b0"] == recorded_ids and replayed["b0"] == 0
        assert by[f"{sid}/b0"].session.memory_final == s.session.memory_final
        assert ids["b1"] == recorded_ids and replayed["b1"] == 0
        assert by[f"{sid}/b1"].session.memory_final == [
            m for m in s.session.memory_final if not (src in m.source_ids and not m.derived)
        ]
        # B2 is B0 plus one transition whose user turn asks to forget z
        b2 = by[f"{sid}/b2"]
        assert ids["b2"][: len(recorded_ids)] == recorded_ids and replayed["b2"] == 1
        ask = next(b for b in b2.blocks[len(recorded_ids) :] if b.type.value == "user")
        assert ask.text == FORGET_INSTRUCTION.format(z=s.session.target.value)
        # B3 drops only the entry blocks and keeps every derived artifact verbatim; B4 drops the closure
        assert set(ids["b3"]) == set(recorded_ids) - entries and entries
        assert set(ids["b4"]) == set(recorded_ids) - closure and closure > entries
        assert replayed["b3"] == replayed["b4"] == 0
        # B6 keeps every block and redacts z's strings wherever they were
        b6 = by[f"{sid}/b6"]
        assert ids["b6"] == recorded_ids and replayed["b6"] == 0
        assert not any(z.found_in(b.text) for b in b6.blocks) and any(REDACTED in b.text for b in b6.blocks)
        # excision keeps every block and only edits the entry blocks in the cache; derived text stays as is
        excised = by[f"{sid}/excise"]
        assert ids["excise"] == recorded_ids and replayed["excise"] == 0
        assert [b.text for b in excised.blocks if b.id not in entries] == [
            b.text for b in s.blocks if b.id not in entries
        ]
        # B5 re-runs all T transitions from R_init; B5' re-decodes them too but prefills less (a cached
        # clean prefix); B7 re-enacts exactly T - tau + 1 from a checkpoint
        led5, led5p = by[f"{sid}/b5"].ledgers[0], by[f"{sid}/b5p"].ledgers[0]
        assert replayed["b5"] == replayed["b5p"] == T and led5.checkpoint_id is None
        assert led5p.tokens_prefilled < led5.tokens_prefilled and led5p.tokens_decoded == led5.tokens_decoded
        assert replayed["b7"] == replayed["b8"] == replayed["b9"] == T - tau + 1
        assert by[f"{sid}/b7"].ledgers[0].checkpoint_id is not None
        # B8 re-enacts tau..T on the factual stream (z still observed at tau) under its sink policy; B9 on
        # the counterfactual one; B7 has no policy
        assert z.found_in(" ".join(b.text for b in by[f"{sid}/b8"].blocks if b.turn == tau))
        assert not z.found_in(" ".join(b.text for b in by[f"{sid}/b9"].blocks if b.turn == tau))
        assert by[f"{sid}/b8"].session.sink_policy and by[f"{sid}/b9"].session.sink_policy
        assert by[f"{sid}/b7"].session.sink_policy is None
