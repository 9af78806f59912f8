"""``eu-audit view``: audits as a static HTML site."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eu_audit.cli.app import app, out, say


@app.command()
def view(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="An audit --json file; a report folder (eu-audit report's); a folder of audits (one page "
            "each and a comparison page); or a folder of report folders.",
            show_default=False,
        ),
    ],
    out_path: Annotated[
        Path, typer.Option("--out", "-o", help="The site's folder: new, empty, or a site view made before.")
    ],
    merge: Annotated[
        bool,
        typer.Option(
            help="A folder's audits are one run's shards: merge them into one page (eu-audit merge)."
        ),
    ] = False,
) -> None:
    """Write a static HTML site of one or more audits: the verdict first (each rule's outcome, n, test,
    bound, the n that would decide), the channel matrix (sessions x channels, hover for the quoted place,
    click for the session), the paper's tables with a chart, and each session's evidence (what each probe
    answered, where z stayed, what each recheck found). Several audits get a comparison page, one row each.

    The site is one folder with no script and no external fetch: open index.html from disk or from a CI
    artifact. It holds z only where the audit does (an audit made with --reveal-target; its files are then
    0600).

    Example:

    [bold]eu-audit view audit.json -o site/[/]
    [bold]eu-audit view reports/agents -o site/[/]  (every committed stack report, one row each)
    [bold]eu-audit view shards/ --merge -o site/[/]  (one run's shard audits as one page)
    """
    from eu_audit.view import build_site

    written = build_site(paths, out_path, merge=merge)
    pages = sum(1 for p in written if p.suffix == ".html")
    say(out, f"wrote {out_path / 'index.html'} ({pages} pages; open it in a browser, no server needed)")
