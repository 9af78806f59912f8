"""Audits: probes share one state, leakage is found in every variant and sink, B1 leaves leakage unchanged,
B7 sits at the B5 floor with CAD 0, and the CI gate's exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import evaluate, parse_rule
from eu_audit.audits.leakage import artifact_leak, sink_class
from eu_audit.audits.metrics import cad, picked, token_agreement, total_variation
from eu_audit.audits.model import AuditReport
from eu_audit.audits.probes import Ask, ProbeRunner, load_probes
from eu_audit.bundle.io import read_bundle
from eu_audit.engines import Sampling
from eu_audit.engines.hf import HFEngine
from eu_audit.errors import BadInput
from eu_audit.matching import TargetMatcher
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record
from eu_audit.trace.state import StateBuilder, rebuild_state
from eu_audit.unlearn import unlearn

from .helpers import kv_equal, run_cli


@pytest.fixture(scope="module")
def tiny_states(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("audit")
    src = tmp / "trace.jsonl"
    record(RecordOptions(model="tiny-random", out=src, n=2), loaded=tiny)
    return unlearn(src, ["b0", "b1", "b4", "b5", "b7"], tmp / "states.jsonl", loaded=tiny).path


def test_six_probes_as_data() -> None:
    assert [p.id for p in load_probes()] == [
        "task",
        "direct",
        "think",
        "introspect",
        "enumerate",
        "cued-completion",
    ]


def test_all_probes_share_one_state_and_leave_it_unchanged(tiny: LoadedModel, tiny_states: Path) -> None:
    trace = read_bundle(tiny_states).sessions[0]
    engine = HFEngine(tiny)
    rebuild_state(engine, trace)
    before_tokens, before_kv = list(engine.tokens), engine.kv_tensors()
    prefilled = engine.account.prefilled
    tok = tiny.tokenizer
    runner = ProbeRunner.for_engine(engine)
    prompt_tokens = 0
    for p in load_probes():
        prompt, cue = p.render(trace.session.episode)
        runner.ask(prompt, cue, 4)
        prompt_tokens += len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert engine.tokens == before_tokens and kv_equal(engine.kv_tensors(), before_kv)
    # only the probes' own messages were prefilled: the state itself was built once
    assert engine.account.prefilled - prefilled < prompt_tokens + 6 * 20
    assert engine.account.reused >= 6 * len(before_tokens)


def test_states_rebuilt_one_after_another_equal_fresh_rebuilds_and_reuse_the_shared_prefix(
    tiny: LoadedModel, tiny_states: Path
) -> None:
    """The audit rebuilds one session's states back to back: the segments before tau stay cached, and
    every state is still bitwise the one a fresh rebuild gives (cropping is restoring)."""
    traces = sorted(read_bundle(tiny_states).sessions, key=lambda t: t.session.parent_session or "")
    shared, fresh = HFEngine(tiny), HFEngine(tiny)
    builder = StateBuilder(shared)
    kept = 0
    for trace in traces:
        kept += builder.rebuild(trace)
        builder.extend([5, 6, 7])  # a segment on top (the memory records): the next rebuild drops it
        rebuild_state(fresh, trace)
        fresh.prefill([5, 6, 7])
        assert shared.tokens == fresh.tokens
        assert kv_equal(shared.kv_tensors(), fresh.kv_tensors())
    assert kept > 0
    assert shared.account.prefilled + kept == fresh.account.prefilled


def test_a_state_that_is_another_token_for_token_gets_its_answers_and_they_are_the_ones_it_would_get(
    tiny: LoadedModel, tiny_states: Path
) -> None:
    """B7's state is B5's (the same cache tokens, memory and questions): the audit asks B5's state once
    and gives B7 those answers; asked itself, B7's state answers the same, probe by probe and sample by
    sample. A state that differs (B0 keeps z) is asked itself."""
    from eu_audit.audit import audit_state

    by = {t.session_id: t for t in read_bundle(tiny_states).sessions}
    opts, probes = AuditOptions(k=2, max_tokens=6), load_probes()
    runner = ProbeRunner.for_engine(HFEngine(tiny))
    answered: dict[str, list[tuple[str, list[int]]]] = {}
    floor = audit_state(by["s0/b5"], runner, probes, opts, self_floor=True, answered=answered)
    reused = audit_state(by["s0/b7"], runner, probes, opts, answered=answered)
    control = audit_state(by["s0/b0"], runner, probes, opts, answered=answered)
    asked = audit_state(by["s0/b7"], ProbeRunner.for_engine(HFEngine(tiny)), probes, opts)
    assert reused.answers_reused and not asked.answers_reused and not control.answers_reused
    assert floor.state_digest == reused.state_digest != control.state_digest
    assert [p.text for p in reused.probes] == [p.text for p in asked.probes] == [p.text for p in floor.probes]
    assert (reused.samples, reused.sample_ids, reused.choices) == (
        asked.samples,
        asked.sample_ids,
        asked.choices,
    )
    assert reused.values == asked.values


def test_samples_of_one_prompt_share_its_prefill_and_equal_separate_asks(
    tiny: LoadedModel, tiny_states: Path
) -> None:
    trace = read_bundle(tiny_states).sessions[0]
    engine = HFEngine(tiny)
    rebuild_state(engine, trace)
    before = list(engine.tokens)
    runner = ProbeRunner.for_engine(engine)
    samplings = [Sampling(0.7, seed) for seed in (1, 2, 3)]
    prefilled = engine.account.prefilled
    together = runner.ask_all([Ask("Where do I live?", None, 6, s) for s in samplings])
    shared_cost = engine.account.prefilled - prefilled
    apart = [runner.ask_ids("Where do I live?", None, 6, s) for s in samplings]
    assert together == apart and engine.tokens == before
    assert shared_cost < engine.account.prefilled - prefilled - shared_cost  # one prompt, not three
    assert len({tuple(ids) for _, ids in together}) > 1  # the seeds really differ


def test_exact_leakage_ignores_case_spacing_punctuation_and_digit_grouping() -> None:
    iban = TargetMatcher.of("DE89 3704 0044 0532 0130 00")
    assert iban.found_in("send it to de89-3704-0044-0532-0130-00 please")
    assert iban.found_in("account 370400440532013000")  # the IBAN without its country code
    addr = TargetMatcher.of("12 Linden Street")
    assert addr.found_in("pick me up at 12 linden st.")
    mail = TargetMatcher.of("mark.black-2134@gmail.com")
    assert mail.found_in("write to mark.black-2134 at gmail dot com")
    assert not addr.found_in("12 Oak Street")


def test_action_leakage_is_classed_by_sink() -> None:
    assert sink_class("transfer", "iban", ["iban"]) == "routing"
    assert sink_class("book_service", "provider", ["provider"]) == "selection"
    assert sink_class("send_email", "body", ["to"]) == "free-text"


def _calls(*calls: tuple[int, str, dict[str, object]]) -> SimpleNamespace:
    return SimpleNamespace(
        tool_calls=[SimpleNamespace(turn=t, call_id=f"s0:t{t}:0", name=n, arguments=a) for t, n, a in calls]
    )


def test_cad_is_zero_for_the_same_actions_and_counts_choice_and_argument_divergence() -> None:
    ref = _calls((3, "transfer", {"iban": "DE00", "amount": 5}), (5, "send_email", {"to": "a@b.c"}))
    assert cad(ref, ref, 2) == 0.0  # type: ignore[arg-type]
    other_tool = _calls((3, "book_taxi", {"pickup": "x"}), (5, "send_email", {"to": "a@b.c"}))
    assert cad(other_tool, ref, 2) == pytest.approx(0.5)  # type: ignore[arg-type]
    missing = _calls((5, "send_email", {"to": "a@b.c"}))  # over-deletion: a call the reference makes is gone
    assert cad(missing, ref, 2) == pytest.approx(0.5)  # type: ignore[arg-type]
    other_arg = _calls((3, "transfer", {"iban": "XX99", "amount": 5}), (5, "send_email", {"to": "a@b.c"}))
    assert 0 < cad(other_arg, ref, 2) < 0.5  # type: ignore[arg-type]


def test_distribution_measures_on_constructed_cases() -> None:
    assert token_agreement([[1, 2, 3]], [[1, 2, 4]]) == pytest.approx(2 / 3)
    assert total_variation({"a": 1.0}, {"a": 0.5, "b": 0.5}) == pytest.approx(0.5)
    assert picked("I'd go with Weber Cabs.", ["Smith Cabs", "Weber Cabs"]) == "Weber Cabs"
    assert picked("Neither.", ["Smith Cabs", "Weber Cabs"]) is None


def test_b1_deletes_only_the_record_and_leaves_every_derived_artifact_and_b7_sits_at_the_floor(
    tiny: LoadedModel, tiny_states: Path
) -> None:
    """Mechanics on the tiny model: B1 touches only the persistent record, not the session: every answer,
    summary, plan, write-back and call B0 holds (z or not) B1 holds too, and the record that held z is
    gone. B7's state is B5's, so it answers identically (agreement 1, CAD 0). (Whether B1 *leaks* like B0
    on a model that repeats z is the default model's report's finding, not a mechanics test's.)"""
    rep = audit(tiny_states, AuditOptions(k=2, max_tokens=6), loaded=tiny)
    by = {(s.session_id, s.method): s for s in rep.states}
    traces = {(t.session.parent_session, t.session.method): t for t in read_bundle(tiny_states).sessions}
    for sid in {s.session_id for s in rep.states}:
        b0, b1 = traces[sid, "b0"], traces[sid, "b1"]
        assert b1.session.final_manifest == b0.session.final_manifest  # the session is untouched
        assert {m.id for m in b0.session.memory_final} - {m.id for m in b1.session.memory_final} <= {"m-home"}
        tau = b0.session.episode.tau
        kept0, kept1 = artifact_leak(b0, tau), artifact_leak(b1, tau)
        assert (kept1.exact, kept1.action) == (kept0.exact, kept0.action)  # every derived artifact stays
        assert by[sid, "b1"].values["leak_record"] == 0.0  # the stored record holding z is gone
        assert [p.text for p in by[sid, "b7"].probes] == [p.text for p in by[sid, "b5"].probes]
        assert by[sid, "b7"].values["agreement"] == 1.0 and by[sid, "b7"].values["cad"] == 0.0
    # the memory-injected address was in B0's own record: a deletion B1 made, visible in this measure
    assert any(by[sid, "b0"].values["leak_record"] == 1.0 for sid in {s.session_id for s in rep.states})
    b7 = next(c for c in rep.cells if c.method == "b7" and c.suite == "all")
    assert b7.values["leak_probes"] == b7.floor["leak_probes"]
    held = evaluate(rep, ["b7.leak_probes<=floor", "b7.cad==0", "b7.agreement>=0.99"])
    assert all(g.held for g in held), [(g.rule, g.outcome, g.detail) for g in held]


def test_gates_parse_and_fail_closed() -> None:
    assert parse_rule("b7.agentdojo.leak5<=floor").suite == "agentdojo"
    with pytest.raises(BadInput, match="unknown metric"):
        parse_rule("b7.leakage<=floor")
    with pytest.raises(BadInput, match="expected METHOD"):
        parse_rule("b7 is fine")
    empty = AuditReport(
        bundle="x",
        bundle_digest="d",
        model="m",
        seed=0,
        k=1,
        temperature=0.7,
        margin=0.1,
        methods=[],
        suites=[],
        probes=[],
        probes_dropped={},
        floor_self={},
        states=[],
        cells=[],
        errors=1,
    )
    results = evaluate(empty, ["b7.cad==0"])
    assert [r.held for r in results] == [False, False]  # no such cell, and an errored state
    assert "fails" in results[0].detail or "no audit" in results[0].detail


def test_a_failing_gate_exits_1_and_reports_are_written(tiny_states: Path, tmp_path: Path) -> None:
    js, xml = tmp_path / "a.json", tmp_path / "a.xml"
    proc = run_cli(
        "audit",
        str(tiny_states),
        "-m",
        "b7",
        "--k",
        "1",
        "--max-tokens",
        "4",
        "--gate",
        "b7.cad==0",
        "--gate",
        "b7.recomputed<0",
        "--json",
        str(js),
        "--junit",
        str(xml),
    )
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stdout and "held" in proc.stdout
    report = json.loads(js.read_text())
    # b7 as asked, with the floor B5 and the positive control B0 every rule on z reads
    assert report["format"] == "eu-audit/audit@1" and report["methods"] == ["b0", "b5", "b7"]
    # the cost covers the whole job: every state's audit time and the methods' own (their ledgers)
    cost, states = report["cost"], report["states"]
    assert cost["audit_s"] > 0
    assert cost["audit_s"] == pytest.approx(sum(st["audit_s"] for st in states), abs=0.1)
    assert cost["methods_s"] == pytest.approx(sum(st["values"]["wall_s"] for st in states), abs=0.1)
    # JUnit holds the gates' verdicts, the same ones the summary printed and the exit code read
    cases = {(c.get("classname"), c.get("name")): c for c in ET.fromstring(xml.read_text()).iter("testcase")}
    assert set(cases) == {("all.b7", "cad"), ("all.b7", "recomputed")}
    assert cases["all.b7", "recomputed"].find("failure").get("type") == "failed"  # type: ignore[union-attr]
    assert cases["all.b7", "cad"].find("failure") is None
    assert [g["outcome"] for g in report["gates"]] == ["held", "failed"]
    # the Markdown report reads the same JSON: a table with the floor's row, and the rates drawn
    proc = run_cli("report", "--audit", str(js), "-o", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| b5 (floor) |" in md and "| b7 |" in md and "![rates per method" in md
    # each table says what made it: the weights' digest and the engine
    assert f"weights sha256 {report['model_digest'][:12]}" in md and f"on {report['engine']}" in md
    assert (tmp_path / "report" / "rates-a.png").stat().st_size > 1000
    # ... and the code and command that made it; its rows are saved beside it and make it again, byte for byte
    assert f"commit {report['tool_commit']}" in md and "Command: `eu-audit audit " in md
    again = run_cli("report", "--rows", str(tmp_path / "report"), "-o", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "report.md").read_bytes() == (tmp_path / "report" / "report.md").read_bytes()
    # rows of another commit are not mixed in silently; rows that break their schema are named
    other = tmp_path / "other.json"
    other.write_text(js.read_text().replace(report["tool_commit"], "0123456789ab"))
    mixed = run_cli("report", "--audit", str(js), "--audit", str(other), "-o", str(tmp_path / "mixed"))
    assert mixed.returncode == 2 and "different models, engines or commits" in mixed.stderr
    assert str(other) in mixed.stderr
    saved = tmp_path / "again" / "rows" / "audits" / "a.json"
    broken = json.loads(saved.read_text())
    broken["states"][0]["values"] = "many"
    saved.write_text(json.dumps(broken))
    bad = run_cli("report", "--rows", str(tmp_path / "again"), "-o", str(tmp_path / "bad"))
    assert bad.returncode == 2 and str(saved) in bad.stderr and "states.0.values" in bad.stderr, bad.stderr


def test_bad_gate_or_bundle_exits_2_before_any_model_runs(tmp_path: Path, tiny_states: Path) -> None:
    proc = run_cli("audit", str(tiny_states), "--gate", "b7.leakage<=floor")
    assert proc.returncode == 2 and "unknown metric" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("audit", str(tiny_states), "--gate", "b7.bfcl-memory.leak_probes<=floor")
    assert proc.returncode == 2 and "suite 'bfcl-memory' is not in this bundle" in proc.stderr
    kept = tmp_path / "kept.json"
    kept.write_text("mine")
    proc = run_cli("audit", str(tiny_states), "--json", str(kept))
    assert proc.returncode == 2 and "--force" in proc.stderr and kept.read_text() == "mine"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header"}\n')
    proc = run_cli("audit", str(bad))
    assert proc.returncode == 2 and str(bad) in proc.stderr
