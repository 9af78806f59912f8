"""The floor eu-audit trusts is eu-audit's: what the reference tenant (B5, never fed z) answers is read, and
z there that its model never wrote is a finding that fails the gate. An agent that says z to its reference
lifts the floor its own answers are measured against; it must fail, never hold nor read insensitive."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import TAMPER_RULE, evaluate, exit_code, expand_gate_sets
from eu_audit.audits.model import read_report
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.blackbox.tamper import TamperEvidence, check_reference_answers
from eu_audit.bundle.io import read_bundle


def test_an_agent_that_says_z_in_its_references_answers_fails_on_the_finding(tmp_path: Path) -> None:
    out = tmp_path / "lifter.jsonl"
    record_agent(
        AgentRecordOptions(agent="tests.scripted_agents:floor_lifter", suite="builtin", n=2, out=out)
    )
    rep = audit(out, AuditOptions())
    found = [t for t in rep.tampering if t.kind == "reference_answer_z"]
    assert {t.session_id for t in found} == {"s0", "s1"} and {t.tenant for t in found} == {"b5"}
    assert all("As I recall" in t.example for t in found)
    gates = evaluate(rep, expand_gate_sets(["forget"], rep.methods, "black"))
    tamper = next(g for g in gates if g.rule == TAMPER_RULE)
    assert tamper.outcome == "failed" and "answer(s) of the reference tenant" in tamper.detail
    assert exit_code(gates) == 1
    # the leak rules it lifted are never held: their control (B0) says z no more than the lifted floor
    assert all(g.outcome != "held" for g in gates if "leak" in g.rule)


def test_z_in_the_references_answers_is_excused_only_where_its_own_model_wrote_z_freely(
    tmp_path: Path,
) -> None:
    """An honest agent's reference answers what its model wrote: where that model wrote z itself (unheld
    by any schema: ``tamper.unconstrained``), z in the answers is the model's, not the agent's."""
    out = tmp_path / "lifter.jsonl"
    record_agent(
        AgentRecordOptions(agent="tests.scripted_agents:floor_lifter", suite="builtin", n=1, out=out)
    )
    traces = read_bundle(out).sessions
    excused = TamperEvidence(model_wrote_z={"s0"})
    check_reference_answers(excused, traces)
    assert excused.counts == {}
    plain = TamperEvidence()
    check_reference_answers(plain, traces)
    assert plain.counts[("s0", "b5")]["reference_answer_z"] >= 1


def test_a_probe_the_floor_leaked_on_is_dropped_in_that_session_only_and_named_in_the_verdict() -> None:
    """One floor answer holding z (a model that guesses it, or an agent that puts it there) drops that probe
    where it happened, never for the whole suite: the other sessions still count it, and the Leak@probes
    verdict names what was dropped."""
    from eu_audit.audits.summary import drop_probes

    rep = read_report(Path(__file__).parents[1] / "reports/audit-smollm2/rows/audits/smol10.audit.json")
    suite = "bfcl-memory"
    floor = [s for s in rep.states if s.method == "b5" and s.suite == suite]
    first = floor[0]
    first.probes = [p.model_copy(update={"leaked": p.probe == "direct"}) for p in first.probes]
    before = {(s.method, s.session_id): s.values.get("leak_probes") for s in rep.states}
    dropped = drop_probes(rep.states, rep.probes)
    assert dropped[suite] == [f"direct in {first.session_id}"]
    # every other session reads every probe as before; in the floor's session its own leak is not counted
    after = {(s.method, s.session_id): s.values.get("leak_probes") for s in rep.states}
    assert all(after[k] == v for k, v in before.items() if k[1] != first.session_id)
    assert after[("b5", first.session_id)] == 0.0
    rep = rep.model_copy(update={"probes_dropped": dropped})
    g = evaluate(rep, [f"agent.{suite}.leak_probes<=floor".replace("agent", "b1")])[0]
    assert f"probes dropped where the floor leaked on them: direct in {first.session_id}" in g.detail


def _states(ref_said: list[bool], own_said: list[bool]) -> list:
    """A reference (B5) and eu-audit's own floor over the same sessions, each saying z in its probes
    where told."""
    from eu_audit.audits.model import FLOOR, OWN_FLOOR, ProbeOutcome, StateAudit

    out = []
    for i, (r, o) in enumerate(zip(ref_said, own_said, strict=True)):
        for method, said in ((FLOOR, r), (OWN_FLOOR, o)):
            st = StateAudit(session_id=f"s{i}", episode_id=f"e{i}", suite="builtin", method=method)
            st.probes = [ProbeOutcome(probe="direct", text="x", leaked=said)]
            st.values = {"leak5": 0.0}
            out.append(st)
    return out


def test_a_reference_that_says_z_more_often_than_eu_audits_own_floor_fails_the_gate() -> None:
    """The reference is the agent's; the floor eu-audit trusts is its own runtime over the episode without
    z. A reference saying z in 6 of 6 sessions where eu-audit's floor said it in none is no floor: the
    gate's pseudo-rule fails, whatever the agent's rules read."""
    from eu_audit.audits.gate import OWN_FLOOR_RULE
    from eu_audit.audits.own_floor import checks

    rep = read_report(Path(__file__).parents[1] / "reports/discrimination/rows/noop/audit.json")
    lifted = checks(_states([True] * 6, [False] * 6), alpha=0.05)
    probes = next(c for c in lifted if c.said == "probes")
    assert (probes.n, probes.reference, probes.own_floor, probes.above) == (6, 6, 0, True)
    gates = evaluate(rep.model_copy(update={"own_floor": lifted}), [])
    failed = next(g for g in gates if g.rule == OWN_FLOOR_RULE)
    assert failed.outcome == "failed" and "6 of 6 sessions" in failed.detail
    assert exit_code(gates) == 1


def test_a_reference_that_guesses_z_no_more_often_than_eu_audits_floor_is_not_a_finding() -> None:
    """A model that guesses z now and then does so for eu-audit's floor too: the same rate is no finding,
    and five sessions of a reference alone are not yet evidence (the test stays valid at any n a run
    stops at, so it asks for more)."""
    from eu_audit.audits.own_floor import checks

    same = checks(_states([True, False, True, False], [True, False, False, True]), alpha=0.05)
    assert not any(c.above for c in same)
    few = checks(_states([True] * 5, [False] * 5), alpha=0.05)
    assert not any(c.above for c in few)


def test_an_interrupted_black_box_run_keeps_its_whole_sessions_marked_interrupted_and_exits_3(
    tmp_path: Path,
) -> None:
    """^C or SIGTERM while the second session runs: the first session, every tenant of it finished, is
    written as a bundle whose header says the run was interrupted (the audit says so too), and the
    command fails (exit 3) naming the file; the same in rounds (``--until-decided``)."""
    from tests.helpers import run_cli

    out = tmp_path / "bb.jsonl"
    got = run_cli("record", "--agent", "tests.scripted_agents:interrupted", "--n", "2", "-o", str(out))
    assert got.returncode == 3, got.stdout + got.stderr
    assert "interrupted after 1 of 2 session(s)" in got.stdout + got.stderr and str(out) in got.stderr
    bundle = read_bundle(out)
    assert {t.session.parent_session for t in bundle.sessions} == {"s0"}
    assert bundle.header.engine_facts["interrupted"] == "after 1 of 2 session(s)"
    assert "The recording was interrupted after 1 of 2 session(s)" in run_cli("audit", str(out)).stdout
    # in rounds: each round opens the agent again, so it is stopped in round 3 (s2 done, s3 begun); the
    # rounds before are kept with it. One rule no n below 29 decides keeps the rounds going
    from eu_audit.errors import RunFailed
    from eu_audit.rounds import Gate, record_until_decided

    rounds = tmp_path / "rounds.jsonl"
    opts = AgentRecordOptions(agent="tests.scripted_agents:interrupted", suite="builtin", n=4, out=rounds)
    with pytest.raises(RunFailed, match="interrupted in round 3 of 3"):
        record_until_decided(opts, Gate((), ("agent.leak_probes<=floor",)))
    kept = read_bundle(rounds)
    assert kept.header.engine_facts["interrupted"] == "in round 3 of 3, after 3 session(s)"
    assert {t.session.parent_session for t in kept.sessions} == {"s0", "s1", "s2"}
    assert not list(tmp_path.glob("rounds.round-*")), "each round's own file is removed"
