"""How an audit is shown: Rich tables shaped like the paper's Tables 1-3, a summary in words, JUnit XML.

The tables keep their width whatever the number of suites: methods (and the floor) are rows, a table's
metrics are columns, and each suite is a section of rows. The Markdown report has the same tables.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from rich.table import Table
from rich.text import Text

from eu_audit.audits.metric import TABLE_TITLES, Metric, junit_metrics, table_metrics
from eu_audit.audits.model import FLOOR, SERVING, AuditReport, Cell
from eu_audit.stats import stars

CAPTION = "* p<0.05, ** p<0.01 vs the B5 floor (McNemar exact / Wilcoxon, paired)"


def fmt(metric: Metric, cell: Cell | None, *, with_stars: bool = True) -> str:
    if cell is None:
        return "-"
    value = cell.values.get(metric.name)
    if value is None and metric.name in cell.unmeasured:
        return "n/m"  # not measurable (the reason is in the JSON and the summary)
    return metric.format(value) + (stars(cell.p.get(metric.name)) if with_stars else "")


def row_order(report: AuditReport) -> list[str]:
    """Methods in the paper's order, the floor last (the serving layer is not a method: not a row)."""
    methods = [m for m in report.methods if m != SERVING]
    return [m for m in methods if m != FLOOR] + [m for m in methods if m == FLOOR]


def shown_suites(report: AuditReport) -> list[str]:
    return [*report.suites, "all"] if len(report.suites) > 1 else list(report.suites)


def tables(report: AuditReport) -> list[Table]:
    out = []
    for number, title in TABLE_TITLES.items():
        metrics = [
            m for m in table_metrics(number) if any(c.values.get(m.name) is not None for c in report.cells)
        ]
        if not metrics:
            continue
        t = Table(title=title, caption=CAPTION if report.floor else "no floor: nothing is compared")
        t.add_column("suite", style="bold")
        t.add_column("method", style="bold")
        for m in metrics:
            t.add_column(m.label, justify="right")
        for i, suite in enumerate(shown_suites(report)):
            if i:
                t.add_section()
            for method in row_order(report):
                name = f"{method} (floor)" if method == FLOOR else method
                cells = [fmt(m, report.cell(method, suite)) for m in metrics]
                # user-controlled names never pass through Rich markup
                t.add_row(Text(suite), Text(name), *cells, style="dim" if method == FLOOR else None)
            self_floor = report.floor_self.get(suite, {})
            if self_floor and any(self_floor.get(m.name) is not None for m in metrics):
                t.add_row(
                    Text(suite),
                    "B5 vs B5 (other seeds)",
                    *[m.format(self_floor.get(m.name)) if m.name in self_floor else "" for m in metrics],
                    style="italic",
                )
        out.append(t)
    return out


def verdicts(report: AuditReport) -> dict[str, str]:
    """method -> forgets / only stops saying / still leaks, from the pooled cell against the floor.
    Without a floor nothing is compared: every method is "not measured (no floor)", never "forgets"."""
    out = {}
    for method in report.methods:
        if method in (FLOOR, SERVING):
            continue
        c = report.cell(method, "all")
        if c is None or c.errors:
            out[method] = "errored"
            continue
        if not report.floor:
            out[method] = "not measured (no floor)"
            continue

        def above(metric: str, cell: Cell = c) -> bool:
            v, f = cell.values.get(metric), cell.floor.get(metric)
            return v is not None and f is not None and v > f + report.margin

        says = above("leak_any") or above("leak5")
        behaves = above("leak_probes") or above("cad") or above("avoid")
        keeps = above("residue_context") or above("residue_store")
        out[method] = (
            "still leaks"
            if says
            else "only stops saying"
            if behaves
            else "still holds the target"
            if keeps
            else "forgets"
        )
    return out


def summary_lines(report: AuditReport) -> list[str]:
    v = verdicts(report)
    groups: dict[str, list[str]] = {}
    for m, verdict in v.items():
        groups.setdefault(verdict, []).append(m)
    n_states = len({s.session_id for s in report.states})
    lines = [
        f"{n_states} session(s) over {', '.join(report.suites)}; model {report.model} on {report.engine}; "
        f"k={report.k} samples at T={report.temperature}; margin {report.margin}."
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
    if groups.get("still holds the target"):
        lines.append(
            "Say nothing of it, but still hold the target where the next turn reads it (prompts, store): "
            + ", ".join(groups["still holds the target"])
            + "."
        )
    lines += residue_lines(report)
    if groups.get("not measured (no floor)"):
        lines.append(
            "Not measured without the B5 floor (run with --floor to compare): "
            + ", ".join(groups["not measured (no floor)"])
            + "."
        )
    if groups.get("errored"):
        lines.append(f"Errored (counted as failures): {', '.join(groups['errored'])}.")
    dropped = {s: p for s, p in report.probes_dropped.items() if p}
    if dropped:
        lines.append(
            "Probes dropped (they leak on B5 itself): "
            + "; ".join(f"{s}: {', '.join(p)}" for s, p in dropped.items())
            + "."
        )
    unmeasured = sorted(
        {(c.method, m, why) for c in report.cells if c.suite == "all" for m, why in c.unmeasured.items()}
    )
    for method, m, why in unmeasured:
        lines.append(f"{method}.{m}: {why}.")
    serving = report.cell(SERVING, "all")
    if serving is not None:
        r, e = serving.values.get("residual_cached_tokens"), serving.values.get("reset_effective")
        lines.append(
            "Serving layer: the server still serves "
            + ("an unknown number of" if r is None else f"{r:.1f}")
            + " cached token(s) of the prefix that carried z, beyond a decoy's (mean per session); after "
            + "its own reset, "
            + ("unknown" if e is None else f"{e:.0%} of sessions")
            + " clean."
        )
    if report.cost:
        c = report.cost
        line = f"Cost: {c.get('wall_s')} s wall on {c.get('engine')}"
        if c.get("cores"):
            line += (
                f", {c.get('cores')} cores, {c.get('wall_s_per_session')} s per session "
                f"({c.get('resumed_states', 0)} state(s) resumed)"
            )
        if c.get("branches"):
            line += f"; probes and samples decoded {c.get('branches')}"
        if c.get("methods_s") or c.get("audit_s"):
            line += (
                f". Over every state, resumed ones included: the methods' own time {c.get('methods_s')} s "
                f"(their ledgers), the audits' {c.get('audit_s')} s"
            )
        lines.append(line + ".")
    return lines


def residue_lines(report: AuditReport) -> list[str]:
    """Where a black-box agent still held the target after its forget, in words, with one example."""
    lines = []
    for method in row_order(report):
        states = [s for s in report.states if s.method == method and s.residue]
        ctx: dict[str, int] = {}
        store: dict[str, int] = {}
        for st in states:
            for k, v in st.residue.get("context_tiers", {}).items():
                ctx[k] = ctx.get(k, 0) + v
            for k, v in st.residue.get("store_tiers", {}).items():
                store[k] = store.get(k, 0) + v
        if ctx:
            example = next(s.residue["context_example"] for s in states if s.residue.get("context_example"))
            where = ", ".join(f"{k} ({v} calls)" for k, v in sorted(ctx.items(), key=lambda kv: -kv[1]))
            key = next((s.residue.get("control_key") for s in states if s.residue.get("control_key")), "")
            marked = f" (requests marked post-forget under control key {key})" if key else ""
            lines.append(
                f"{method}: after the forget, z still reached the model in: {where}; e.g. {example!r}{marked}"
            )
        if store:
            example = next(s.residue["store_example"] for s in states if s.residue.get("store_example"))
            where = ", ".join(f"{k} ({v} items)" for k, v in sorted(store.items(), key=lambda kv: -kv[1]))
            lines.append(f"{method}: its store dump still holds z in: {where}; e.g. {example!r}")
    return lines


def junit_xml(report: AuditReport) -> str:
    """One test case per method x suite x audit: it passes when the method is at the floor (within the
    margin, in the audit's good direction). An errored state is an error, never a skip; a comparison
    that could not be made (no floor, an unmeasurable audit) fails."""
    suites = ET.Element("testsuites", name="eu-audit")
    for suite in report.suites:
        ts = ET.SubElement(suites, "testsuite", name=f"eu-audit.{suite}")
        n = fails = errs = 0
        for method in report.methods:
            c = report.cell(method, suite)
            if c is None or method in (FLOOR, SERVING):
                continue
            for metric in junit_metrics():
                v, f = c.values.get(metric.name), c.floor.get(metric.name)
                if v is None and not c.errors and metric.name not in c.unmeasured:
                    continue  # the audit does not apply to this suite
                n += 1
                tc = ET.SubElement(ts, "testcase", classname=f"{suite}.{method}", name=metric.name)
                if c.errors:
                    errs += 1
                    ET.SubElement(tc, "error", message=f"{c.errors} errored state(s)")
                    continue
                why = None
                if v is None:
                    why = c.unmeasured.get(metric.name, "no value")
                elif not report.floor or f is None:
                    why = "not measured: no B5 floor to compare with"
                elif not metric.at_floor(v, f, report.margin):
                    why = f"{metric.name} = {v:.4g}, floor {f:.4g} (margin {report.margin})"
                if why is not None:
                    fails += 1
                    ET.SubElement(tc, "failure", message=why)
        ts.set("tests", str(n))
        ts.set("failures", str(fails))
        ts.set("errors", str(errs))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
