"""What one page of ``eu-audit view`` shows, computed from an audit report: the verdict first, the channel
matrix, the paper's tables, each session's evidence. Plain data for the templates (``eu_audit.view.site``);
every word and number here is read from the audit, through the same functions the terminal summary, the
JUnit file and the Markdown report use, so the four never disagree."""

from __future__ import annotations

from dataclasses import dataclass, field

from eu_audit.audits.gate import gate_results
from eu_audit.audits.metric import METRICS, TABLE_TITLES, table_metrics
from eu_audit.audits.model import FLOOR, AuditReport, GateResult, StateAudit, StateResidue
from eu_audit.audits.output import fmt, row_order, shown_suites
from eu_audit.audits.rules import CONTROL, overall

#: a session's text shown in full up to this many characters (the rest one click away in the JSON)
QUOTE_CHARS = 400


def short(text: str, limit: int = QUOTE_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class RuleRow:
    """One rule's verdict as the page's first table shows it."""

    rule: str
    outcome: str
    n: int
    test: str
    bound: str  # the one-sided p and the bound(s) of the mean difference, where the test has them
    decide: str  # inconclusive: "n >= N would decide"
    control: str
    detail: str
    was: str = ""  # the outcome the audit file recorded, where today's rules decide it otherwise

    @classmethod
    def of(cls, g: GateResult, was: str = "") -> RuleRow:
        parts = []
        if g.p is not None:
            parts.append(f"p = {g.p:.3g}")
        if g.interval is not None:
            lo, hi = g.interval
            if hi is not None:
                parts.append(f"upper bound {hi:.3g}" + (f", lower {lo:.3g}" if lo is not None else ""))
        # more sessions decide only an inconclusive rule; an insensitive one needs a control that sees z
        decide = f"n >= {g.n_needed} would decide" if g.n_needed and g.outcome == "inconclusive" else ""
        return cls(g.rule, g.outcome, g.n, g.test, "; ".join(parts), decide, g.control, g.detail, was)


@dataclass
class MatrixCell:
    verdict: str  # a channel verdict (``eu_audit.audits.channels.VERDICTS``)
    where: str  # the quoted place, or why unknown
    floor_too: bool  # B5's state of the same session had z there too


@dataclass
class Matrix:
    """Sessions x channels for one black-box method; each cell one session's verdict on one channel."""

    method: str
    channels: list[str]
    headline: list[MatrixCell]  # the verdict over all sessions, per channel
    rows: list[tuple[str, list[MatrixCell | None]]]  # session id -> one cell per channel (None: no row)


@dataclass
class TableView:
    """One of the paper's tables: methods as rows, its metrics as columns, a section per suite."""

    title: str
    columns: list[str]
    sections: list[tuple[str, int, list[tuple[str, list[str]]]]]  # suite, n, (method, cells)


@dataclass
class StateView:
    """One method's post-forget state of one session: what each probe answered, where z stayed."""

    method: str
    error: str | None
    leaks: list[tuple[str, str]]  # metric -> value, the ones that measured z
    probes: list[tuple[str, bool, str]]
    samples: list[str]
    places: list[tuple[str, str]]  # (where, quoted example or count) for every place z was found
    forget: str  # what the forget changed (a black-box agent's own forget)


@dataclass
class SessionView:
    session_id: str
    episode_id: str
    suite: str
    states: list[StateView]


@dataclass
class AuditPage:
    """Everything ``audit.html`` shows of one audit."""

    slug: str
    title: str
    source: str
    report: AuditReport
    verdict: str
    rules: list[RuleRow]
    tampering: list[tuple[str, str, str, int, str]]
    matrices: list[Matrix]
    tables: list[TableView]
    equality: list[str]
    sessions: list[SessionView]
    facts: list[tuple[str, str]]
    charts: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)

    @property
    def n_sessions(self) -> int:
        return len({s.session_id for s in self.report.states})


def decided_now(rep: AuditReport) -> list[tuple[GateResult, str]]:
    """The audit's rules decided again by this eu-audit from the audit's rows (an audit written before a
    rule needed a positive control may have recorded a hold that is insensitive today), each with the
    outcome the file recorded where that differs. A rule today's eu-audit cannot parse keeps its record."""
    from eu_audit.audits.gate import PSEUDO_RULES, evaluate
    from eu_audit.errors import BadInput

    recorded = {g.rule: g for g in rep.gates}
    rules = [r for r in recorded if r not in PSEUDO_RULES]
    try:
        again = evaluate(rep, rules) if rules else gate_results(rep)
    except BadInput:
        return [(g, "") for g in gate_results(rep)]
    out: list[tuple[GateResult, str]] = []
    for g in again:
        old = recorded.get(g.rule)
        out.append((g, old.outcome if old is not None and old.outcome != g.outcome else ""))
    return out


def matrices(rep: AuditReport) -> list[Matrix]:
    """A black-box audit's channel matrix per method (its agent, and any other method driven from outside):
    each session's verdict on each channel, from the same reading the summary's channel lines use."""
    from eu_audit.audits.channels import channels

    if rep.side != "black":
        return []
    floor = _by_session(rep, FLOOR) if rep.floor else None
    control = _by_session(rep, CONTROL) or None
    out = []
    for method in row_order(rep):
        if method in (FLOOR, CONTROL):
            continue
        states = [s for s in rep.states if s.method == method and not s.error]
        if not states:
            continue
        overall_channels = channels(states, floor, control)
        names = [c.name for c in overall_channels]
        headline = [
            MatrixCell(c.headline, _where(c.example or c.why_unknown), c.floor_too > 0)
            for c in overall_channels
        ]
        rows = []
        for s in states:
            mine = {c.name: c for c in channels([s], floor, control)}
            cells = [
                MatrixCell(c.headline, _where(c.example or c.why_unknown), c.floor_too > 0)
                if (c := mine.get(name)) is not None
                else None
                for name in names
            ]
            rows.append((s.session_id, cells))
        out.append(Matrix(method, names, headline, rows))
    return out


def _where(text: str) -> str:
    return short(" ".join(text.split()), 240)


def _by_session(rep: AuditReport, method: str) -> dict[str, StateAudit]:
    return {s.session_id: s for s in rep.states if s.method == method and not s.error}


def paper_tables(rep: AuditReport) -> list[TableView]:
    """The audit's tables as the terminal prints them (the paper's Tables 1-3), one section per suite."""
    out = []
    for number, title in TABLE_TITLES.items():
        metrics = [
            m for m in table_metrics(number) if any(c.values.get(m.name) is not None for c in rep.cells)
        ]
        if not metrics:
            continue
        sections = []
        for suite in shown_suites(rep):
            rows = []
            for method in row_order(rep):
                cell = rep.cell(method, suite)
                if cell is None:
                    continue
                name = f"{method} (floor)" if method == FLOOR else method
                rows.append((name, [fmt(m, cell) for m in metrics]))
            n = next((c.n for c in rep.cells if c.suite == suite), 0)
            sections.append((suite, n, rows))
        out.append(TableView(title, [m.label for m in metrics], sections))
    return out


def equality_lines(rep: AuditReport) -> list[str]:
    """White-box: in how many sessions each method's state equals B5's (the same cache token ids and
    memory store, by digest): B7 == B5 token for token is the paper's exactness claim."""
    floor = {s.session_id: s.state_digest for s in rep.states if s.method == FLOOR and s.state_digest}
    if not floor:
        return []
    lines = []
    for method in row_order(rep):
        if method == FLOOR:
            continue
        got = [s for s in rep.states if s.method == method and s.state_digest and s.session_id in floor]
        if got:
            same = sum(s.state_digest == floor[s.session_id] for s in got)
            lines.append(
                f"{method}: state equal to B5's in {same} of {len(got)} sessions (digest of the cache "
                "token ids and the memory store)"
            )
    return lines


def session_views(rep: AuditReport) -> list[SessionView]:
    order = {m: i for i, m in enumerate(row_order(rep))}
    by: dict[str, list[StateAudit]] = {}
    for s in rep.states:
        by.setdefault(s.session_id, []).append(s)
    out = []
    for sid, states in by.items():
        states.sort(key=lambda s: order.get(s.method, len(order)))
        first = states[0]
        out.append(SessionView(sid, first.episode_id, first.suite, [_state_view(s) for s in states]))
    return out


def _state_view(s: StateAudit) -> StateView:
    shown = [m.name for m in METRICS.in_order() if m.per_state]  # a plug-in's too (Metric.per_state)
    leaks = [(m, f"{v:g}") for m in shown if (v := s.values.get(m)) is not None]
    probes = [(p.probe, p.leaked, short(p.text)) for p in s.probes]
    samples = [short(t, 240) for t in s.samples[:3]]
    forget = (
        ""
        if s.forget_changed is None
        else "its forget changed the dump"
        if s.forget_changed
        else "no-op: the dump right after its forget equals the one before"
    )
    return StateView(s.method, s.error, leaks, probes, samples, _places(s.residue, s.action_sinks), forget)


def _places(residue: StateResidue, sinks: dict[str, int]) -> list[tuple[str, str]]:
    """Every place the audit found z in this state, with the count and the one quoted example."""
    out: list[tuple[str, str]] = []
    for key, example, prefix in (
        ("context_tiers", "context_example", "prompt"),
        ("store_tiers", "store_example", "store"),
        ("disk_tiers", "disk_example", "disk"),
    ):
        tiers = {k: v for k, v in residue.counts(key).items() if v}
        if tiers:
            counts = ", ".join(f"{prefix}.{k}: {v}" for k, v in tiers.items())
            out.append((counts, short(str(getattr(residue, example)))))
    for path, why in residue.disk_unread.items():
        out.append((f"not read: {path}", why))
    by = residue.bystander
    if by is not None and by.lost:
        records = "?" if by.records is None else by.records
        out.append((f"bystander: {by.lost} of {records} records lost", short(by.example)))
    for event, got in residue.after.items():
        if got.skipped:
            out.append((f"after {event}: not measured", got.skipped))
        elif got.held:
            out.append((f"after {event}: z held" + (" (came back)" if got.back else ""), short(got.example)))
    for sink, n in sinks.items():
        if n:
            out.append((f"tool.{sink}: {n} call(s) carried z", ""))
    return out


def facts(rep: AuditReport, source: str) -> list[tuple[str, str]]:
    """Where the audit came from: enough to find and recompute it."""
    engine = rep.engine + (f" ({rep.engine_facts['library']})" if rep.engine_facts.get("library") else "")
    model = rep.model + (f" (weights sha256 {rep.model_digest[:12]})" if rep.model_digest else "")
    return [
        ("source", source),
        ("command", rep.command or "not recorded"),
        ("model", model),
        ("engine", engine),
        ("bundle", f"{rep.bundle} (sha256 {', '.join(d[:12] for d in rep.bundle_digest.split(','))})"),
        ("sampling", f"k = {rep.k} at T = {rep.temperature}, seed {rep.seed}"),
        ("decision", f"alpha {rep.alpha}, margin {rep.margin}, floor {'B5' if rep.floor else 'none'}"),
        ("eu-audit", f"{rep.tool_version} (commit {rep.tool_commit or 'not recorded'})"),
        (
            "texts scored by",
            f"the matcher of commit {rep.rescored_by} (re-scored)" if rep.rescored_by else "the audit",
        ),
        # what the run cost (the per-method recompute ledger is Table 2's cost columns)
        ("cost", ", ".join(f"{k} {v}" for k, v in rep.cost.items()) or "not recorded"),
    ]


def audit_page(rep: AuditReport, slug: str, title: str, source: str) -> AuditPage:
    decided = decided_now(rep)
    results = [g for g, _ in decided]
    return AuditPage(
        slug=slug,
        title=title,
        source=source,
        report=rep,
        verdict=overall([g.outcome for g in results]),
        rules=[RuleRow.of(g, was) for g, was in decided],
        tampering=[(t.session_id, t.tenant, t.kind, t.count, short(t.example, 240)) for t in rep.tampering],
        matrices=matrices(rep),
        tables=paper_tables(rep),
        equality=equality_lines(rep),
        sessions=session_views(rep),
        facts=facts(rep, source),
    )
