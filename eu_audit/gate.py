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

from eu_audit.audit import METRICS, AuditReport, GateResult
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
        raise BadInput(f"gate '{text}': unknown metric '{metric}' (known: {', '.join(METRICS)})")
    return Rule(text, method.lower(), suite or "all", metric, op, rhs)


def evaluate(report: AuditReport, rules: Sequence[str]) -> list[GateResult]:
    parsed = [parse_rule(r) for r in rules]
    results = []
    for r in parsed:
        cell = next((c for c in report.cells if c.method == r.method and c.suite == r.suite), None)
        if cell is None:
            results.append(GateResult(rule=r.text, held=False, detail=f"no audit of {r.method} on {r.suite}"))
            continue
        value = cell.values.get(r.metric)
        rhs = cell.floor.get(r.metric) if r.rhs == "floor" else float(r.rhs)
        if value is None or rhs is None:
            results.append(
                GateResult(rule=r.text, held=False, detail=f"{r.metric} has no value (fails closed)")
            )
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
