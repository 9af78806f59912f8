"""The floor eu-audit trusts is eu-audit's: what the reference tenant (B5, never fed z) answers is read, and
z there that its model never wrote is a finding that fails the gate. An agent that says z to its reference
lifts the floor its own answers are measured against; it must fail, never hold nor read insensitive."""

from __future__ import annotations

from pathlib import Path

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import TAMPER_RULE, evaluate, exit_code, expand_gate_sets
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
