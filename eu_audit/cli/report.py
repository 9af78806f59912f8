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
        list[Path] | None, typer.Option("--audit", help="An audit --json report (repeatable).")
    ] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "eu-audit report",
    notes: Annotated[Path | None, typer.Option(help="Markdown placed under the title.")] = None,
) -> None:
    """Write a Markdown report with PNG plots from sweeps and audits, each with its command and versions.

    Example:

    [bold]eu-audit report --sweep sweeps/tau --sweep sweeps/indep --audit audit.json -o reports/smollm2[/]
    """
    from eu_audit.report import write_report

    if not sweep_dir and not audit_json:
        raise typer.BadParameter("give at least one --sweep or --audit")
    path = write_report(sweep_dir or [], audit_json or [], out_path, title, notes)
    say(out, f"wrote {path}")
