"""``eu-audit power``: the n a decisive verdict needs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.audits.power import DEFAULT_CHANCE, MAX_PLAN_N
from eu_audit.cli.app import (
    app,
    out,
    say,
)
from eu_audit.defaults import ALPHA, MARGIN
from eu_audit.errors import BadInput


@app.command()
def power(
    pilot: Annotated[
        Path | None,
        typer.Argument(
            help="A pilot audit's --json report, or a folder of one run's shard audits (merged): its "
            "per-session rows are used."
        ),
    ] = None,
    gate: Annotated[
        list[str] | None,
        typer.Option(help="Rules to size (default: the pilot's gates, else every method's floor rules)."),
    ] = None,
    worse_share: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Without a pilot: the share of sessions where the method is worse than the floor (0 for a "
            "forget as good as the reference); prints the n a 0/1 floor rule needs to hold.",
        ),
    ] = None,
    margin: Annotated[float, typer.Option(min=0.0, help="The gate's margin.")] = MARGIN,
    alpha: Annotated[float, typer.Option(min=0.0001, max=0.5, help="The gate's one-sided alpha.")] = ALPHA,
    chance: Annotated[
        float,
        typer.Option(
            min=0.5,
            max=0.99,
            help="The chance a fresh run at the planned n decides each rule (held or failed), its sessions "
            "drawn like the pilot's (exact binomial for a 0/1 rule the floor is never better on, else "
            "seeded runs).",
        ),
    ] = DEFAULT_CHANCE,
) -> None:
    """How many sessions a decisive verdict needs: for each rule, its outcome on the pilot, the n at
    which the pilot's rates would decide it, and the n at which a fresh run decides it with --chance (a
    run of the first n, drawn afresh, decides only about half the time). Size a CI job before it runs;
    then run it and gate once: adding sessions to an inconclusive run and gating again is a second look
    that spends alpha again.

    Examples:

    [bold]eu-audit power pilot.json[/]   [bold]eu-audit power --worse-share 0 --margin 0.1[/]
    """
    from eu_audit.audits.power import plan_share
    from eu_audit.audits.verdict import n_for_share

    if pilot is None:
        if worse_share is None:
            raise BadInput("give a pilot audit JSON, or --worse-share")
        need = n_for_share(worse_share, margin, alpha)
        planned = plan_share(worse_share, alpha=alpha, margin=margin, chance=chance)
        say(
            out,
            f"a 0/1 rule against the floor, the method worse in {worse_share:.0%} of sessions: "
            + (f"n >= {need} sessions to hold within margin {margin} at alpha {alpha} at exactly that share"
               if need else f"no n holds it: {worse_share:.0%} is not within the margin {margin}")
            + (f"; n = {planned} decides {chance:.0%} of fresh runs (held or failed)"
               if planned else f"; no n up to {MAX_PLAN_N} decides {chance:.0%} of fresh runs"),
        )  # fmt: skip
        return
    from eu_audit.audits.gate import check_rules, default_rules, evaluate, gated_rules
    from eu_audit.audits.merge import read_audits, shard_audits
    from eu_audit.audits.power import plan_rule

    rep = read_audits(shard_audits(pilot) if pilot.is_dir() else [pilot])
    rules = gate or gated_rules(rep) or default_rules(rep)
    parsed = {r.text: r for r in check_rules(rules, rep.methods, rep.suites)}
    table = Table(title=Text(f"sessions needed (pilot {pilot}, margin {margin}, alpha {alpha})"))
    cols = (
        "rule",
        "now",
        "n now",
        "control (B0)",
        "n at the pilot's rates",
        f"n deciding {chance:.0%} of runs",
    )
    for col in (*cols, "test"):
        table.add_column(col)
    blind = []
    for g in evaluate(rep, rules, alpha=alpha, margin=margin):
        decide = fresh = "-"
        shown = _control_cell(g.control)
        if g.outcome == "inconclusive":
            decide = str(g.n_needed) if g.n_needed else "none"
            n_plan = plan_rule(rep, parsed[g.rule], alpha=alpha, margin=margin, chance=chance)
            fresh = str(n_plan) if n_plan else ("none" if g.n_needed else "-")
        elif g.outcome == "insensitive":
            decide = f"{g.n_needed} (for B0 to fail it)" if g.n_needed else "no n"
            blind.append(g.rule)
        table.add_row(Text(g.rule), g.outcome, str(g.n), Text(shown), decide, fresh, Text(g.test))
    out.print(table)
    if blind:
        say(
            out,
            f"{len(blind)} rule(s) insensitive: the same rule, by the same test on the same sessions, did "
            "not fail for the control (the state never sent the forget), so the measurement cannot tell a "
            "forget from none. 'N (for B0 to fail it)': the n at which the control's observed rates would "
            "fail it; 'no n': the control never showed z there (or too rarely for any n): a model that "
            "repeats z, or a probe that draws it out, would.",
        )


def _control_cell(control: str) -> str:
    """A rule's control in a table cell: "2 of 2, fails it" (what B0 did with the same rule), or "-"."""
    import re

    m = re.search(r"broke it in (\d+ of \d+)", control)
    if m is None:
        return control.split(":", 1)[0] if control else "-"
    return f"{m.group(1)}, {'fails it' if 'and fails it' in control else 'does not fail it'}"
