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


@app.command("verify")
def verify_command(
    receipt: Annotated[Path, typer.Argument(help="A forget receipt (audit --attest): a DSSE envelope.")],
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="The receipt's subjects: the audit JSON, the bundle, the build. Every one it names must be "
            "given, unless --partial."
        ),
    ] = None,
    key: Annotated[Path, typer.Option(help="The signer's ed25519 public key (PEM).")] = Path("key.pub.pem"),
    partial: Annotated[
        bool,
        typer.Option(
            help="Check only the subjects given (the audit JSON at least); the others are printed as NOT "
            "CHECKED. Without it, a missing subject is exit 2."
        ),
    ] = False,
) -> None:
    """Check a forget receipt: a signature that verifies under --key (the key's id is printed, never the
    id a signature claims), every subject it names given and matching, and its verdict following from the
    audit rows (recomputed). Prints what it proves ("proves" only for a PASSED verdict; "measured"
    otherwise) and what it does not.

    Exit codes, so a CI step can gate on the verdict itself: 0 a verified PASSED, 1 a verified FAILED,
    4 a verified WARNED (inconclusive or insensitive), 2 a receipt that does not verify (signature,
    subjects, or a verdict that does not follow from the rows) or bad input.

    Example:

    [bold]eu-audit verify receipt.json audit.json bb.jsonl build.json --key signer.pub.pem[/]
    """
    from eu_audit.audits.evidence import verify_receipt

    result = verify_receipt(receipt, key, files or [], partial=partial)
    for line in result.lines:
        say(out, Text(line))
    if result.exit_code:
        raise typer.Exit(result.exit_code)
