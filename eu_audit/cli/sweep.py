"""``eu-audit sweep``: the paper's sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import (
    app,
    out,
    progress_bar,
)
from eu_audit.cli.record import mean_text
from eu_audit.models import FAST_MODEL


@app.command()
def sweep(
    name: Annotated[str, typer.Argument(help="tau, indep, granularity, position, boundary or depth.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Folder for rows.jsonl, sweep.json, states.")],
    model: Annotated[str, typer.Option(help="Model to run.")] = FAST_MODEL,
    suite: Annotated[str, typer.Option(help="Suite builder the episodes come from.")] = "preference",
    n: Annotated[int, typer.Option(min=1, help="Episodes per value.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed for episodes and decoding.")] = 0,
    turns_after: Annotated[int, typer.Option(min=0, help="Transitions after the target (base knob).")] = 6,
    max_tokens: Annotated[int, typer.Option(min=1, help="Cap on tokens per model turn.")] = 32,
    value: Annotated[list[str] | None, typer.Option(help="Run only these values (repeatable).")] = None,
    engine: Annotated[
        str, typer.Option(help="KV engine: auto, llamacpp or hf (the boundary sweep's excision runs on hf).")
    ] = "auto",
) -> None:
    """Vary one knob, record, apply the sweep's methods, and write one row per value, session and method.

    Rows are written after every value; run the same command again to resume after an interruption.

    Example:

    [bold]eu-audit sweep tau --model smollm2-135m --n 2 -o sweeps/tau[/]
    """
    from eu_audit.sweeps import SweepOptions, run_sweep

    opts = SweepOptions(
        name=name,
        out=out_path,
        model=model,
        suite=suite,
        n=n,
        seed=seed,
        turns_after=turns_after,
        max_tokens=max_tokens,
        values=value,
        engine=engine,
    )
    with progress_bar() as report:
        rows = run_sweep(opts, progress=report)
    table = Table(title=Text(f"sweep {name}: {out_path / 'rows.jsonl'}"))
    for col in ("value", "method", "sessions", "any-leak", "recomputed", "decoded", "reused"):
        table.add_column(col, justify="right")
    from statistics import fmean

    for v in dict.fromkeys(r.value for r in rows):
        for m in dict.fromkeys(r.method for r in rows):
            rs = [r for r in rows if r.value == v and r.method == m]
            if rs:
                table.add_row(
                    Text(v),
                    Text(m),
                    str(len(rs)),
                    f"{fmean(r.leak_any for r in rs):.2f}",
                    f"{fmean(r.recomputed for r in rs):.0f}",
                    f"{fmean(r.decoded for r in rs):.0f}",
                    mean_text([r.reused for r in rs]),
                )
    out.print(table)
