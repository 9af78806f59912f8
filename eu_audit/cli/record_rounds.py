"""``eu-audit record --until-decided`` on the runtime (white-box): record, forget and audit in rounds
until the gate set is decided (``eu_audit.whitebox_rounds``), then print, write and exit as ``audit``
does on the merged audit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from eu_audit.cli.app import out, progress_bar, say

if TYPE_CHECKING:
    from eu_audit.record import RecordOptions
    from eu_audit.rounds import Gate

RecordMethods = Annotated[
    list[str] | None,
    typer.Option(
        "--methods",
        help="With --until-decided (white-box): the forget methods each round's sessions are audited under "
        "(default b7), the floor B5 and the no-forget control B0 always with them.",
    ),
]
RecordJson = Annotated[
    Path | None,
    typer.Option(
        "--json",
        help="With --until-decided (white-box): write the audit of all the rounds' sessions (audit@1).",
    ),
]


def run_white_rounds(
    rec: RecordOptions, gate: Gate, methods: list[str] | None, k: int, json_path: Path | None
) -> None:
    """Rounds of record, forget and audit on the runtime; the merged audit decided, written and exited
    with (0 held, 1 failed, 4 undecided), its stop said first."""
    from eu_audit.audit import AuditOptions
    from eu_audit.audits.evidence import mask_for
    from eu_audit.build_info import command_line
    from eu_audit.cli.audit import apply_gates
    from eu_audit.jsonl import check_output_path
    from eu_audit.whitebox_rounds import WhiteBoxRounds, record_until_decided_white

    if json_path is not None:
        check_output_path(json_path, force=rec.force)  # refused now, not after every round ran
    opts = AuditOptions(
        methods=tuple(methods or ("b7",)),
        k=k,
        alpha=gate.alpha,
        margin=gate.margin,
        command=command_line(),
    )
    with progress_bar() as report:
        rep, rules, stop = record_until_decided_white(rec, WhiteBoxRounds(opts, gate), progress=report)
    say(out, f"{rec.out}: {stop.sentence()}")
    rep = mask_for(rec.out).report(rep)
    apply_gates(rep, rules, (json_path, None, None), "fail")
