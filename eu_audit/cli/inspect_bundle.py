"""``eu-audit inspect``: what a bundle holds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from eu_audit.cli.app import (
    app,
    out,
    say,
)
from eu_audit.cli.record import print_bundle_summary


@app.command()
def inspect(
    bundle_path: Annotated[Path, typer.Argument(help="A trace bundle (JSONL).")],
    session: Annotated[str | None, typer.Option(help="Show one session's blocks in full.")] = None,
) -> None:
    """Validate a bundle and show its sessions, or one session's blocks with provenance."""
    from eu_audit.bundle.io import read_bundle

    bundle = read_bundle(bundle_path)
    if session is None:
        print_bundle_summary(bundle, bundle_path)
        return
    s = bundle.session(session)
    tgt = s.session.target
    matcher = s.matcher()
    closure = s.closure()
    say(
        out,
        Text(f"{bundle_path} session {session}", style="bold"),
        f": episode {s.session.episode_id}, target {tgt.value!r}, T={s.session.transitions}",
    )
    for b in s.blocks:
        span = f"{b.token_span[0]}-{b.token_span[1]}" if b.token_span else "not in cache"
        marks: list[str | Text] = []
        if b.id in closure:
            marks.append(Text(" tainted", style="yellow"))
        if matcher.found_in(b.text):
            marks.append(Text(" holds target", style="red"))
        say(out, Text(b.id, style="bold"), f" t={b.turn} {b.type.value} ({span})", *marks)
        say(out, f"    {b.text[:300]}")
