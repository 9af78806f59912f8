"""``eu-audit verify``: check a signed receipt against the files it names."""

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


@app.command()
def verify(
    receipt: Annotated[Path, typer.Argument(help="A forget receipt (audit --attest): a DSSE envelope.")],
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="The receipt's subjects to check: the audit JSON (required), the bundle, the build."
        ),
    ] = None,
    key: Annotated[Path, typer.Option(help="The signer's ed25519 public key (PEM).")] = Path("key.pub.pem"),
) -> None:
    """Check a forget receipt: its signature, that the files given are its subjects, and that its verdict
    follows from the audit rows it names (recomputed). Prints what it proves and what it does not.

    Exit codes: 0 valid, 1 the verdict does not follow from the rows, 2 bad input or signature.

    Example:

    [bold]eu-audit verify receipt.json audit.json bb.jsonl --key signer.pub.pem[/]
    """
    from eu_audit.evidence import verify_receipt

    result = verify_receipt(receipt, key, files or [])
    for line in result.lines:
        say(out, Text(line))
    if not result.follows:
        raise typer.Exit(1)
