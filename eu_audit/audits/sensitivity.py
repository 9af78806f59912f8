"""Sensitivity: a hold is *earned* against the no-forget control, at the same n.

A hold says "the forget left nothing here" only where the measurement demonstrably catches a forget that
does nothing. So every rule on a metric or channel that measures z (``Metric.control``, every channel) is
decided twice, by the same test (``verdict.decide``) on the same sessions and suite: once for the method
under test and once for the *positive control*, the state that never got the forget (B0: white-box, the
method; black-box, the tenant driven like the agent and never sent the forget, ``eu-audit gate
--positive-control``, on by default). The method's hold stands only where the control **fails** the
rule. Otherwise the rule is *insensitive*: it could not tell a forget from none at this n, it never counts
as a hold (``gate.exit_code``: exit 4, unless ``--on-insensitive pass``), and it says why in the rule's
terms and what would make it decide (more sessions, where the control's rates would fail it at some n; a
model or probe that draws z out, where the control never showed z).

- **Per suite, never pooled for a hold.** A rule without a suite is decided on each suite apart, each
  against its own control, and the worst outcome is the rule's (``OUTCOME_ORDER``): a control that showed
  z on one suite says nothing of another. A failure needs no control, so the sessions of all suites pooled
  may also show one (the paired test is valid over any sessions).
- **Each channel its own control.** ``after.EVENT`` is B0's own recheck of that event (B0 runs the same
  rechecks; a run recorded before it did has no control for the event, and the rule reads insensitive).
  One proxy remains where no honest twin exists, and the verdict names it and why it suffices:
  ``disk.orphans`` (an orphan is what a delete leaves, so the state never sent the forget has none by
  construction; whether B0 held z in the files eu-audit read is what the forget had to delete).
- **Bystanders**: a memory counts as kept only where the bystander's dump showed it right before the forget
  (``eu_audit.blackbox.bystander.kept`` counts one never shown as lost), so every hold was checked against
  memories shown present; the verdict says so.
- **Equality needs no control**: a state equal to the floor's token for token on an exact engine is B5's
  state (B7 == B5).
- A rule against another method (``b1.leak_any>=b0``, the paper's findings) is no forget's hold: its
  control is whether B0 showed z on the suite at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eu_audit.audits.metric import METRICS
from eu_audit.audits.model import AuditReport, GateResult, StateAudit
from eu_audit.audits.rules import (
    CONTROL,
    EQUALITY,
    OPS,
    TOL,
    Rule,
    RuleLike,
    other_method,
    outcome_order,
    parts_of,
    value_of,
)
from eu_audit.audits.verdict import Evidence, decide, n_to_fail, unmeasured_reason, weighed_metric

#: the one channel whose control is a proxy, the proxy rule on B0, and why the proxy suffices
ORPHANS = "disk.orphans"
ORPHANS_PROXY = (
    "residue_disk==0",
    "an orphan is what a delete leaves, so the state never sent the forget has none by construction; "
    "whether B0 held z in the files eu-audit read is what the forget had to delete",
)
BYSTANDER = "bystander"


def needs_control(name: str) -> bool:
    """A channel (z in one place) always; a metric when it measures z (``Metric.control``)."""
    if "." in name:
        return True
    return name in METRICS and METRICS.get(name).control


@dataclass(frozen=True)
class ControlOutcome:
    """The same rule decided for the no-forget control on the method's sessions."""

    fails: bool  # the control fails the rule: the measurement catches a forget that does nothing
    text: str  # what it showed, in the rule's terms (``GateResult.control``)
    outcome: str = ""  # the control's own verdict: failed, held, inconclusive, or "" (not recorded)
    rate: float | None = None  # the share of its sessions where it broke the rule
    #: the n at which the control's observed rates would fail the rule (None: no n, or not weighed)
    n_to_fail: int | None = None
    broke: int = 0  # sessions where it broke the rule


def earned_verdict(report: AuditReport, rule: RuleLike, *, alpha: float, margin: float) -> GateResult:
    """One rule's verdict, its hold earned against the control: per suite where the rule names none."""
    mine = [s for s in report.states if s.method == rule.method and rule.suite in ("all", s.suite)]
    # the suites the rule applies to: a metric of some suites only (utility, avoid) is not decided elsewhere
    applies = [
        s
        for s in mine
        if s.error or value_of(s, rule.metric) is not None or unmeasured_reason(s, rule.metric)
    ]
    suites = sorted({s.suite for s in applies or mine})
    if rule.suite != "all" or len(suites) < 2:
        return _earned_one(report, rule, alpha=alpha, margin=margin)
    parts = [(s, _earned_one(report, parts_of(rule, suite=s), alpha=alpha, margin=margin)) for s in suites]
    worst = _worst_of(rule, parts)
    if worst.outcome != "failed":  # a failure needs no control: the sessions pooled may show one
        pooled = decide(report, rule, alpha=alpha, margin=margin).result
        if pooled.outcome == "failed":
            words = ", ".join(f"{s} {g.outcome} (n = {g.n})" for s, g in parts)
            return pooled.model_copy(
                update={"detail": f"all suites pooled: {pooled.detail}; per suite: {words}"}
            )
    return worst


def _worst_of(rule: RuleLike, parts: Sequence[tuple[str, GateResult]]) -> GateResult:
    """A rule decided per suite: the worst suite's verdict, each suite's word beside it."""
    worst_suite, worst = min(parts, key=lambda x: outcome_order(x[1].outcome))
    words = ", ".join(f"{s} {g.outcome} (n = {g.n})" for s, g in parts)
    needs = [g.n_needed for _, g in parts if g.outcome in ("inconclusive", "insensitive")]
    known = [n for n in needs if n is not None]
    return worst.model_copy(
        update={
            "rule": rule.text,
            "detail": f"per suite, the worst decides: {words}. {worst_suite}: {worst.detail}",
            "n": sum(g.n for _, g in parts),
            "n_needed": max(known) if needs and len(known) == len(needs) else None,
            "control": "; ".join(f"{s}: {g.control}" for s, g in parts if g.control),
        }
    )


#: the metric whose probes the floor's own leaks drop (``summary.drop_probes``): its verdict names each
LEAK_PROBES = "leak_probes"


def _earned_one(report: AuditReport, rule: RuleLike, *, alpha: float, margin: float) -> GateResult:
    decision = decide(report, rule, alpha=alpha, margin=margin)
    result = decision.result
    if rule.metric == LEAK_PROBES:
        dropped = [p for s, ps in report.probes_dropped.items() if rule.suite in ("all", s) for p in ps]
        if dropped:
            said = f"{result.detail}; probes dropped where the floor leaked on them: {', '.join(dropped)}"
            result = result.model_copy(update={"detail": said})
    if rule.metric == BYSTANDER and result.outcome == "held":
        shown = (
            f"every bystander memory shown in its dump right before the forget, in all {result.n} session(s) "
            "(one not shown counts as lost), so a loss could be seen"
        )
        return result.model_copy(update={"control": shown})
    if not needs_control(rule.metric) or result.test == EQUALITY:
        return result
    if decision.floors_own and result.outcome == "held":  # B5's own state: equality decides
        return result
    if rule.method == CONTROL:  # the control held to its own rule: it can never fail itself to earn a hold
        if result.outcome != "held":
            return result
        said = "B0 is the forget switched off: no hold of its own is earned against itself"
        return result.model_copy(
            update={
                "outcome": "insensitive",
                "control": said,
                "detail": f"{said} (was held: {result.detail})",
            }
        )
    sessions = {
        s.session_id for s in report.states if s.method == rule.method and rule.suite in ("all", s.suite)
    }
    ctrl = control_outcome(report, rule, sessions, alpha=alpha, margin=margin)
    update: dict[str, object] = {"control": ctrl.text, "control_rate": ctrl.rate}
    # an inconclusive rule whose control more sessions would make fail stays inconclusive, with the n that
    # decides both; a hold the control did not earn, or a rule no n lets the control fail, is insensitive
    more_n = result.outcome == "inconclusive" and ctrl.n_to_fail is not None
    if more_n and result.n_needed is not None:
        n = max(ctrl.n_to_fail or 0, result.n_needed)
        said = f"{result.detail}; and {what_would_decide(ctrl)}"
        return result.model_copy(update={**update, "n_needed": n, "detail": said})
    if not ctrl.fails and result.outcome in ("held", "inconclusive"):
        update["outcome"] = "insensitive"
        # both must decide: the control fail the rule, and the method's bound reach the margin
        own = result.n_needed if result.outcome == "inconclusive" else result.n
        update["n_needed"] = None if ctrl.n_to_fail is None or own is None else max(ctrl.n_to_fail, own)
        update["detail"] = (
            f"{ctrl.text}: the rule cannot tell a forget from none at this n (was {result.outcome}: "
            f"{result.detail}); {what_would_decide(ctrl)}"
        )
    return result.model_copy(update=update)


def what_would_decide(ctrl: ControlOutcome) -> str:
    """What would make an insensitive rule decide, in its control's terms."""
    if not ctrl.outcome:
        return "record the positive control (B0) and gate again"
    if ctrl.outcome == "unmeasured":
        return "record again with a B0 this rule can be measured on (today's record runs every recheck on it)"
    if ctrl.n_to_fail is not None:
        return f"at B0's observed rates n >= {ctrl.n_to_fail} session(s) would make it fail the rule"
    if ctrl.broke:
        return "at B0's observed rates no n makes it fail the rule: a model or probe that draws z out would"
    return "no n decides it while B0 never shows z here: a model that repeats z, or a probe that draws it out"


def _control_rule(rule: RuleLike) -> tuple[Rule, str]:
    """The rule as the control is held to it, and the proxy's reason where a proxy stands in ("" if none):
    its own rule, ``after.EVENT`` too (B0 runs the same rechecks; a run where it ran none has no control
    for the event, and the rule reads insensitive); for ``disk.orphans``, the stated proxy."""
    if rule.metric != ORPHANS:
        return parts_of(rule, method=CONTROL, text=f"{CONTROL}{rule.text[len(rule.method) :]}"), ""
    text, why = ORPHANS_PROXY
    metric, rhs = text.split("==")
    suite = f".{rule.suite}" if rule.suite != "all" else ""
    proxy = Rule(f"{CONTROL}{suite}.{text}", CONTROL, rule.suite, metric, "==", rhs)
    return proxy, f"proxy {proxy.text} ({why}): "


def _control_states(report: AuditReport, suite: str) -> list[StateAudit]:
    return [s for s in report.states if s.method == CONTROL and not s.error and suite in ("all", s.suite)]


def control_outcome(
    report: AuditReport, rule: RuleLike, sessions: set[str], *, alpha: float, margin: float
) -> ControlOutcome:
    """The rule decided for the no-forget control on ``sessions`` by the same test (``verdict.decide``):
    ``fails`` when that verdict is *failed* on evidence (a control that could not be measured, or was not
    recorded, fails nothing)."""
    side = report.side
    how = "audit -m b0,..." if side == "white" else "eu-audit gate --positive-control"
    if not _control_states(report, rule.suite):
        return ControlOutcome(False, f"no positive control: B0 (no forget) not recorded here ({how})")
    if other_method(rule.rhs):
        return _showed_z(report, rule, sessions)
    same = report.model_copy(
        update={"states": [s for s in report.states if s.method != CONTROL or s.session_id in sessions]}
    )
    r, proxy = _control_rule(rule)
    decision = decide(same, r, alpha=alpha, margin=margin)
    got, ev = decision.result, decision.evidence
    if ev is None:  # nothing to weigh: the control shows nothing, so it fails nothing
        return ControlOutcome(False, f"{proxy}B0 (no forget) not measured here: {got.detail}", "unmeasured")
    broke, n = _broken(r, ev), len(ev.ds)
    metric = weighed_metric(r)
    need = n_to_fail(ev.ds, metric.kind, alpha) if metric is not None and got.outcome != "failed" else None
    said = f"{proxy}B0 (no forget) broke it in {broke} of {n} session(s) ({broke / n:.2f})"
    how = got.test + (f", p = {got.p:.3g}" if got.p is not None and metric is not None else "")
    verdict = f"and fails it ({how})" if got.outcome == "failed" else f"but does not fail it ({got.outcome})"
    return ControlOutcome(got.outcome == "failed", f"{said} {verdict}", got.outcome, broke / n, need, broke)


def _broken(rule: RuleLike, ev: Evidence) -> int:
    """Sessions where a state broke the rule: against a number, its value; against the floor, worse."""
    if other_method(rule.rhs) is None and rule.rhs != "floor":
        return sum(not OPS[rule.op](v, float(rule.rhs)) for v in ev.values)
    return sum(d > TOL for d in ev.ds)


def _showed_z(report: AuditReport, rule: RuleLike, sessions: set[str]) -> ControlOutcome:
    """A rule against another method (a paper's finding, no forget's hold): B0 showed z at all here."""
    metric = METRICS.get(rule.metric) if rule.metric in METRICS else None
    shown = n = 0
    for s in _control_states(report, rule.suite):
        v = value_of(s, rule.metric)
        if v is None or s.session_id not in sessions:
            continue
        n += 1
        shown += v < 1 - TOL if metric is not None and metric.direction == "high" else v > TOL
    if not n:
        return ControlOutcome(False, "B0 (no forget) not measured on these sessions", "unmeasured")
    text = f"B0 (no forget) showed z in {shown} of {n} session(s) ({shown / n:.2f})"
    return ControlOutcome(bool(shown), text, "failed" if shown else "held", shown / n, None, shown)
