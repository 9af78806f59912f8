"""A matrix of stacks x suites made from committed audit rows: one word and an n per cell, a link to the
report beside it, for a reader comparing stacks at a glance (``reports/agents/README.md``).

The index (a JSON file beside the reports) says only which audit backs which cell: each row is a stack (its
forget API and the model it ran on), each cell a report folder (``NAME``, or ``NAME/AUDIT`` where the
report holds several audits), or ``{"not measurable": "why", "report": NAME}`` (or ``"link"``: where
it says why). Every word is
decided again from the audit's rows by this eu-audit, the audit's own rules restricted to the cell's suite
(``agent.bfcl-memory.residue_store==0``): an audit written before a rule needed a positive control reads
*insensitive* today where it once read held, and a failure stays a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eu_audit.audits.model import AuditReport
from eu_audit.errors import BadInput
from eu_audit.trace.records import AGENT_METHOD

#: the rechecks column: the channel over every recheck event (``eu_audit.audits.channels.CHANNEL_KINDS``)
RECHECKS_COLUMN = "after restart / compaction / turns"


@dataclass(frozen=True)
class CellView:
    word: str  # held / failed / inconclusive / insensitive / not measurable, or a channel verdict
    n: int | None
    link: str  # the report, relative to the matrix's folder
    why: str = ""  # not measurable: why
    model: str = ""  # the model the audit ran on (none for a cell not measured)

    def markdown(self) -> str:
        n = f", n = {self.n}" if self.n is not None else ""
        return f"[{self.word}]({self.link}){n}"


def with_suite(rule: str, suite: str) -> str:
    """``agent.residue_store==0`` decided on one suite's sessions: ``agent.SUITE.residue_store==0``."""
    from eu_audit.audits.gate import parse_rule

    r = parse_rule(rule)
    return f"{r.method}.{suite}.{r.metric}{r.op}{r.rhs}"


def suite_verdict(rep: AuditReport, suite: str) -> tuple[str, int]:
    """The audit's rules on one suite's sessions, decided again: the worst outcome, and the sessions."""
    from eu_audit.audits.gate import PSEUDO_RULES, default_rules, evaluate, parse_rule
    from eu_audit.audits.rules import overall

    rules = [g.rule for g in rep.gates if g.rule not in PSEUDO_RULES] or default_rules(rep)
    mine = [
        r for r in rules if parse_rule(r).method == AGENT_METHOD and parse_rule(r).suite in ("all", suite)
    ]
    if len(rep.suites) > 1:
        mine = [with_suite(r, suite) if parse_rule(r).suite == "all" else r for r in mine]
    n = len({s.session_id for s in rep.states if s.method == AGENT_METHOD and s.suite == suite})
    return overall([g.outcome for g in evaluate(rep, mine)]), n


def recheck_word(rep: AuditReport) -> tuple[str, int] | None:
    """The headline verdict of the row over every recheck event, and the sessions rechecked; None when the
    run had no rechecks."""
    from eu_audit.audits.channel_kinds import CHANNEL_KINDS
    from eu_audit.audits.channels import channels
    from eu_audit.audits.model import FLOOR
    from eu_audit.audits.rules import CONTROL

    states = [s for s in rep.states if s.method == AGENT_METHOD and not s.error]
    floor = {s.session_id: s for s in rep.states if s.method == FLOOR and not s.error}
    control = {s.session_id: s for s in rep.states if s.method == CONTROL and not s.error} or None
    row = next((c for c in channels(states, floor, control) if c.name == CHANNEL_KINDS["after"].label), None)
    if row is None:
        return None
    return row.headline, sum(row.counts.values())


def _audit_files(reports: Path, ref: str) -> tuple[str, tuple[Path, ...]]:
    """The report folder a cell names and its audit's files (a shards folder is one run's audit)."""
    folder, _, audit = ref.partition("/")
    rows = reports / folder / "rows"
    try:
        manifest = json.loads((rows / "report.json").read_text())
    except (OSError, ValueError):
        raise BadInput("names no report folder with rows/report.json", path=str(reports / folder)) from None
    names = list(manifest.get("audits", []))
    if not audit:
        if len(names) != 1:
            why = f"holds {len(names)} audits: name one as {folder}/AUDIT"
            raise BadInput(why, path=str(reports / folder))
        audit = names[0]
    elif audit not in names:
        raise BadInput(f"no audit {audit!r} in this report (it has: {', '.join(names)})", path=str(rows))
    entry = rows / "audits" / audit
    files = tuple(sorted(entry.glob("*.json"))) if entry.is_dir() else (entry,)
    return folder, files


def cell(reports: Path, suite: str, value: Any, cache: dict[tuple[Path, ...], AuditReport]) -> CellView:
    """One cell of the matrix from its index entry."""
    from eu_audit.audits.merge import read_audits

    if isinstance(value, dict):
        why = str(value.get("not measurable", ""))
        link = value.get("link") or f"{value['report']}/report.md"
        return CellView("not measurable", None, link, why)
    folder, files = _audit_files(reports, str(value))
    rep = cache.get(files) or cache.setdefault(files, read_audits(files))
    link = f"{folder}/report.md"
    if suite == RECHECKS_COLUMN:
        got = recheck_word(rep)
        if got is None:
            raise BadInput(f"{value}: this audit ran no rechecks", path=str(reports / folder))
        return CellView(got[0], got[1], link, model=rep.model)
    if suite not in rep.suites:
        raise BadInput(f"{value}: this audit has no suite {suite!r} (it has {', '.join(rep.suites)})")
    word, n = suite_verdict(rep, suite)
    return CellView(word, n, link, model=rep.model)


def stack_matrix(index_path: Path) -> list[str]:
    """The matrix as Markdown lines, from an index of which audit backs which cell."""
    reports = index_path.parent
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"not a readable index ({exc})", path=str(index_path)) from None
    columns: list[str] = index["columns"]
    cache: dict[tuple[Path, ...], AuditReport] = {}
    lines = [
        "| stack (forget API) | model | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for i, row in enumerate(index["rows"]):
        cells: list[CellView | None] = []
        for col in columns:
            value = row["cells"].get(col)
            try:
                cells.append(None if value is None else cell(reports, col, value, cache))
            except KeyError as exc:
                raise BadInput(f"rows[{i}].cells[{col!r}]: missing {exc}", path=str(index_path)) from None
        models = sorted({c.model for c in cells if c is not None and c.model})
        shown = " | ".join(c.markdown() if c is not None else "-" for c in cells)
        lines.append(f"| {row['stack']} | {', '.join(models) or '-'} | {shown} |")
    return lines
