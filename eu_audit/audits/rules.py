"""What every verdict reads of a gate rule: its shape (``RuleLike``), its operators, and one value.

Kept apart from ``gate`` (which parses rules and names gate sets), ``verdict`` (which decides one rule on
one method's states) and ``sensitivity`` (which earns a hold against the no-forget control), so each of
them reads the same definitions and none imports another to get them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from eu_audit.audits.channel_kinds import channel_value
from eu_audit.audits.model import StateAudit


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


@dataclass(frozen=True)
class Rule:
    """A parsed gate rule (``gate.parse_rule``), and the rules the verdicts derive from a user's: one suite
    of it, the same rule held against the no-forget control (``parts_of``)."""

    text: str
    method: str
    suite: str
    metric: str
    op: str
    rhs: str


def parts_of(rule: RuleLike, **change: str) -> Rule:
    """``rule`` as ``Rule``, with the fields in ``change`` replaced (the text is kept as written)."""
    parts = Rule(rule.text, rule.method, rule.suite, rule.metric, rule.op, rule.rhs)
    return replace(parts, **change)


def other_method(rhs: str) -> str | None:
    """The method a rule's right side names (``b1.leak_any>=b0``: "b0"); None for ``floor`` or a number."""
    return rhs if rhs != "floor" and rhs[:1].isalpha() else None


TOL = 1e-9
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b + TOL,
    ">=": lambda a, b: a >= b - TOL,
    "==": lambda a, b: abs(a - b) <= TOL,
    "<": operator.lt,
    ">": operator.gt,
}


def value_of(state: StateAudit, name: str) -> float | None:
    """A metric's value on a state, or a channel's count (``store.history``: ``eu_audit.audits.channels``)."""
    if "." in name:
        kind, tier = name.split(".", 1)
        return channel_value(state, kind, tier)
    return state.values.get(name)


#: the positive control of every rule: the state that never got the forget (the paper's B0; on a black-box
#: run the tenant driven like the agent and never sent the forget)
CONTROL = "b0"
#: the test of a hold decided by equality: a state that is the floor's token for token on an exact engine
EQUALITY = "equality (deterministic states)"

#: the order in which one word sums up several rules (or one rule's suites): the worst outcome any gave
OUTCOME_ORDER = ("failed", "inconclusive", "insensitive", "held")


def outcome_order(outcome: str) -> int:
    """An outcome's place in ``OUTCOME_ORDER`` (0 the worst)."""
    return OUTCOME_ORDER.index(outcome) if outcome in OUTCOME_ORDER else len(OUTCOME_ORDER)


def overall(outcomes: Iterable[str]) -> str:
    """One word for a set of rule outcomes: the worst of them; "no rules" when nothing was gated."""
    seen = set(outcomes)
    return next((o for o in OUTCOME_ORDER if o in seen), "no rules")
