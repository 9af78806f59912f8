"""``eu-audit unlearn``: apply forget methods to a recorded bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import (
    Force,
    SigningKey,
    app,
    out,
    progress_bar,
    say,
)
from eu_audit.errors import BadInput


@app.command("unlearn")
def unlearn_command(
    bundle_path: Annotated[Path, typer.Argument(help="A recorded trace bundle (JSONL); never modified.")],
    method: Annotated[
        list[str],
        typer.Option(
            "--method", "-m", help="Method(s): b0..b9, b5p, excise; comma-separated, repeated, or 'all'."
        ),
    ] = ["b7"],  # noqa: B006 - typer reads the default
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output bundle (default: <input>.<method>.jsonl).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="The target z to forget (default: each session's recorded forget request)."),
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="The flagged source s, if known (a source or block id).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model to replay with (default: the bundle's; weights must match).")
    ] = None,
    outbox: Annotated[
        Path | None,
        typer.Option(
            help="The real tool outbox (default: <input>.state/outbox.sqlite): a call id it holds has "
            "happened, so replay never fires it again, and its calls that carried the target are listed "
            "on every receipt."
        ),
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="For a bundle recorded on --engine openai: the server (overrides).")
    ] = None,
    force: Force = False,
    attest: Annotated[
        Path | None,
        typer.Option(
            help="A folder for signed per-session forget receipts (in-toto test-result Statements in DSSE "
            "envelopes; subjects the input and output bundles). Needs --signing-key.",
        ),
    ] = None,
    signing_key: SigningKey = None,
) -> None:
    """Apply forget methods to every session of a bundle and write the post-forget bundle.

    Each method branches from the same contaminated state. The output holds, per session and method,
    the post-forget state, a recompute ledger (transitions replayed, tokens reused / prefilled /
    decoded, wall time) and a forget receipt (where the target is left). Example:

    [bold]eu-audit unlearn --method b7 trace.jsonl[/]
    """
    from eu_audit.unlearn import unlearn as run_unlearn

    if attest is not None:
        from eu_audit.audits.evidence import load_signer

        if signing_key is None:
            raise BadInput("--attest needs --signing-key (an ed25519 private key, PEM)")
        load_signer(signing_key)
        if attest.exists() and not attest.is_dir():
            raise BadInput("--attest names a folder for the receipts; this is a file", path=str(attest))
    with progress_bar() as report:
        res = run_unlearn(
            bundle_path,
            method,
            out_path,
            target=target,
            source=source,
            model=model,
            outbox=outbox,
            server=server,
            force=force,
            progress=report,
        )
    table = Table(title=Text(f"{res.path}  (from {bundle_path})"))
    for col in (
        "session",
        "method",
        "tau",
        "replayed",
        "reused",
        "prefilled",
        "decoded",
        "wall s",
        "left behind",
    ):
        table.add_column(col, justify="right" if col not in ("session", "method", "left behind") else "left")
    for sid, name, led, rec in res.rows:
        left = ", ".join(f"{o.where}:{o.kind}" for o in rec.occurrences if o.where != "committed_tool_call")
        table.add_row(
            Text(sid),
            Text(name),
            str(led.tau),
            str(led.transitions_replayed),
            "unknown" if led.tokens_reused is None else str(led.tokens_reused),
            str(led.tokens_prefilled),
            str(led.tokens_decoded),
            f"{led.wall_s:.2f}",
            Text("clean", style="green") if rec.clean else Text(left, style="red"),
        )
    out.print(table)
    committed = {
        o.id for _, _, _, rec in res.rows for o in rec.occurrences if o.where == "committed_tool_call"
    }
    if committed:
        out.print(
            f"[yellow]note:[/] {len(committed)} committed tool call(s) carried the target before the forget "
            "(real side effects, outside any replay: assumption A3); listed in the receipts."
        )
    if attest is not None and signing_key is not None:
        _attest_unlearn(res, bundle_path, attest, signing_key, force)


def _attest_unlearn(res: Any, bundle_path: Path, folder: Path, key: Path, force: bool) -> None:
    from eu_audit.audits.evidence import forget_statement, mask_for, sha256_file, sign
    from eu_audit.jsonl import atomic_writer, check_output_path

    folder.mkdir(parents=True, exist_ok=True)
    subjects = [(bundle_path.name, sha256_file(bundle_path)), (res.path.name, sha256_file(res.path))]
    mask = mask_for(bundle_path)
    for sid, name, led, rec in res.rows:
        path = folder / f"{sid}.{name}.receipt.json"
        check_output_path(path, force=force)
        with atomic_writer(path, private=False) as f:  # digests only: no target
            f.write(json.dumps(sign(forget_statement(sid, name, led, rec, subjects, mask), key), indent=1))
    say(out, f"{len(res.rows)} signed forget receipt(s) in {folder}")
