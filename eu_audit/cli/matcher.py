"""``eu-audit matcher``: the target matcher's precision and recall on its labelled set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from eu_audit.cli.app import app, out, say
from eu_audit.matching.evaluate import LABELLED, read_rows, score_matcher


@app.command()
def matcher(
    labelled: Annotated[
        Path,
        typer.Argument(help="A labelled set (JSONL: target, variants, text, label leak|no-leak|paraphrase)."),
    ] = LABELLED,
    show: Annotated[
        bool,
        typer.Option(
            "--show", help="Print every missed leak and false alarm (the set's targets are synthetic)."
        ),
    ] = False,
) -> None:
    """Measure the matcher that decides what is a leak (and what is masked) on a labelled set.

    Recall counts the texts labelled leak that it finds; precision, the texts it flags that are leaks.
    Paraphrases (z in other words, or only a part of it) get a recall of their own: no string matcher is
    meant to catch them, the behavioral and distribution audits are. Exit 0 always: it measures.
    """
    s = score_matcher(read_rows(labelled))
    t = Table(title=f"matcher on {labelled.name}: {s.rows} texts")
    for col in ("measure", "value", "n"):
        t.add_column(col)
    t.add_row("recall (leak found)", f"{s.recall:.3f}", f"{s.tp} of {s.tp + s.fn}")
    t.add_row("precision (flagged that are leaks)", f"{s.precision:.3f}", f"{s.tp} of {s.tp + s.fp}")
    t.add_row("no-leak texts flagged", str(s.fp), f"of {s.fp + s.tn}")
    decoded = sum(s.decoded_false_alarms.values())
    named = ", ".join(f"{k} {v}" for k, v in sorted(s.decoded_false_alarms.items()))
    t.add_row(
        "no-leak texts a decoder makes show z (residue reader)",
        str(decoded) + (f" ({named})" if named else ""),
        f"of {s.tn}",
    )
    t.add_row(
        "paraphrase recall (not gated)",
        f"{s.paraphrase_recall:.3f}",
        f"{s.paraphrase_found} of {s.paraphrase}",
    )
    out.print(t)
    by = Table(title="recall by how the leak was written")
    for col in ("how", "found", "of"):
        by.add_column(col)
    for how, (hit, of) in sorted(s.by_how.items(), key=lambda kv: (kv[1][0] / kv[1][1], kv[0])):
        by.add_row(how, str(hit), str(of))
    out.print(by)
    if show:
        for r in s.misses:
            say(out, "missed: ", repr(r.target), " in ", repr(r.text[:200]), f"  ({r.how}; {r.source})")
        for r in s.false_alarms:
            say(out, "false alarm: ", repr(r.target), " in ", repr(r.text[:200]), f"  ({r.how}; {r.source})")
