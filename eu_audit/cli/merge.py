"""``eu-audit merge``: join shard bundles or shard audits into one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eu_audit.cli.app import (
    Force,
    app,
    out,
    say,
)
from eu_audit.cli.audit import (
    AuditGateSet,
    AuditSarif,
    AuditSummaryMd,
    CiOutputs,
    apply_gates,
    check_acceptance,
)
from eu_audit.errors import BadInput


@app.command()
def merge(
    files: Annotated[list[Path], typer.Argument(help="Shard bundles, or shard audits (--json reports).")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The merged bundle or audit JSON.")],
    gate: Annotated[
        list[str] | None,
        typer.Option(
            help="With audits: rules to decide on the union (default: every rule a shard was gated with)."
        ),
    ] = None,
    gate_set: AuditGateSet = None,
    junit_path: Annotated[Path | None, typer.Option("--junit", help="With audits: JUnit XML.")] = None,
    sarif_path: AuditSarif = None,
    summary_md: AuditSummaryMd = None,
    on_inconclusive: Annotated[str, typer.Option(help="With audits: fail (exit 4) or pass.")] = "fail",
    on_insensitive: Annotated[
        str,
        typer.Option(
            help="With audits: a rule its positive control did not fail (insensitive): fail (exit 4) or pass."
        ),
    ] = "fail",
    force: Force = False,
) -> None:
    """Join the shards of one run: bundles into one bundle (then audit it), or shard audits into one
    audit whose statistics are recomputed over every session, as a single run's would be. Shards of
    different models, engines, suites or seeds, or that share a session, are refused (exit 2). Merged
    audits are gated on the union (exit codes as audit's): by --gate / --gate-set, else by every rule the
    shards were gated with, each decided again on all the sessions.

    Examples:

    [bold]eu-audit merge bb.1.jsonl bb.2.jsonl -o bb.jsonl[/]
    [bold]eu-audit merge a1.json a2.json -o audit.json --gate-set forget[/]
    """
    from eu_audit.audits.merge import merge_reports
    from eu_audit.jsonl import check_output_path
    from eu_audit.shards import merge_bundles

    check_acceptance(on_inconclusive, on_insensitive)
    check_output_path(out_path, force=force)
    try:
        head = files[0].read_bytes()[:200].lstrip() if files else b""
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(files[0])) from None
    if head.startswith(b'{"type":"header"') or head.startswith(b'{"type": "header"'):
        if gate or gate_set or junit_path or sarif_path or summary_md:  # never a gate silently undecided
            raise BadInput(
                "--gate, --gate-set, --junit, --sarif and --summary-md decide merged audits; gate merged "
                f"bundles with `eu-audit audit {out_path} --gate-set ...`"
            )
        merged = merge_bundles(files, out_path, force=force)
        say(out, f"wrote {merged} ({len(files)} shards); audit it with: eu-audit audit {merged}")
        return
    for path in (junit_path, sarif_path, summary_md):
        if path is not None:
            check_output_path(path, force=force)
    from eu_audit.audits.gate import check_rules, expand_gate_sets, gated_rules

    rep = merge_reports(files)
    measured = {m for s in rep.states for m, v in s.values.items() if v is not None}
    rules = [*expand_gate_sets(gate_set or [], rep.methods, rep.side, measured), *(gate or [])]
    rules = rules or gated_rules(rep)  # the shards' own, decided on the union
    check_rules(rules, rep.methods, rep.suites)
    apply_gates(
        rep,
        rules,
        (out_path, junit_path, None),
        on_inconclusive,
        on_insensitive=on_insensitive,
        ci=CiOutputs(sarif_path, summary_md, str(files[0])),
    )
