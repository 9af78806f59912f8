"""Sensitivity: could a verdict have come out the other way? A rule's *positive control*.

A hold says "the forget left nothing here" only where the measurement would have seen z had it been
there. On a white-box bundle the control of every rule on a metric that measures z (``Metric.control``)
is the state that never got the forget, B0: on the rule's suite it must have broken the rule (against
the floor: been worse than the floor's state) in at least one session. Where it never did, the rule is
*insensitive*: this measurement did not see z even without the forget, so it cannot tell a forget from
none, and it never counts as a hold (``eu_audit.audits.gate.exit_code``: exit 4 like inconclusive, unless
``--on-insensitive pass``). A state equal to the floor's token for token on an exact engine needs no
control: it is B5's state. On a black-box run the control is the no-forget tenant (``record --agent
--positive-control``, on by default), named B0 too: driven like the agent, never sent the forget; its
channels, probes and samples are what the agent would show had it not forgotten.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from eu_audit.audits.channels import channel_value
from eu_audit.audits.metric import METRICS
from eu_audit.audits.model import FLOOR, AuditReport, GateResult, StateAudit


class RuleLike(Protocol):
    """What a verdict and its control read of a parsed gate rule (``gate.Rule``)."""

    @property
    def text(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def suite(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def rhs(self) -> str: ...


def other_method(rhs: str) -> str | None:
    """The method a rule's right side names (``b1.leak_any>=b0``: "b0"); None for ``floor`` or a number."""
    return rhs if rhs != "floor" and rhs[:1].isalpha() else None


OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b + TOL,
    ">=": lambda a, b: a >= b - TOL,
    "==": lambda a, b: abs(a - b) <= TOL,
    "<": operator.lt,
    ">": operator.gt,
}
TOL = 1e-9


def value_of(state: StateAudit, name: str) -> float | None:
    """A metric's value on a state, or a channel's count (``store.history``: ``eu_audit.audits.channels``)."""
    if "." in name:
        kind, tier = name.split(".", 1)
        return channel_value(state, kind, tier)
    return state.values.get(name)


#: the positive control of a white-box rule: the state that never got the forget (the paper's B0)
CONTROL = "b0"
EQUALITY = "equality (deterministic states)"


@dataclass(frozen=True)
class Control:
    """What the positive control showed on a rule's suite: ``shown`` of ``n`` sessions where the state
    without the forget broke the rule (against the floor: was worse than the floor's state)."""

    shown: int
    n: int
    side: str = "white"

    @property
    def rate(self) -> float | None:
        return self.shown / self.n if self.n else None

    def text(self, rhs: str) -> str:
        """What the control showed, in the rule's terms (``rhs``: floor, another method, a number)."""
        if not self.n:
            how = "audit -m b0,..." if self.side == "white" else "record --agent --positive-control"
            return f"no positive control: {CONTROL.upper()} (no forget) not recorded here ({how})"
        what = (
            "worse than the floor"
            if rhs == "floor"
            else "showed z"
            if other_method(rhs)
            else "broke the rule"
        )
        rate = f"{self.shown / self.n:.2f}"
        return f"{CONTROL.upper()} (no forget) {what} in {self.shown} of {self.n} session(s) ({rate})"


#: a recheck's channel (``after.restart``) has no twin on the control, which is never sent the forget:
#: its control is whether the no-forget state kept z at all, in a prompt or its store
KEPT = ("residue_context", "residue_store")


#: an orphan is what a forget's delete leaves when a cascade does not fire: the state never sent the forget
#: has none by construction, so its control is whether that state held z in the files at all (what a
#: forget would have had to delete)
ORPHANS = "disk.orphans"


def control_value(state: StateAudit, name: str) -> float | None:
    """The control's value of a rule's metric or channel (``after.*``: what it kept, ``KEPT``;
    ``disk.orphans``: z in the files it read, ``ORPHANS``)."""
    if name.startswith("after."):
        got = [v for m in KEPT if (v := state.values.get(m)) is not None]
        return max(got) if got else None
    if name == ORPHANS:
        return state.values.get("residue_disk")
    return value_of(state, name)


def needs_control(name: str) -> bool:
    """A channel (z in one place) always; a metric when it measures z (``Metric.control``)."""
    if "." in name:
        return True
    return name in METRICS and METRICS.get(name).control


def positive_control(report: AuditReport, rule: RuleLike) -> Control | None:
    """What the state without the forget (B0: the white-box method, or the black-box run's no-forget
    tenant) showed for this rule on its sessions; None where the rule needs no control (cost, utility)."""
    if not needs_control(rule.metric):
        return None
    side = report.side
    mine = [
        s for s in report.states if s.method == CONTROL and not s.error and rule.suite in ("all", s.suite)
    ]
    floor = {s.session_id: s for s in report.states if s.method == FLOOR and not s.error}
    sign = -1.0 if rule.op in (">=", ">") else 1.0
    presence = "." in rule.metric and rule.rhs == "floor"  # a channel against the floor: presence
    metric = METRICS.get(rule.metric) if rule.metric in METRICS else None
    shown = n = 0
    for s in mine:
        v = control_value(s, rule.metric)
        if v is None:
            continue
        if other_method(rule.rhs):  # against another method: B0 showed z at all
            broke = v < 1 - TOL if metric is not None and metric.direction == "high" else v > TOL
        elif rule.rhs == "floor":
            f = floor.get(s.session_id)
            fv = control_value(f, rule.metric) if f is not None else None
            if fv is None:
                continue
            broke = (bool(v) and not fv) if presence else sign * (v - fv) > TOL
        else:
            broke = not OPS[rule.op](v, float(rule.rhs))
        n += 1
        shown += broke
    return Control(shown, n, side)


def controlled(
    report: AuditReport, rule: RuleLike, result: GateResult, *, floors_own: bool = False
) -> GateResult:
    """``result`` with its positive control, and *insensitive* in place of held or inconclusive where the
    control never showed what the rule looks for: the measurement could not have told a forget from none.
    A state equal to the floor's token for token on an exact engine needs no control (it is B5's state)."""
    ctrl = positive_control(report, rule)
    if ctrl is None or result.test == EQUALITY or (floors_own and result.outcome == "held"):
        return result
    text = ctrl.text(rule.rhs)
    update: dict[str, object] = {"control": text, "control_rate": ctrl.rate}
    if ctrl.shown == 0 and result.outcome in ("held", "inconclusive"):
        update["outcome"] = "insensitive"
        update["detail"] = (
            f"{text}: this measurement did not see z even without the forget, so it cannot tell a forget "
            f"from none at this n (was {result.outcome}: {result.detail})"
        )
    return result.model_copy(update=update)
