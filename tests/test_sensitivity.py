"""A hold is earned: the same rule, decided by the same test on the same sessions and suite, must *fail*
for the no-forget control (B0). Otherwise it reads *insensitive*, never held, and says what would decide
it. Read from the committed audits (the SmolLM2 audit: 10 sessions per suite, where B0 leaks on some
suites and not on others); no model runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eu_audit.audits.evidence import result_of
from eu_audit.audits.gate import GATE_SETS, default_rules, evaluate, exit_code, parse_rule
from eu_audit.audits.metric import METRICS
from eu_audit.audits.model import AuditReport, read_report
from eu_audit.audits.rules import CONTROL
from eu_audit.audits.sensitivity import needs_control

from .helpers import run_cli

QWEN = Path(__file__).parents[1] / "reports/audit-qwen2.5/rows/audits/slices"
SMOL = Path(__file__).parents[1] / "reports/audit-smollm2/rows/audits/smol10.audit.json"


@pytest.fixture(scope="module")
def smol() -> AuditReport:
    return read_report(SMOL)


def decided(rep: AuditReport, rules: list[str]) -> dict[str, tuple[str, str]]:
    return {g.rule: (g.outcome, g.control) for g in evaluate(rep, rules)}


def test_a_rule_whose_control_broke_it_but_did_not_fail_it_is_never_held_and_says_what_n_would_decide(
    smol: AuditReport,
) -> None:
    rules = ["b1.agentdojo.leak_probes<=floor", "b1.bfcl-memory.leak_probes<=floor"]
    got = {g.rule: g for g in evaluate(smol, rules)}
    never = got["b1.agentdojo.leak_probes<=floor"]  # SmolLM2 never repeats z there, forget or not
    assert never.outcome == "insensitive" and "0 of 10" in never.control
    assert never.n_needed is None and "no n decides it" in never.detail
    # B0 leaked in 3 of 10 here (rows re-scored): once was enough before; 3 of 10 is no failure at n = 10,
    # and more sessions would decide both: B0 fail it (n >= 16 at its rates), B1's bound reach the margin
    thin = got["b1.bfcl-memory.leak_probes<=floor"]
    assert thin.outcome == "inconclusive" and "3 of 10" in thin.control and "does not fail it" in thin.control
    assert thin.n_needed == 29 and "n >= 16" in thin.detail


def test_a_no_op_forget_is_never_held(smol: AuditReport) -> None:
    """B0 is the forget switched off: on every suite and rule it fails or is insensitive, never held."""
    rules = [f"b0.{s}.{m}<=floor" for s in smol.suites for m in ("leak_probes", "leak_any", "leak5", "cad")]
    got = decided(smol, rules)
    assert "held" not in {o for o, _ in got.values()}, got
    assert exit_code(evaluate(smol, rules)) in (1, 4)


def _control_rules(rep: AuditReport) -> list[str]:
    """Every rule of every gate set and every default rule on z, held against B0 itself."""
    rules = []
    for name in GATE_SETS.names():
        gate_set = GATE_SETS.get(name)
        for r in [*gate_set.rules, *gate_set.where_measured]:
            parsed = parse_rule(f"{CONTROL}.{r}")
            sides = {"black"} if "." in parsed.metric else METRICS.get(parsed.metric).sides
            if rep.side in sides:
                rules.append(parsed.text)
    on_z = [r for r in default_rules(rep, control=True) if r.startswith(f"{CONTROL}.")]
    return rules + [r for r in on_z if needs_control(parse_rule(r).metric)]


def test_the_no_forget_control_as_the_method_under_test_never_holds_any_rule_in_any_committed_audit() -> None:
    """Over every committed audit JSON that recorded B0 (white-box and black-box, every gate set): fed as the
    method under test, the forget that does nothing never holds."""
    root = Path(__file__).parents[1]
    audits = [
        p
        for d in ("reports", "pack")
        for p in (root / d).rglob("*.json")
        if b'"eu-audit/audit@1"' in p.read_bytes()[:200]
    ]
    held, decided_rules, with_b0 = [], 0, 0
    for path in audits:
        rep = read_report(path)
        if CONTROL not in {s.method for s in rep.states}:
            continue
        with_b0 += 1
        for g in evaluate(rep, _control_rules(rep)):
            decided_rules += 1
            if g.outcome == "held":
                held.append(f"{path.relative_to(root)}: {g.rule} ({g.detail})")
    assert with_b0 >= 30 and decided_rules >= 500, (with_b0, decided_rules)
    assert not held, held


def test_a_rule_without_a_suite_is_decided_per_suite_and_the_worst_decides(smol: AuditReport) -> None:
    """B4's Leak@probes pooled over the four suites had a control of 3 of 40 (all from bfcl-memory), enough
    for a hold before; per suite, each against its own control, no suite earns it."""
    g = evaluate(smol, ["b4.leak_probes<=floor"])[0]
    assert g.outcome == "inconclusive" and g.n == 40 and g.detail.startswith("per suite, the worst decides:")
    assert "bfcl-memory inconclusive (n = 10)" in g.detail  # B0 there: 3 of 10, more sessions would decide
    others = [s for s in smol.suites if s != "bfcl-memory"]
    assert all(f"{s} insensitive (n = 10)" in g.detail for s in others)  # B0 never leaked there


def test_b7_equal_to_b5_token_for_token_needs_no_control(smol: AuditReport) -> None:
    got = decided(smol, ["b7.agentdojo.leak_probes<=floor"])
    assert got["b7.agentdojo.leak_probes<=floor"] == ("held", "")  # it is B5's state, on an exact engine


def test_a_hold_with_a_thin_control_or_none_is_insensitive(smol: AuditReport) -> None:
    """At a wide margin B6's Leak@probes holds by its bound on bfcl-memory, where B0 leaked in 3 of 10: that
    control does not fail the rule, so the hold is not earned; without B0 in the audit, nothing shows the
    measurement could see z there at all."""
    wide = smol.model_copy(update={"margin": 0.5})
    rule = "b6.bfcl-memory.leak_probes<=floor"
    with_b0 = evaluate(wide, [rule])[0]
    without = wide.model_copy(update={"states": [s for s in wide.states if s.method != "b0"]})
    alone = evaluate(without, [rule])[0]
    assert with_b0.outcome == "insensitive" and "was held" in with_b0.detail and "3 of 10" in with_b0.control
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


def test_an_orphan_rule_names_its_proxy_control_and_why_it_suffices() -> None:
    """The no-forget tenant never deletes, so it has no orphans by construction: its control is the stated
    proxy (B0 held z in the files eu-audit read), never a sentence about a channel B0 has no twin of."""
    rep = read_report(
        Path(__file__).parents[1] / "reports/agents/langgraph-index-forensics/rows/audits/audit.json"
    )
    orphans, vectors = evaluate(rep, ["agent.disk.orphans==0", "agent.disk.vectors==0"])
    assert orphans.control.startswith("proxy b0.residue_disk==0 (an orphan is what a delete leaves")
    assert "2 of 2 session(s) (1.00) and fails it" in orphans.control
    assert "proxy" not in vectors.control and "1 of 2" in vectors.control  # its own channel
