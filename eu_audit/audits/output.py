"""How an audit is shown: Rich tables shaped like the paper's Tables 1-3, a summary in words, JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from rich.table import Table

from eu_audit.audit import FLOOR, METRICS, AuditReport, Cell
from eu_audit.stats import stars

#: (title, [(metric, column label)]) — Table 1 leakage, Table 2 actions/utility/cost, Table 3 behavior
TABLES: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Table 1 - leakage (rate of states that leak)",
        [("leak_probes", "Leak@probes"), ("leak5", "Leak@k"), ("leak_any", "any")],
    ),
    (
        "Table 2 - actions, utility, cost",
        [("cad", "CAD"), ("utility", "utility"), ("recomputed", "recomputed")],
    ),
    (
        "Table 3 - behavior and distribution under sampling",
        [("avoid", "avoid"), ("says_it", "says it"), ("agreement", "agree"), ("embed", "emb dist")],
    ),
]
#: which audits each suite answers (a column group only where it applies)
JUNIT_AUDITS = ["leak_probes", "leak5", "leak_any", "cad", "utility", "avoid", "agreement"]


def _fmt(value: float | None, p: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:.0f}" if value >= 100 else f"{value:.2f}"
    return text + stars(p)


def _cell(report: AuditReport, method: str, suite: str) -> Cell | None:
    return next((c for c in report.cells if c.method == method and c.suite == suite), None)


def tables(report: AuditReport) -> list[Table]:
    out = []
    suites = [*report.suites, "all"] if len(report.suites) > 1 else report.suites
    for title, cols in TABLES:
        shown = [(m, lab) for m, lab in cols if any(c.values.get(m) is not None for c in report.cells)]
        if not shown:
            continue
        t = Table(
            title=title, caption="* p<0.05, ** p<0.01 vs the B5 floor (McNemar exact / Wilcoxon, paired)"
        )
        t.add_column("method", style="bold")
        for suite in suites:
            for _, lab in shown:
                t.add_column(f"{suite}\n{lab}", justify="right")
        for method in [m for m in report.methods if m != FLOOR] + [m for m in report.methods if m == FLOOR]:
            row = [f"{method} (floor)" if method == FLOOR else method]
            for suite in suites:
                c = _cell(report, method, suite)
                row += [_fmt(c.values.get(m), c.p.get(m)) if c else "-" for m, _ in shown]
            t.add_row(*row, style="dim" if method == FLOOR else None)
        self_floor = [(m, lab) for m, lab in shown if m in ("agreement", "embed")]
        if report.floor_self and self_floor:
            row = ["B5 vs B5 (other seeds)"]
            for suite in suites:
                fs = report.floor_self.get(suite, {})
                row += [_fmt(fs.get(m)) if (m, lab) in self_floor else "" for m, lab in shown]
            t.add_row(*row, style="italic")
        out.append(t)
    return out


def verdicts(report: AuditReport) -> dict[str, str]:
    """method -> forgets / only stops saying / still leaks, from the pooled cell against the floor."""
    out = {}
    for method in report.methods:
        if method == FLOOR:
            continue
        c = _cell(report, method, "all")
        if c is None or c.errors:
            out[method] = "errored"
            continue

        def above(metric: str, cell: Cell = c) -> bool:
            v, f = cell.values.get(metric), cell.floor.get(metric)
            return v is not None and f is not None and v > f + report.margin

        says = above("leak_any") or above("leak5")
        behaves = above("leak_probes") or above("cad") or above("avoid")
        out[method] = "still leaks" if says else "only stops saying" if behaves else "forgets"
    return out


def summary_lines(report: AuditReport) -> list[str]:
    v = verdicts(report)
    groups: dict[str, list[str]] = {}
    for m, verdict in v.items():
        groups.setdefault(verdict, []).append(m)
    n_states = len({s.session_id for s in report.states})
    lines = [
        f"{n_states} session(s) over {', '.join(report.suites)}; model {report.model}; k={report.k} samples "
        f"at T={report.temperature}; margin {report.margin}."
    ]
    if groups.get("forgets"):
        lines.append(
            f"Forget (at the B5 floor on leakage, probes, CAD and behavior): {', '.join(groups['forgets'])}."
        )
    if groups.get("only stops saying"):
        lines.append(
            "Only stop saying (no string leak, but probes, actions or choices still differ from B5): "
            + ", ".join(groups["only stops saying"])
            + "."
        )
    if groups.get("still leaks"):
        lines.append(f"Still leak the target in what they say or do: {', '.join(groups['still leaks'])}.")
    if groups.get("errored"):
        lines.append(f"Errored (counted as failures): {', '.join(groups['errored'])}.")
    dropped = {s: p for s, p in report.probes_dropped.items() if p}
    if dropped:
        lines.append(
            "Probes dropped (they leak on B5 itself): "
            + "; ".join(f"{s}: {', '.join(p)}" for s, p in dropped.items())
            + "."
        )
    return lines


def junit_xml(report: AuditReport, audits: Sequence[str] = JUNIT_AUDITS) -> str:
    """One test case per method x suite x audit: it passes when the method is at the floor (within the
    margin, in the audit's good direction); an errored state is an error, never a skip."""
    suites = ET.Element("testsuites", name="eu-audit")
    for suite in report.suites:
        ts = ET.SubElement(suites, "testsuite", name=f"eu-audit.{suite}")
        n = fails = errs = 0
        for method in report.methods:
            c = _cell(report, method, suite)
            if c is None:
                continue
            for metric in audits:
                v, f = c.values.get(metric), c.floor.get(metric)
                if v is None and not c.errors:
                    continue
                n += 1
                tc = ET.SubElement(ts, "testcase", classname=f"{suite}.{method}", name=metric)
                if c.errors:
                    errs += 1
                    ET.SubElement(tc, "error", message=f"{c.errors} errored state(s)")
                    continue
                assert v is not None
                good = METRICS[metric][0]
                ok = f is None or (v <= f + report.margin if good == "low" else v >= f - report.margin)
                if not ok:
                    fails += 1
                    ET.SubElement(
                        tc, "failure", message=f"{metric} = {v:.4g}, floor {f:.4g} (margin {report.margin})"
                    )
        ts.set("tests", str(n))
        ts.set("failures", str(fails))
        ts.set("errors", str(errs))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
