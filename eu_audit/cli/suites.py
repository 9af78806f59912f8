"""``eu-audit suites``: list, show, build and calibrate episode suites."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.cli.app import (
    Force,
    out,
    progress_bar,
    say,
    suites_app,
)
from eu_audit.errors import BadInput
from eu_audit.models import DEFAULT_MODEL


@suites_app.command("list")
def suites_list() -> None:
    """Every registered suite with its episode count."""
    from eu_audit.suites import SHIPPED, SUITES, load_episodes, shipped_file

    table = Table(title="suites")
    table.add_column("suite")
    table.add_column("episodes", justify="right")
    table.add_column("channels")
    for name, loader in SUITES.items():
        # a shipped suite is checked against its toolsets when a run loads it; listing only counts
        eps = load_episodes(shipped_file(name), check_tools=False) if name in SHIPPED else loader()
        kinds = sorted({ep.steps[ep.tau - 1].kind.value for ep in eps})
        table.add_row(Text(name), str(len(eps)), ", ".join(kinds))
    out.print(table)


@suites_app.command("show")
def suites_show(
    suite: Annotated[str, typer.Argument(help="Suite name or episodes JSONL file.")],
    episode: Annotated[str | None, typer.Option(help="Episode id to print in full (JSON).")] = None,
) -> None:
    """Show a suite's episodes (or one episode as JSON)."""
    from eu_audit.suites import load_suite

    eps = load_suite(suite)
    if episode:
        match = [e for e in eps if e.id == episode]
        if not match:
            raise typer.BadParameter(f"no episode '{episode}' in {suite}")
        sys.stdout.write(match[0].model_dump_json(indent=2) + "\n")
        return
    table = Table(title=Text(suite))
    for col in ("episode", "T", "tau", "target kind", "description"):
        table.add_column(col, overflow="fold")
    for e in eps:
        table.add_row(Text(e.id), str(len(e.steps)), str(e.tau), Text(e.target.kind), Text(e.description))
    out.print(table)


@suites_app.command("build")
def suites_build(
    suite: Annotated[str, typer.Argument(help="Builder: agentdojo, bfcl-memory, bfcl-tools, preference.")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Episodes JSONL to write (default: suites/<name>.jsonl)."),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed for every random choice (pairs, Faker records, order).")
    ] = 0,
    n: Annotated[int | None, typer.Option(min=1, help="Keep the first N episodes.")] = None,
    turns_after: Annotated[int, typer.Option(min=0, help="Transitions after the target enters.")] = 12,
    indep: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of those turns independent of the target.")
    ] = 0.5,
    position: Annotated[
        str, typer.Option(help="Where the target enters: early, middle or late (10% / 50% / 80% in).")
    ] = "early",
    depth: Annotated[
        int, typer.Option(min=0, max=3, help="Derivation depth: 1 answer, 2 + plan, 3 + summary.")
    ] = 3,
    checkpoints: Annotated[
        CheckpointPolicy, typer.Option(help="Checkpoint policy stamped on each episode.")
    ] = CheckpointPolicy.every_turn,
    force: Force = False,
) -> None:
    """Build a suite's episodes from its data set, reproducibly (same knobs + seed, same bytes).

    Example:

    [bold]eu-audit suites build agentdojo --seed 0 --turns-after 12 --indep 0.5 -o suites/agentdojo.jsonl[/]
    """
    from pydantic import ValidationError

    from eu_audit.suites.build import Skips, build_suite, write_suite
    from eu_audit.suites.compose import Knobs

    try:
        knobs = Knobs(
            seed=seed,
            n=n,
            turns_after=turns_after,
            indep=indep,
            position=position,  # type: ignore[arg-type]
            depth=depth,
            checkpoint_policy=checkpoints.value,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc.errors()[0]["msg"])) from None
    with progress_bar() as report:
        report(f"building {suite}", 0, 1)
        skips = Skips()
        episodes = build_suite(suite, knobs, skips)
        report(f"building {suite}", 1, 1)
    path = write_suite(episodes, out_path or Path("suites") / f"{suite}.jsonl", force=force)
    say(out, f"{len(episodes)} episodes -> {path}")
    for line in skips.lines():
        say(out, line)


@suites_app.command("calibrate")
def suites_calibrate(
    out_path: Annotated[
        Path, typer.Option("--out", "-o", help="Calibrated preference suite to write (JSONL, 0600).")
    ],
    model: Annotated[str, typer.Option(help="The model the suite will audit.")] = DEFAULT_MODEL,
    engine: Annotated[str, typer.Option(help="KV engine: auto, llamacpp or hf.")] = "auto",
    candidates: Annotated[
        int, typer.Option(min=1, help="Candidate pairs to measure (the first 30 are the shipped suite's).")
    ] = 30,
    samples: Annotated[int, typer.Option(min=1, help="Choice samples per order (the audit's --k).")] = 10,
    low: Annotated[float, typer.Option(min=0.0, max=1.0, help="Lowest floor avoid rate kept.")] = 0.2,
    high: Annotated[float, typer.Option(min=0.0, max=1.0, help="Highest floor avoid rate kept.")] = 0.8,
    seed: Annotated[int, typer.Option(help="Suite seed (provider names, turn order).")] = 0,
    table: Annotated[
        Path | None, typer.Option(help="Also write the calibration table (Markdown) here.")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the table as JSON.")] = None,
    force: Force = False,
) -> None:
    """Keep the preference pairs whose B5 floor leaves room for behavioral residue on MODEL.

    Runs the real floor (record, B5 full reset, the audit's choice asks) for each candidate pair in both
    orders and keeps pairs whose floor avoid rate lies in [--low, --high]: where the agent that was never
    told already avoids the excluded provider every time, or names neither, no method can show residue.

    Example:

    [bold]eu-audit suites calibrate --candidates 30 --samples 10 -o pref-qwen.jsonl --table calibration.md[/]
    """
    from eu_audit.datasets.preference.calibrate import calibrate
    from eu_audit.jsonl import atomic_writer, check_output_path
    from eu_audit.suites.build import write_suite
    from eu_audit.suites.compose import Knobs

    for path in (out_path, table, json_path):
        if path is not None:
            check_output_path(path)  # refused now, not after the floor is measured
            if path.exists() and not force:
                raise BadInput(f"{path} exists; pass --force to replace it")
    with progress_bar() as report:
        cal, kept = calibrate(
            candidates,
            model=model,
            engine=engine,
            samples=samples,
            band=(low, high),
            knobs=Knobs(seed=seed),
            progress=report,
        )
    md = cal.markdown()
    sys.stdout.write(md)  # a Markdown table: unwrapped, whatever the terminal width
    if table is not None:
        with atomic_writer(table, private=False) as f:
            f.write(md)
    if json_path is not None:
        with atomic_writer(json_path, private=True) as f:  # names the excluded providers
            f.write(cal.model_dump_json(indent=2) + "\n")
    if not kept:
        say(
            out,
            "no pair kept: behavioral residue cannot show on this model (see the table); nothing written to ",
            str(out_path),
        )
        return
    write_suite(kept, out_path, force=force)
    say(out, f"{len(cal.kept)} pairs ({len(kept)} episodes) -> ", str(out_path))
