"""The paper's findings about each method, judged by the same tests as a gate.

A finding is the paper's claim about one method against the B5 floor, written as the gate rules that
decide it and the outcome that reproduces it: "B2 leaks on Leak@probes" is ``b2.leak_probes<=floor``
*failed* (significantly worse than the floor at alpha); "B7 sits at the floor" is ``b7.leak_any<=floor``
and ``b7.cad<=floor`` *held*. So a finding is called reproduced only when its test says so at the audit's
n and alpha; the opposite decisive outcome is "not reproduced"; anything else is "not shown at n = N",
with what would decide it. Nothing here is a gate: a report shows the table, no exit code reads it.

Some findings only mean something where the data give them something to show: "B8 keeps z out of
identifier sinks" is vacuous on sessions where no method ever routed z. Such a finding names what must be
*given* (``b0.tool.routing==0`` failed: B0 routed z in some session), and is judged on the suites where
the given holds, each rule per suite (``on_given_suites``); where no suite gives it, the finding is "not
testable here", never reproduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from eu_audit.audits.model import FLOOR, AuditReport, GateResult

Decisive = Literal["held", "failed"]


@dataclass(frozen=True)
class Finding:
    method: str
    claim: str  # the paper's words, shortened
    rules: tuple[str, ...]
    reproduced_when: Decisive  # the outcome every rule must have for the finding to be reproduced
    #: what the data must show for the finding to be testable at all: (rule, its outcome)
    given: tuple[tuple[str, Decisive], ...] = ()


PAPER: tuple[Finding, ...] = (
    Finding("b0", "B0 (no forget) leaks z", ("b0.leak_any<=floor",), "failed"),
    Finding(  # the paper's own test: B1 against B0 (p = 1.0), equal within the margin both ways
        "b1",
        "B1 (memory delete) leaks like B0: what was derived from z stays",
        ("b1.leak_any>=b0", "b1.leak_any<=b0"),
        "held",
    ),
    Finding(
        "b1", "B1 keeps B0's trajectory: its actions are not B5's (CAD > 0)", ("b1.cad<=floor",), "failed"
    ),
    Finding(
        "b2",
        "B2 (forget instruction) is high on Leak@probes and Leak@5",
        ("b2.leak_probes<=floor", "b2.leak5<=floor"),
        "failed",
    ),
    Finding("b3", "B3 (source redaction) leaks through derived artifacts", ("b3.leak_any<=floor",), "failed"),
    Finding(
        "b4",
        "B4 (sanitize without replay) changes what the agent does (CAD > 0)",
        ("b4.cad<=floor",),
        "failed",
    ),
    Finding("b4", "B4 loses utility", ("b4.utility>=floor",), "failed"),
    Finding("b5p", "B5' (prefix cache) is B5", ("b5p.leak_any<=floor", "b5p.cad<=floor"), "held"),
    Finding(
        "b6",
        "B6 (string redaction) leaves behavioral residue: its actions are not B5's",
        ("b6.cad<=floor",),
        "failed",
    ),
    Finding(
        "b7",
        "B7 (selective replay) sits at the floor with CAD 0",
        ("b7.leak_any<=floor", "b7.cad<=floor"),
        "held",
    ),
    Finding(  # a fact per session: the sink policy is deterministic, one routed z refutes it
        "b8",
        "B8 (IFC) keeps z out of identifier sinks (where B0 routes z into one)",
        ("b8.tool.routing==0",),
        "held",
        given=(("b0.tool.routing==0", "failed"),),
    ),
    Finding("b8", "B8 still leaks z in free text and state", ("b8.leak_any<=floor",), "failed"),
    Finding("b9", "B9 (IFC + selective replay) is clean", ("b9.leak_any<=floor", "b9.cad<=floor"), "held"),
)


@dataclass(frozen=True)
class Judged:
    finding: Finding
    verdict: str  # "reproduced" | "not reproduced" | "not shown at n = N" | "not testable here: ..."
    results: list[GateResult]  # the finding's own rules, then its givens


def judge(report: AuditReport, findings: Sequence[Finding] = PAPER) -> list[Judged]:
    """Each finding whose method this audit has, judged by its rules' verdicts
    (``eu_audit.audits.verdict``)."""
    from eu_audit.audits.gate import evaluate

    judged: list[Judged] = []
    for f in findings:
        if f.method not in report.methods:
            continue
        f = on_given_suites(report, f)
        wanted = [*f.rules, *(rule for rule, _ in f.given)]
        results = {r.rule: r for r in evaluate(report, wanted) if r.rule in wanted}
        verdict = _verdict(f, results, report)
        if verdict == "reproduced":
            earlier = [j.finding.method for j in judged if j.finding.method != f.method]
            if twin := same_values_as(report, f, earlier):
                verdict = f"{BY_CONSTRUCTION} {twin}"
        judged.append(Judged(f, verdict, list(results.values())))
    return judged


#: a reproduced finding whose method has, on every session, the very values an earlier finding's method
#: has on the rules' metrics: it follows from that finding by construction and is no separate evidence
BY_CONSTRUCTION = "reproduced by construction:"


def same_values_as(report: AuditReport, f: Finding, earlier: Sequence[str]) -> str:
    """ "the same leak_any as B0 in all 30 sessions" when ``f``'s method has, session by session, the values
    of an earlier-judged method on every metric its rules read; "" when none does."""
    from eu_audit.audits.gate import parse_rule
    from eu_audit.audits.rules import value_of

    metrics = sorted({parse_rule(r).metric for r in f.rules})

    def values(method: str) -> dict[str, tuple[float | None, ...]]:
        return {
            s.session_id: tuple(value_of(s, m) for m in metrics)
            for s in report.states
            if s.method == method and not s.error
        }

    mine = values(f.method)
    if not mine or mine == values(FLOOR) or all(v is None for vs in mine.values() for v in vs):
        return ""  # at the floor: each method's equality with B5 is its own finding (B7 == B5)
    for other in dict.fromkeys(earlier):
        if values(other) == mine:
            said = f"the same {', '.join(metrics)} as {other.upper()} in all {len(mine)} sessions"
            return f"{said} (not separate evidence)"
    return ""


def reproduced_count(judged: Sequence[Judged]) -> str:
    """ "3 of 5 findings reproduced as separate evidence, 2 more by construction" for a report's headline."""
    plain = sum(j.verdict == "reproduced" for j in judged)
    built = sum(j.verdict.startswith(BY_CONSTRUCTION) for j in judged)
    more = f", {built} more by construction" if built else ""
    return f"{plain} of {len(judged)} findings reproduced as separate evidence{more}"


def _on_suite(rule: str, suite: str) -> str:
    """``b8.tool.routing==0`` on one suite: ``b8.SUITE.tool.routing==0`` (a rule naming one is kept)."""
    from eu_audit.audits.gate import parse_rule

    if parse_rule(rule).suite != "all":
        return rule
    method, rest = rule.split(".", 1)
    return f"{method}.{suite}.{rest}"


def on_given_suites(report: AuditReport, f: Finding) -> Finding:
    """A finding with a given, judged on the suites where the given holds ("where B0 routes z into one"):
    each rule once per such suite. Where no suite gives it, the finding as written (its given then says
    why it is not testable)."""
    from eu_audit.audits.gate import evaluate

    if not f.given:
        return f
    suites = [
        s
        for s in report.suites
        if all(
            g.outcome == outcome for rule, outcome in f.given for g in evaluate(report, [_on_suite(rule, s)])
        )
    ]
    if not suites:
        return f
    rules = tuple(_on_suite(r, s) for s in suites for r in f.rules)
    given = tuple((_on_suite(r, s), o) for s in suites for r, o in f.given)
    return Finding(f.method, f.claim, rules, f.reproduced_when, given)


def _verdict(f: Finding, results: dict[str, GateResult], report: AuditReport) -> str:
    for rule, outcome in f.given:
        method, got = rule.split(".", 1)[0], results[rule]
        if method not in report.methods:
            return f"not testable here: {method} not audited"
        if got.outcome == "inconclusive":
            return f"not shown at n = {got.n}"
        if got.outcome == "insensitive":
            return f"not testable here: `{rule}` insensitive, not {outcome}"
        if got.outcome != outcome:
            return f"not testable here: `{rule}` {got.outcome}"
    outcomes = {results[r].outcome for r in f.rules}
    opposite = "held" if f.reproduced_when == "failed" else "failed"
    if outcomes == {f.reproduced_when}:
        return "reproduced"
    if "insensitive" in outcomes and f.reproduced_when == "held":
        return "not testable here: the positive control (B0) did not fail the rule"
    if opposite in outcomes:
        return "not reproduced"
    return f"not shown at n = {min(results[r].n for r in f.rules)}"


def findings_table(report: AuditReport) -> list[str]:
    """The paper-vs-ours table of a report: one row per finding, its rules' tests and details quoted."""
    judged = judge(report)
    if not judged:
        return []
    lines = [
        f"**Paper vs ours** (each finding judged by its rules' tests at alpha {report.alpha}, margin "
        f"{report.margin}; reproduced only when every rule has the outcome that shows it; a *given* rule "
        "says the data hold something to show)",
        "",
        "| finding (paper) | rule: verdict (n, test) | detail | judged |",
        "|---|---|---|---|",
    ]
    for j in judged:
        given = dict(j.finding.given)
        rules = "<br>".join(
            f"{'given ' if r.rule in given else ''}`{r.rule}`: {r.outcome} (n = {r.n}, {r.test})"
            for r in j.results
        )
        detail = "<br>".join(r.detail for r in j.results)
        lines.append(f"| {j.finding.claim} | {rules} | {detail} | **{j.verdict}** |")
    return [*lines, ""]
