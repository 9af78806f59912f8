"""A hold needs a positive control that showed z: a rule whose control (B0, the state without the forget)
never broke it on the rule's sessions cannot tell a forget from none, and reads *insensitive*, never held.
Read from the committed SmolLM2 audit (10 sessions per suite), where B0 leaks on some suites and not on
others; no model runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eu_audit.audits.evidence import result_of
from eu_audit.audits.gate import evaluate, exit_code
from eu_audit.audits.model import AuditReport, read_report

from .helpers import run_cli

QWEN = Path(__file__).parents[1] / "reports/audit-qwen2.5/rows/audits/slices"
SMOL = Path(__file__).parents[1] / "reports/audit-smollm2/rows/audits/smol10.audit.json"


@pytest.fixture(scope="module")
def smol() -> AuditReport:
    return read_report(SMOL)


def decided(rep: AuditReport, rules: list[str]) -> dict[str, tuple[str, str]]:
    return {g.rule: (g.outcome, g.control) for g in evaluate(rep, rules)}


def test_a_rule_on_a_suite_where_b0_never_leaked_is_insensitive_and_b0s_rate_is_printed_beside_it(
    smol: AuditReport,
) -> None:
    got = decided(smol, ["b1.agentdojo.leak_probes<=floor", "b1.bfcl-memory.leak_probes<=floor"])
    outcome, control = got["b1.agentdojo.leak_probes<=floor"]
    assert outcome == "insensitive" and "0 of 10" in control  # SmolLM2 never repeats z there, forget or not
    outcome, control = got["b1.bfcl-memory.leak_probes<=floor"]
    assert outcome == "inconclusive" and "3 of 10" in control  # B0 leaked in 3 (rows re-scored): it can see z


def test_a_no_op_forget_is_never_held(smol: AuditReport) -> None:
    """B0 is the forget switched off: on every suite and rule it fails or is insensitive, never held."""
    rules = [f"b0.{s}.{m}<=floor" for s in smol.suites for m in ("leak_probes", "leak_any", "leak5", "cad")]
    got = decided(smol, rules)
    assert "held" not in {o for o, _ in got.values()}, got
    assert exit_code(evaluate(smol, rules)) in (1, 4)


def test_b7_equal_to_b5_token_for_token_needs_no_control(smol: AuditReport) -> None:
    got = decided(smol, ["b7.agentdojo.leak_probes<=floor"])
    assert got["b7.agentdojo.leak_probes<=floor"] == ("held", "")  # it is B5's state, on an exact engine


def test_a_hold_with_no_b0_in_the_audit_is_insensitive(smol: AuditReport) -> None:
    """At a wide margin B6's Leak@probes holds by its bound on bfcl-memory, where B0 leaked in 3 of 10;
    without B0 in the audit nothing shows the measurement could see z there: the same data, insensitive."""
    wide = smol.model_copy(update={"margin": 0.5})
    rule = "b6.bfcl-memory.leak_probes<=floor"
    with_b0 = evaluate(wide, [rule])[0]
    without = wide.model_copy(update={"states": [s for s in wide.states if s.method != "b0"]})
    alone = evaluate(without, [rule])[0]
    assert with_b0.outcome == "held" and "3 of 10" in with_b0.control
    assert alone.outcome == "insensitive" and "not recorded" in alone.control


def test_insensitive_exits_4_unless_accepted_and_the_receipt_counts_it_apart(
    smol: AuditReport, tmp_path: Path
) -> None:
    results = evaluate(smol, ["b7.agentdojo.leak_probes<=floor", "b1.agentdojo.leak_probes<=floor"])
    assert exit_code(results) == 4 and exit_code(results, insensitive_passes=True) == 0
    assert result_of({g.outcome for g in results}) == "WARNED"
    out = tmp_path / "merged.json"
    slices = [str(QWEN / f"audit-slice-{i}.json") for i in (1, 2)]
    args = ["merge", *slices, "-o", str(out), "--gate", "b4.agentdojo.leak_probes<=floor"]
    proc = run_cli(*args)
    assert proc.returncode == 4 and "INSENSITIVE" in proc.stdout and "--on-insensitive pass" in proc.stderr
    assert json.loads(out.read_text())["gates"][0]["outcome"] == "insensitive"
    proc = run_cli(*args, "--force", "--on-insensitive", "pass")
    assert proc.returncode == 0, proc.stdout + proc.stderr
