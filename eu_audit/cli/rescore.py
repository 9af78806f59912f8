"""``eu-audit rescore``: decide an audit's texts again with today's matcher, from its rows alone."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from eu_audit.cli.app import Force, app, out, say
from eu_audit.errors import BadInput


def _pairs(audit: Path, out_path: Path) -> list[tuple[Path, Path]]:
    """(input, output) per audit file: one file to one file, a folder of shard audits to a folder."""
    from eu_audit.audits.merge import shard_audits

    if audit.is_dir():
        if out_path.exists() and not out_path.is_dir():
            raise BadInput(
                "the input is a folder of shard audits, so the output must be a folder", path=str(out_path)
            )
        return [(p, out_path / p.name) for p in shard_audits(audit)]
    if out_path.is_dir():
        return [(audit, out_path / audit.name)]
    return [(audit, out_path)]


@app.command("rescore")
def rescore_command(
    audit: Annotated[Path, typer.Argument(help="An audit JSON (audit --json), or a folder of shard audits.")],
    out_path: Annotated[
        Path, typer.Option("--out", "-o", help="The re-scored audit JSON (a folder for a folder).")
    ],
    suite: Annotated[
        list[str] | None,
        typer.Option(
            help="Where the targets come from: a suite name or episodes JSONL (default: the audit's suites)."
        ),
    ] = None,
    force: Force = False,
) -> None:
    """Decide an audit's probe answers and samples again with today's target matcher, from the audit
    JSON alone (no model runs), and recompute its cells, p-values and gates.

    A text the audit counted stays counted (its span is masked); a text it did not is searched again for
    its session's target, read from the suite's episode; every span found now is masked too. any-leak,
    action leakage and the residue audits read the state and the serve log, which the JSON does not keep:
    they are left as they were, and said so. The input is never changed. Exit 0, or 2 on bad input.

    Examples:

    [bold]eu-audit rescore audit.json -o audit.rescored.json[/]
    [bold]eu-audit rescore reports/audit-qwen2.5/rows/audits/slices -o /tmp/slices[/]
    """
    from eu_audit.audits.model import read_report
    from eu_audit.audits.rescore import RescoreCounts, from_state, rescore, suite_targets
    from eu_audit.build_info import source_commit
    from eu_audit.jsonl import atomic_writer, check_output_path

    pairs = _pairs(audit, out_path)
    for src, dst in pairs:
        if dst.resolve() == src.resolve():
            raise BadInput("the output is the input: eu-audit never overwrites an input", path=str(dst))
    reports = [(src, dst, read_report(src)) for src, dst in pairs]
    if out_path != pairs[0][1]:
        out_path.mkdir(parents=True, exist_ok=True)
    for _, dst, _ in reports:
        check_output_path(dst, force=force)
    refs = suite or sorted({s for _, _, r in reports for s in r.suites})
    targets = {}
    for ref in refs:
        targets.update(suite_targets(ref))
    commit = source_commit()
    total = RescoreCounts()
    for src, dst, rep in reports:
        new, counts = rescore(rep, targets, source=str(src), rescored_by=commit)
        total.probes.update(counts.probes)
        total.sample_sets.update(counts.sample_sets)
        total.masked += counts.masked
        with atomic_writer(dst, private=True) as f:  # 0600: masked, but it says where z stayed
            f.write(new.model_dump_json(indent=1))
    t = Table(title=f"newly found to hold z by the matcher of {commit}")
    for col in ("method", "suite", "probe answers", "sample sets (Leak@k)"):
        t.add_column(col)
    for key in sorted(set(total.probes) | set(total.sample_sets)):
        t.add_row(key[0], key[1], str(total.probes[key]), str(total.sample_sets[key]))
    if total.probes or total.sample_sets:
        out.print(t)
        say(
            out,
            f"in all: {sum(total.probes.values())} probe answer(s) and {sum(total.sample_sets.values())} "
            "sample set(s) now hold z",
        )
    else:
        say(out, "no text changed its verdict: the matcher finds nothing more in these rows")
    say(out, f"texts with a span masked now that the old mask left in clear: {total.masked}")
    say(
        out,
        "left as they were (they read the state or the serve log, which an audit JSON does not keep): "
        + ", ".join(from_state()),
    )
    say(out, f"wrote {len(reports)} audit(s): {pairs[0][1] if len(pairs) == 1 else out_path}")
