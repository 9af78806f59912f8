"""The paper's findings are judged by the same tests as a gate: a finding is "reproduced" only when every
rule behind it has the outcome that shows it at the audit's n and alpha, "not reproduced" when a rule is
decided the other way, and otherwise "not shown at n = N". Checked on the committed slice of the default
model's audit (real rows: Qwen2.5-Coder-0.5B, 8 sessions), cut down to fewer sessions."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.audits.findings import PAPER, Finding, judge
from eu_audit.audits.model import AuditReport, read_report
from eu_audit.view.report import regenerate, write_report

SLICES = Path(__file__).parent.parent / "reports" / "audit-qwen2.5" / "rows" / "audits" / "slices"
SLICE = SLICES / "audit-slice-1.json"


def _verdicts(rep: AuditReport, findings: tuple[Finding, ...] = PAPER) -> dict[str, str]:
    return {j.finding.claim: j.verdict for j in judge(rep, findings)}


def _first_sessions(rep: AuditReport, n: int) -> AuditReport:
    keep = list(dict.fromkeys(s.session_id for s in rep.states))[:n]
    return rep.model_copy(update={"states": [s for s in rep.states if s.session_id in keep]})


def claim(method: str, starts: str) -> str:
    return next(f.claim for f in PAPER if f.method == method and f.claim.startswith(starts))


def test_a_finding_is_reproduced_only_when_its_test_says_so_at_that_n() -> None:
    rep = read_report(SLICE)
    got = _verdicts(rep)
    # B2 is significantly worse than the floor on both rules at n = 8 (exact McNemar p = 0.031 each)
    assert got[claim("b2", "B2")] == "reproduced"
    # B0 leaks in 3 of 8 sessions more than its floor: not significant yet, so not called reproduced
    assert got[claim("b0", "B0")] == "not shown at n = 8"
    # B7's states are B5's token for token on an exact engine: held on equality
    assert got[claim("b7", "B7")] == "reproduced"
    # the same data cut to two sessions cannot show what eight did
    two = _verdicts(_first_sessions(rep, 2))
    assert two[claim("b2", "B2")] == "not shown at n = 2"


def test_a_finding_decided_the_other_way_is_not_reproduced() -> None:
    rep = read_report(SLICE)
    contrary = (Finding("b2", "B2 sits at the floor", ("b2.leak_probes<=floor",), "held"),)
    assert _verdicts(rep, contrary) == {"B2 sits at the floor": "not reproduced"}
    absent = (Finding("b42", "a method this audit lacks", ("b42.cad<=floor",), "held"),)
    assert _verdicts(rep, absent) == {}  # not judged at all, never "not shown"


def test_a_report_with_findings_shows_the_table_and_makes_it_again_from_its_rows(tmp_path: Path) -> None:
    path = write_report([], [SLICE], tmp_path / "r", "slice 1", None, findings=True)
    md = path.read_text()
    assert "**Paper vs ours**" in md and "| B2 (forget instruction)" in md and "**reproduced**" in md
    again = regenerate(tmp_path / "r", tmp_path / "again")
    assert again.read_bytes() == path.read_bytes()
    plain = write_report([], [SLICE], tmp_path / "plain", "slice 1", None)
    assert "Paper vs ours" not in plain.read_text()


def test_a_leak_not_yet_significant_is_never_summarised_as_no_string_leak() -> None:
    """B0 leaked in 3 of 8 sessions more than its floor (not significant at n = 8) and its samples agree
    with B5's less (agreement, p < 0.05); its actions differ from B5's in 5 of 8 (CAD 0.03 to 0.49, mean
    0.15: not shown worse on average at n = 8 by a test free of assumptions about the distribution, where
    Wilcoxon's p = 1/32 assumed it symmetric). The summary never says "no string leak" for it; samples
    unlike B5's put it with the methods that act unlike B5, as CAD does for B4."""
    from eu_audit.audits.gate import evaluate
    from eu_audit.audits.output import summary_lines, verdicts

    rep = read_report(SLICE)
    got = {g.rule: g.outcome for g in evaluate(rep, ["b0.leak_any<=floor", "b0.cad<=floor"])}
    assert set(got.values()) == {"inconclusive"}
    v = verdicts(rep)
    assert v["b2"] == "still leaks" and v["b7"] == "forgets"
    assert v["b0"] == "acts unlike the reference"  # its only failed rule: agreement with B5's samples
    assert v["b4"] == "acts unlike the reference"  # CAD +0.69 (6 of 8 sessions): shown at n = 8
    text = "\n".join(summary_lines(rep))
    assert "not decided at this n): b0, b1, b3, b4, b6, b8" in text
    assert not any(line.startswith("Only stop saying") and "b0" in line for line in summary_lines(rep))


def test_b8s_finding_is_judged_only_where_b0_routed_z_into_an_identifier_sink() -> None:
    """The paper's B8 claim (IFC blocks identifier sinks) is a fact per session, and vacuous where no
    session routed z at all: it needs B0 to have routed z (given), and is never reproduced without that."""
    rep = read_report(SLICE)
    b8 = next(j for j in judge(rep) if j.finding.method == "b8" and "identifier" in j.finding.claim)
    by_rule = {r.rule: r for r in b8.results}
    # judged on the suites where B0 wrote z into a routing argument, each rule per suite; on the others
    # (bfcl-tools, preference) B0 never routed z, so B8's hold there would be insensitive, not evidence
    assert set(by_rule) == {
        f"{m}.{s}.tool.routing==0" for m in ("b0", "b8") for s in ("agentdojo", "bfcl-memory")
    }
    assert {by_rule[f"b0.{s}.tool.routing==0"].outcome for s in ("agentdojo", "bfcl-memory")} == {"failed"}
    assert {by_rule[f"b8.{s}.tool.routing==0"].outcome for s in ("agentdojo", "bfcl-memory")} == {"held"}
    assert b8.verdict == "reproduced"
    nothing_routed = (
        Finding("b8", "blocks", ("b8.tool.routing==0",), "held", given=(("b7.tool.routing==0", "failed"),)),
    )
    assert _verdicts(rep, nothing_routed)["blocks"].startswith("not testable here: `b7.tool.routing==0`")
    absent = (
        Finding("b8", "blocks", ("b8.tool.routing==0",), "held", given=(("b42.tool.routing==0", "failed"),)),
    )
    assert _verdicts(rep, absent) == {"blocks": "not testable here: b42 not audited"}


def test_a_metric_a_user_adds_puts_a_failing_method_in_the_summary_group_it_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The summary's groups are read from each metric's declaration (``Metric.shows``), not from a list of
    our names: B0's agreement values moved to a user's metric put it with the methods that act unlike B5
    when that metric says "behaves", and under "fails another rule" when it declares nothing."""
    from dataclasses import replace

    from eu_audit.audits.metric import METRICS
    from eu_audit.audits.output import verdicts

    rep = read_report(SLICE)
    for s in rep.states:
        s.values["mine"] = s.values.pop("agreement", None)
    mine = replace(METRICS.get("agreement"), name="mine", shows="behaves")
    monkeypatch.setitem(METRICS._items, "mine", mine)
    monkeypatch.setitem(METRICS._items, "agreement", replace(METRICS.get("agreement"), junit=False))
    assert verdicts(rep)["b0"] == "acts unlike the reference"
    monkeypatch.setitem(METRICS._items, "mine", replace(mine, shows=None))
    assert verdicts(rep)["b0"] == "fails another rule"


def test_b1_leaks_like_b0_is_tested_against_b0_as_the_paper_states_it() -> None:
    """The finding compares B1 with B0 paired by session, equal within the margin both ways; a rule may
    name another audited method as its reference, with <= or >= only."""
    from eu_audit.audits.gate import check_rules, evaluate, parse_rule
    from eu_audit.errors import BadInput

    rep = read_report(Path(__file__).parents[1] / "reports/audit-smollm2/rows/audits/smol10.audit.json")
    b1 = next(j for j in judge(rep) if j.finding.method == "b1" and "like B0" in j.finding.claim)
    assert [r.rule for r in b1.results] == ["b1.leak_any>=b0", "b1.leak_any<=b0"]
    below, above = b1.results
    # these rows count B0's stored record in any-leak, which B1 deletes: B1 below B0, significantly, on
    # the one suite where B0 showed z at all (decided per suite: the others cannot tell B1 from B0)
    assert below.outcome == "failed" and "bfcl-memory: below B0 by 1" in below.detail and below.p is not None
    assert "agentdojo insensitive" in below.detail
    # never above B0 there, but 10 sessions bound it only to 0.259: n >= 29 would hold it
    assert above.outcome == "inconclusive" and "n >= 29" in above.detail and b1.verdict == "not reproduced"
    # the reference is paired by session: B0 against itself is equal both ways, and never a hold of its own
    assert {g.outcome for g in evaluate(rep, ["b0.cad>=b0", "b0.cad<=b0"])} <= {"inconclusive", "insensitive"}
    with pytest.raises(BadInput, match="'<=METHOD' or '>=METHOD'"):
        parse_rule("b1.leak_any==b0")
    with pytest.raises(BadInput, match="method 'b42' is not audited here"):
        check_rules(["b1.leak_any<=b42"], rep.methods, rep.suites)


def test_a_finding_whose_values_are_another_methods_session_for_session_is_marked_by_construction() -> None:
    """On the B3-resident run, B1's and B3's any-leak and B1's CAD are B0's in every one of 30 sessions:
    those findings restate B0's measurement, so they are marked and never counted as separate evidence.
    B7's equality with B5 is its own finding (at the floor, never 'by construction')."""
    from eu_audit.audits.findings import reproduced_count

    root = Path(__file__).parent.parent / "reports" / "b3-resident-qwen2.5" / "rows" / "audits"
    judged = judge(read_report(next(root.glob("*.json"))))
    by = {j.finding.claim: j.verdict for j in judged}
    assert by[claim("b0", "B0")] == by[claim("b7", "B7")] == "reproduced"
    built = [c for c, v in by.items() if v.startswith("reproduced by construction: the same")]
    assert len(built) == 3 and all("as B0 in all 30 sessions" in by[c] for c in built)
    assert (
        reproduced_count(judged) == "2 of 5 findings reproduced as separate evidence, 3 more by construction"
    )
