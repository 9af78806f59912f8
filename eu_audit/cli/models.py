"""``eu-audit models``: the registered models and the local cache."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import (
    app,
    err,
    out,
    say,
)


@app.command()
def models(
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Hash every cached file against the digests the model registry pins (the shipped GGUF, a "
            "default model's de-quantized weights) and, for the rest, those written at conversion; say "
            "which; exit 1 if one is broken.",
        ),
    ] = False,
) -> None:
    """List the models eu-audit knows, whether their files are installed, which engine `auto` picks, and
    whether their local cache is there and verifies."""
    from eu_audit.engines import resolve_engine
    from eu_audit.models import MODELS, cache_folders, pins_for
    from eu_audit.models.cache import verify as verify_folder

    table = Table(title="models")
    for col in ("name", "role", "engine (auto)", "installed", "cache", "description"):
        table.add_column(col)
    broken, checked = [], []
    for name, spec in MODELS.items():
        states = []
        for part, folder in cache_folders(spec):
            if not folder.is_dir():
                continue
            pins = pins_for(spec, part)
            verdict = verify_folder(folder, force=verify, pins=pins)
            states.append(f"{part}: {'ok' if verdict else 'BROKEN'}")
            if verify:
                checked.append(f"{name} {part}: checked against {pins.describe()}")
            if not verdict:
                broken.append(verdict.problem)
        table.add_row(
            Text(name),
            spec.role,
            resolve_engine("auto", name),
            "yes" if spec.installed() else "no",
            ", ".join(states) or "not yet",
            Text(spec.description),
        )
    out.print(table)
    say(
        out,
        "Also accepted by --model: a local Hugging Face directory or a .gguf file. "
        "Cache: $EU_AUDIT_CACHE or ~/.cache/eu-audit/models (a broken entry is rebuilt on next use).",
    )
    for line in checked:
        say(out, line)
    for problem in broken:
        say(err, Text("broken cache: ", style="yellow"), problem)
    if broken:
        say(err, "a broken entry is made again from its verified source the next time it is used")
        raise typer.Exit(1)
