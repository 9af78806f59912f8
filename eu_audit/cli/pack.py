"""``eu-audit pack``: the residue pack, reported deletion bugs the gate must fail (and their fixes it must
pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import app, out, say

pack_app = typer.Typer(
    help="The residue pack: deletion bugs users reported in real stacks, each pinned to the release that has "
    "it and the one that fixed it; the gate must fail the first naming the place and pass the second.",
    no_args_is_help=True,
)

app.add_typer(pack_app, name="pack")

#: a checkout's cases: pack/NAME/case.toml beside eu_audit/
DEFAULT_CASES = Path(__file__).resolve().parents[2] / "pack"
Cases = Annotated[
    Path, typer.Option("--cases", help="The folder of cases (pack/NAME/case.toml in a checkout).")
]


@pack_app.command("list")
def pack_list(cases: Cases = DEFAULT_CASES) -> None:
    """Every case: the stack, the bug, what it leaves, and the releases it pins."""
    from eu_audit.pack.case import load_cases

    table = Table(title=f"pack cases ({cases})")
    for col in ("case", "stack", "leaves", "releases"):
        table.add_column(col)
    for c in load_cases(cases):
        releases = "; ".join(f"{r.name}: {', '.join(r.pins)} -> {r.expect}" for r in c.releases)
        if not c.runnable:
            releases = f"not reproduced here: {c.not_reproduced} ({releases})"
        table.add_row(Text(c.name), Text(c.stack), Text(c.leaves), Text(releases))
    out.print(table)


@pack_app.command("run")
def pack_run(
    names: Annotated[list[str] | None, typer.Argument(help="Cases to run (default: all).")] = None,
    out_path: Annotated[
        Path, typer.Option("--out", "-o", help="Where each release's bundle, audit and logs go.")
    ] = Path("pack-run"),
    release: Annotated[
        list[str] | None, typer.Option(help="Only these releases of each case (buggy, fixed).")
    ] = None,
    cases: Cases = DEFAULT_CASES,
    report: Annotated[
        Path | None,
        typer.Option(
            help="A report folder: each release's row is added to its results.jsonl (a run in slices adds "
            "up), its masked audit kept in rows/, and README.md made again from every row there.",
        ),
    ] = None,
) -> None:
    """Run each case's releases through the gate: a venv per release (made once, reused), the case's agent
    in it with its model at eu-audit serve, eu-audit gate, audit with the case's rules, and the verdict
    compared with the one the case expects. Exit 0 when every release gave its expected verdict (a buggy
    one failed, naming the place; a fixed one held), 1 when one did not, 3 when one could not run.

    Example:

    [bold]eu-audit pack list[/]
    [bold]eu-audit pack run openai-agents-3755 -o /tmp/pack --report reports/pack[/]
    """
    from eu_audit.pack.case import load_cases
    from eu_audit.pack.run import run_pack
    from eu_audit.pack.table import figures

    chosen = load_cases(cases, names)
    if not any(c.runnable for c in chosen):  # nothing would run: no verdict to give, never a silent 0
        from eu_audit.errors import BadInput

        raise BadInput(
            f"nothing to run: every case named is not reproduced here ({', '.join(c.name for c in chosen)})"
        )
    root = DEFAULT_CASES.parent  # a case's agent is a path in the checkout (examples/agents/...)
    results = run_pack(chosen, root, out_path, lambda line: say(out, line), release)
    if report is not None:
        from eu_audit.pack.table import write_pack_report

        say(out, f"wrote {write_pack_report(report, load_cases(cases), results, out_path)}")
    for line in figures(chosen, results):
        say(out, line)
    if any(r.verdict == "run failed" for r in results):
        raise typer.Exit(3)
    if not all(r.as_expected for r in results):
        raise typer.Exit(1)
