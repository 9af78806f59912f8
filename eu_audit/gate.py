"""CI gates over an audit: ``b7.leak_probes<=floor``, ``b7.cad==0``, ``b7.agentdojo.agreement>=0.99``.

A rule is ``METHOD[.SUITE].METRIC OP VALUE`` with OP one of ``<= >= == != < >`` and VALUE a number or
``floor`` (B5's value on the same suite). Without a suite the rule reads the pooled cell (suite "all").
Gates fail closed: a missing value fails the rule, and an errored state fails the run.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eu_audit.audits.metric import METRICS
from eu_audit.audits.model import AuditReport, GateResult
from eu_audit.errors import BadInput

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_RULE = re.compile(r"^\s*([\w-]+)(?:\.([\w-]+))?\.(\w+)\s*(<=|>=|==|!=|<|>)\s*(floor|[-+]?\d*\.?\d+)\s*$")
_TOL = 1e-9


@dataclass(frozen=True)
class Rule:
    text: str
    method: str
    suite: str
    metric: str
    op: str
    rhs: str


def parse_rule(text: str) -> Rule:
    m = _RULE.match(text)
    if not m:
        raise BadInput(f"gate '{text}': expected METHOD[.SUITE].METRIC OP VALUE, e.g. b7.leak_probes<=floor")
    method, suite, metric, op, rhs = m.groups()
    if metric not in METRICS:
        raise BadInput(f"gate '{text}': unknown metric '{metric}' (known: {', '.join(METRICS.names())})")
    return Rule(text, method.lower(), suite or "all", metric, op, rhs)


def check_rules(
    rules: Sequence[str], methods: Sequence[str] | None = None, suites: Sequence[str] | None = None
) -> list[Rule]:
    """Parse every rule before any model runs; with ``methods`` and ``suites`` (what the audit will
    measure), a rule naming another method or suite is refused too, instead of failing after the run."""
    parsed = [parse_rule(r) for r in rules]
    for r in parsed:
        if methods is not None and r.method not in methods:
            raise BadInput(
                f"gate '{r.text}': method '{r.method}' is not audited here (audited: {', '.join(methods)})"
            )
        if suites is not None and r.suite != "all" and r.suite not in suites:
            raise BadInput(
                f"gate '{r.text}': suite '{r.suite}' is not in this bundle (its suites: {', '.join(suites)}; "
                "or leave the suite out for all of them)"
            )
    return parsed


def evaluate(report: AuditReport, rules: Sequence[str]) -> list[GateResult]:
    parsed = [parse_rule(r) for r in rules]
    results = []
    for r in parsed:
        cell = next((c for c in report.cells if c.method == r.method and c.suite == r.suite), None)
        if cell is None:
            results.append(GateResult(rule=r.text, held=False, detail=f"no audit of {r.method} on {r.suite}"))
            continue
        value = cell.values.get(r.metric)
        if r.rhs == "floor" and not report.floor:
            results.append(
                GateResult(rule=r.text, held=False, detail="not measured: the audit ran without the floor")
            )
            continue
        rhs = cell.floor.get(r.metric) if r.rhs == "floor" else float(r.rhs)
        if value is None or rhs is None:
            why = cell.unmeasured.get(r.metric, "no value")
            results.append(GateResult(rule=r.text, held=False, detail=f"{r.metric}: {why} (fails closed)"))
            continue
        held = _OPS[r.op](value, rhs) or (r.op in ("<=", ">=", "==") and abs(value - rhs) <= _TOL)
        detail = f"{r.method}.{r.suite}.{r.metric} = {value:.4g} {r.op} {rhs:.4g}" + (
            " (floor)" if r.rhs == "floor" else ""
        )
        results.append(GateResult(rule=r.text, held=held, detail=detail))
    if report.errors:
        results.append(
            GateResult(
                rule="no errored states",
                held=False,
                detail=f"{report.errors} state(s) errored; an error is a failure, never skipped",
            )
        )
    return results
