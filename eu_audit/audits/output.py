"""How an audit is shown: Rich tables shaped like the paper's Tables 1-3, a summary in words, JUnit XML.

The tables keep their width whatever the number of suites: methods (and the floor) are rows, a table's
metrics are columns, and each suite is a section of rows. The Markdown report has the same tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from eu_audit.audits.metric import METRICS, TABLE_TITLES, Metric, Shows, table_metrics
from eu_audit.audits.model import FLOOR, SERVING, AuditReport, Cell, StateAudit
from eu_audit.audits.rules import CONTROL
from eu_audit.stats import stars
from eu_audit.trace.records import AGENT_METHOD

if TYPE_CHECKING:
    from eu_audit.audits.channels import Channel

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


def shown_by(shows: Shows) -> set[str]:
    """The metrics whose failed rule puts a method in that group of the summary (``Metric.shows``)."""
    return {m.name for m in METRICS.in_order() if m.shows == shows}


def verdicts(report: AuditReport) -> dict[str, str]:
    """method -> forgets / only stops saying / acts unlike the reference / still leaks / still holds the
    target / not shown at this n / insensitive, from its default rules' verdicts on all sessions
    (``gate.default_rules``): "forgets" only when every rule held with evidence, "only stops saying" only
    when its string-leak rules held (a leak not yet significant is not "no leak"). Without a floor nothing
    is compared: "not measured (no floor)"."""
    from eu_audit.audits.gate import PSEUDO_RULES, default_rules, evaluate, parse_rule

    out = {}
    for method in report.methods:
        if method in (FLOOR, SERVING) or (method == CONTROL and report.side == "black"):
            continue  # the floor, and a black-box run's no-forget tenant: references, not methods
        c = report.cell(method, "all")
        if c is None or c.errors:
            out[method] = "errored"
            continue
        if not report.floor:
            out[method] = "not measured (no floor)"
            continue
        # a gated run is headlined by the rules it was gated by, so the headline agrees with the exit code:
        # a rule the gate set leaves out (CAD for an agent, utility) neither holds nor fails the forget, and
        # the default rules alone would call a lost bystander "not shown at this n"
        gated = [
            g.rule for g in report.gates if g.rule not in PSEUDO_RULES and g.rule.startswith(f"{method}.")
        ]
        every = gated or default_rules(report, ["all"], control=True)
        rules = [r for r in dict.fromkeys(every) if r.startswith(f"{method}.")]
        got = {
            parse_rule(g.rule).metric: g.outcome
            for g in evaluate(report, rules)
            if g.rule not in PSEUDO_RULES
        }
        failed = {m for m, o in got.items() if o == "failed"}
        says = shown_by("says")
        says_held = all(got[m] == "held" for m in says if m in got)
        out[method] = (
            "still leaks"
            if failed & says
            else ("only stops saying" if says_held else "acts unlike the reference")
            if failed & shown_by("behaves")
            else "still holds the target"
            if failed & shown_by("keeps")
            else "loses what it must keep"
            if "bystander" in failed
            else "fails another rule"
            if failed
            else "not shown at this n"
            if any(o == "inconclusive" for o in got.values()) or not got
            else "insensitive"
            if any(o == "insensitive" for o in got.values())
            else "forgets"
        )
        if report.tampering and method == AGENT_METHOD:  # whatever its figures say, they cannot be trusted
            out[method] = "tampered"
    return out


#: the summary's sentence for each verdict group, in the order printed (before the residue lines)
GROUP_SENTENCES = (
    (
        "tampered",
        "Tried to get around the measurement (its figures cannot be trusted; the gate fails on 'no "
        "tampering')",
    ),
    (
        "forgets",
        "Forget (every rule held with evidence: leakage, probes, behavior, residue where measured)",
    ),
    (
        "not shown at this n",
        "Not shown to forget at this n (no rule failed, some are inconclusive; more sessions would decide)",
    ),
    (
        "insensitive",
        "Not shown to forget here (no rule failed; some are insensitive: the same rule did not fail for "
        "their positive control, the state without the forget, so those measurements cannot tell a forget "
        "from none)",
    ),
    ("loses what it must keep", "Forget removed what it had to keep (a bystander tenant's memories)"),
    ("fails another rule", "Fail another rule (the gates below name it)"),
    (
        "only stops saying",
        "Only stop saying (no string leak, shown at this n; but probes, samples, actions or choices still "
        "differ from B5)",
    ),
    (
        "acts unlike the reference",
        "Act unlike B5 (probes, samples, actions or choices differ from B5; whether they still say the "
        "target is not decided at this n)",
    ),
    ("still leaks", "Still leak the target in what they say or do"),
    (
        "still holds the target",
        "Still hold the target (in prompts after the forget, the store dump or the files eu-audit read; "
        "where, below; what they say is for the leak rules)",
    ),
)
#: ... and after them
LATE_SENTENCES = (
    ("not measured (no floor)", "Not measured without the B5 floor (run with --floor to compare)"),
    ("errored", "Errored (counted as failures)"),
)


def summary_lines(report: AuditReport) -> list[str]:
    groups: dict[str, list[str]] = {}
    for m, verdict in verdicts(report).items():
        groups.setdefault(verdict, []).append(m)
    n_states = len({s.session_id for s in report.states})
    lines = [
        f"{n_states} session(s) over {', '.join(report.suites)}; model {report.model} on {report.engine}; "
        f"k={report.k} samples at T={report.temperature}; margin {report.margin}."
    ]
    lines += [f"{text}: {', '.join(groups[g])}." for g, text in GROUP_SENTENCES if groups.get(g)]
    stopped = report.engine_facts.get("stopped")
    if isinstance(stopped, dict):  # a run in rounds (eu-audit gate)
        from eu_audit.audits.stopping import Stop

        lines.append(
            "Recorded in rounds, "
            + Stop(stopped["n"], stopped["max_n"], stopped["why"], stopped["early"]).sentence()
            + "."
        )
    interrupted = report.engine_facts.get("interrupted")
    if interrupted:  # record was stopped (^C, SIGTERM) and kept the sessions it had finished
        lines.append(f"The recording was interrupted {interrupted}: this audit is of those only.")
    lines += tamper_lines(report) + own_floor_lines(report) + forget_lines(report)
    if report.plugins or report.defined_by:  # what decided it that is not eu-audit's own
        defined = "; ".join(f"{k} by {v}" for k, v in report.defined_by.items()) or "nothing it used"
        lines.append(f"Plug-ins loaded: {', '.join(report.plugins) or 'none'}; defined by them: {defined}.")
    hint = report.engine_facts.get("forget_hint")
    if hint:
        lines.append(f"The forget was sent the flagged observation's {hint}.")
    lines += residue_lines(report) + channel_lines(report)
    lines += [f"{text}: {', '.join(groups[g])}." for g, text in LATE_SENTENCES if groups.get(g)]
    dropped = {s: p for s, p in report.probes_dropped.items() if p}
    if dropped:
        lines.append(
            "Probes dropped where they leak on B5 itself, in that session only: "
            + "; ".join(f"{s}: {', '.join(p)}" for s, p in dropped.items())
            + "."
        )
    unmeasured = sorted(
        {(c.method, m, why) for c in report.cells if c.suite == "all" for m, why in c.unmeasured.items()}
    )
    for method, m, why in unmeasured:
        lines.append(f"{method}.{m}: {why}.")
    return lines + _serving_lines(report) + _cost_lines(report)


def forget_lines(report: AuditReport) -> list[str]:
    """A forget that changed nothing its dump shows (a no-op), and one that lost another tenant's memories
    (``eu_audit.blackbox.bystander``), each in its own words."""
    out = []
    for method in report.methods:
        mine = [s for s in report.states if s.method == method]
        judged = [s for s in mine if s.forget_changed is not None]
        noop = [s for s in judged if not s.forget_changed]
        if noop:
            out.append(
                f"{method}: its forget changed nothing its own dump shows (a no-op) in {len(noop)} of "
                f"{len(judged)} session(s)."
            )
        watched = [s.residue.bystander for s in mine if s.residue.bystander is not None]
        lost = [b for b in watched if b.lost]
        if lost:
            out.append(
                f"{method}: its forget lost another tenant's memories (a bystander's) in {len(lost)} of "
                f"{len(watched)} session(s), e.g. '{lost[0].example}'."
            )
        elif watched:
            out.append(f"{method}: a bystander tenant kept every memory in all {len(watched)} session(s).")
    return out


def tamper_lines(report: AuditReport) -> list[str]:
    """One line per tenant that tampered: what it tried, how often, one example (z masked)."""
    from eu_audit.tiers import TAMPER_KINDS

    by: dict[tuple[str, str], list[str]] = {}
    for t in report.tampering:
        by.setdefault((t.session_id, t.tenant), []).append(
            f"{t.count} {TAMPER_KINDS.get(t.kind, t.kind)} ({t.example})"
        )
    return [f"Tamper attempts, {sid} {tenant}: {'; '.join(said)}." for (sid, tenant), said in by.items()]


def own_floor_lines(report: AuditReport) -> list[str]:
    """The reference against eu-audit's own floor (``own_floor``), one line per suite and place; for a
    black-box run that measured none, that it did not (the reference's figures are then the agent's word)."""
    from eu_audit.audits.own_floor import sentence

    if report.own_floor:
        return [
            f"eu-audit's own floor (its runtime, the episode without z): {sentence(c)}."
            for c in report.own_floor
        ]
    if report.side == "black":
        return [
            "eu-audit's own floor: not measured in this run (recorded without it): the reference tenant's "
            "figures, the agent's own, are the floor unchecked."
        ]
    return []


def _serving_lines(report: AuditReport) -> list[str]:
    serving = report.cell(SERVING, "all")
    if serving is None:
        return []
    r, e = serving.values.get("residual_cached_tokens"), serving.values.get("reset_effective")
    return [
        "Serving layer: the server still serves "
        + ("an unknown number of" if r is None else f"{r:.1f}")
        + " cached token(s) of the prefix that carried z, beyond a decoy's (mean per session); after "
        + "its own reset, "
        + ("unknown" if e is None else f"{e:.0%} of sessions")
        + " clean."
    ]


def _cost_lines(report: AuditReport) -> list[str]:
    if not report.cost:
        return []
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
    return [line + "."]


def _black_box_states(report: AuditReport) -> dict[str, list[StateAudit]]:
    """The agent's states of a black-box audit, by method (the floor tenant is the reference, not shown)."""
    if report.side != "black":
        return {}
    return {
        m: [s for s in report.states if s.method == m and not s.error]
        for m in row_order(report)
        if m not in (FLOOR, CONTROL, SERVING)
    }


def _control_states(report: AuditReport) -> dict[str, StateAudit]:
    """The positive control's states by session id (the no-forget tenant: ``eu_audit.audits.sensitivity``)."""
    return {s.session_id: s for s in report.states if s.method == CONTROL and not s.error}


def _floor_states(report: AuditReport) -> dict[str, StateAudit] | None:
    """B5's states by session id (the reference each channel is read against), None without a floor."""
    if not report.floor:
        return None
    return {s.session_id: s for s in report.states if s.method == FLOOR and not s.error}


def _as_floor(c: Channel) -> str:
    if not c.floor_too:
        return ""
    return "; B5 too" + ("" if c.only_as_floor else f" in {c.floor_too}")


def channel_lines(report: AuditReport) -> list[str]:
    """One line per black-box method: the channels where z still is after the forget (the headline
    verdict over its sessions, and in how many of them B5's state had z there too), then the clean ones
    by what their positive control says: erased, never held, not seen (``eu_audit.audits.channels``)."""
    from eu_audit.audits.channels import channels

    lines = []
    floor = _floor_states(report)
    for method, states in _black_box_states(report).items():
        got = channels(states, floor, _control_states(report) or None)
        quiet = ("erased", "never held", "not seen")
        said = [
            f"{c.name} {c.headline} ({c.counts[c.headline]} of {sum(c.counts.values())} sessions"
            f"{_as_floor(c)})"
            for c in got
            if c.headline not in quiet
        ]
        groups = {
            "erased (z there without the forget, gone with it)": "erased",
            "never held z (not even without the forget)": "never held",
            "not seen (no z; no positive control recorded, so whether z was there is not known)": "not seen",
        }
        said += [
            f"{label}: {', '.join(names)}"
            for label, verdict in groups.items()
            if (names := [c.name for c in got if c.headline == verdict])
        ]
        lines.append(f"{method}, per channel: " + "; ".join(said) + ".")
    return lines


def channel_table(report: AuditReport) -> list[str]:
    """Markdown: each black-box method's channels, the verdict over its sessions, a quoted place."""
    from eu_audit.audits.channels import channel_rows

    lines: list[str] = []
    floor = _floor_states(report)
    too = (
        "; B5 too: of the leaked and suppressed, those where B5's state, which never saw the record, had z "
        "there too (not shown to be the forget's residue)"
        if floor is not None
        else ""
    )
    for method, states in _black_box_states(report).items():
        lines += [
            f"Where z is after {method}'s forget, per channel (sessions; leaked: in what it said or did; "
            f"suppressed: in a prompt or store while its outputs were clean; erased: z there without the "
            f"forget (the no-forget control) and gone with it; never held: not there even without the "
            f"forget; not seen: no z, and no control recorded; unknown: not observable{too}):",
            "",
            "| channel | verdict | leaked | suppressed | erased | never held | not seen | unknown |"
            + (" B5 too |" if floor is not None else "")
            + " where (quoted) or why unknown |",
            "|---|---|---|---|---|---|---|---|" + ("---|" if floor is not None else "") + "---|",
        ]
        for row in channel_rows(states, floor, _control_states(report) or None):
            quoted = row[-1].replace("|", "\\|").replace("`", "'")  # the cell is one code span
            lines.append("| " + " | ".join([*row[:-1], f"`{quoted}`" if quoted else ""]) + " |")
        lines.append("")
    return lines


def residue_lines(report: AuditReport) -> list[str]:
    """Where a black-box agent still held the target after its forget, by the channels' gate names
    (``prompt.user``, ``store.history``), with one example."""
    lines = []
    for method in row_order(report):
        if method == CONTROL and report.side == "black":
            continue  # the no-forget tenant holds z by design: it is each channel's control, not a finding
        states = [s for s in report.states if s.method == method and s.residue]
        ctx: dict[str, int] = {}
        store: dict[str, int] = {}
        for st in states:
            for k, v in st.residue.context_tiers.items():
                ctx[k] = ctx.get(k, 0) + v
            for k, v in st.residue.store_tiers.items():
                store[k] = store.get(k, 0) + v
        if ctx:
            example = next(s.residue.context_example for s in states if s.residue.context_example)
            ranked = sorted(ctx.items(), key=lambda kv: -kv[1])
            where = ", ".join(f"prompt.{k} ({v} calls)" for k, v in ranked)
            key = next((s.residue.control_key for s in states if s.residue.control_key), "")
            marked = f" (requests marked post-forget under control key {key})" if key else ""
            lines.append(
                f"{method}: after the forget, z still reached the model in: {where}; e.g. {example!r}{marked}"
            )
        if store:
            example = next(s.residue.store_example for s in states if s.residue.store_example)
            kept = sorted(store.items(), key=lambda kv: -kv[1])
            where = ", ".join(f"store.{k} ({v} items)" for k, v in kept)
            lines.append(f"{method}: its store dump still holds z in: {where}; e.g. {example!r}")
        undeclared = sorted({Path(f).name for s in states for f in s.residue.disk_undeclared})
        if undeclared:  # read with the files it named, and said: a store it never listed
            shown = ", ".join(undeclared[:5]) + (
                f" and {len(undeclared) - 5} more" if len(undeclared) > 5 else ""
            )
            lines.append(f"{method}: eu-audit also read files it wrote and did not name: {shown}")
        lines += recheck_lines(method, states)
    return lines


def recheck_lines(method: str, states: list[StateAudit]) -> list[str]:
    """After which recheck event (``eu-audit gate --recheck``) z was held again, in how many sessions,
    where, with one quoted place; events that could not run, with why."""
    lines = []
    events = list(dict.fromkeys(e for s in states for e in s.residue.after))
    for event in events:
        got = [s.residue.after[event] for s in states if event in s.residue.after]
        skipped = [g.skipped for g in got if g.skipped]
        if skipped:
            lines.append(f"{method}: after {event}: not measured in {len(skipped)} sessions ({skipped[0]})")
        ran = [g for g in got if not g.skipped]
        held = [g for g in ran if g.held]
        if not ran:
            continue
        if not held:
            lines.append(
                f"{method}: after {event}: z in none of {len(ran)} sessions (prompts, answers, dump)"
            )
            continue
        back = [g for g in held if g.back]
        where = sorted({w for g in held for w in ("prompts", "answers", "store") if getattr(g, w)})
        came = f"came back in {len(back)}, " if back else ""
        lines.append(
            f"{method}: after {event}: z {came}held in {len(held)} of {len(ran)} sessions "
            f"({', '.join(where)}); e.g. {(back or held)[0].example!r}"
        )
    return lines
