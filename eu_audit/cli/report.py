"""``eu-audit report``: the Markdown report and figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eu_audit.cli.app import (
    app,
    out,
    say,
)


@app.command()
def report(
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Report folder (report.md and PNGs).")],
    sweep_dir: Annotated[
        list[Path] | None, typer.Option("--sweep", help="A sweep folder (repeatable).")
    ] = None,
    audit_json: Annotated[
        list[Path] | None,
        typer.Option(
            "--audit",
            help="An audit --json report, or a folder of one run's shard audits (merged here; the rows "
            "keep the shards, not a merged copy). Repeatable.",
        ),
    ] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "eu-audit report",
    notes: Annotated[Path | None, typer.Option(help="Markdown placed under the title.")] = None,
    rows: Annotated[
        Path | None,
        typer.Option(
            help="Make a report again from the rows saved beside it (a report folder or its rows/): "
            "byte for byte the report.md they were saved with. Alone: no --sweep, --audit, --title, --notes."
        ),
    ] = None,
    allow_mixed: Annotated[
        bool,
        typer.Option(help="Allow inputs from different models, engines or eu-audit commits in one report."),
    ] = False,
    findings: Annotated[
        bool,
        typer.Option(
            help="Add the paper-vs-ours table under each audit: the paper's finding about each method, "
            "judged by the tests of its gate rules (reproduced / not reproduced / not shown at n = N)."
        ),
    ] = False,
) -> None:
    """Write a Markdown report with PNG plots from sweeps and audits, each with its command, engine, model
    digest and eu-audit commit. The inputs are saved beside it (rows/), so anyone can check it:
    `eu-audit report --rows DIR -o OUT` makes it again.

    Example:

    [bold]eu-audit report --sweep sweeps/tau --sweep sweeps/indep --audit audit.json -o reports/smollm2[/]
    [bold]eu-audit report --rows reports/smollm2 -o /tmp/again[/]  (then diff the two report.md)
    [bold]eu-audit report --audit shards/ --findings -o reports/big-run[/]  (shard audits of one run)
    """
    from eu_audit.view.report import regenerate, write_report

    if rows is not None:
        if sweep_dir or audit_json or notes or allow_mixed or findings or title != "eu-audit report":
            raise typer.BadParameter("--rows makes the report from its saved rows: give it alone (with -o)")
        say(out, f"wrote {regenerate(rows, out_path)}")
        return
    if not sweep_dir and not audit_json:
        raise typer.BadParameter("give at least one --sweep or --audit (or --rows)")
    path = write_report(
        sweep_dir or [], audit_json or [], out_path, title, notes, allow_mixed=allow_mixed, findings=findings
    )
    say(out, f"wrote {path}")
