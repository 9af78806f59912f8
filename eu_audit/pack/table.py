"""The pack's table: one row per case, one word per release, and the two figures a reader wants: recall
(the releases with the bug that the gate failed, naming the place) and false alarms (fixed releases the
gate failed)."""

from __future__ import annotations

import json
from pathlib import Path

from eu_audit.pack.case import Case
from eu_audit.pack.run import ReleaseResult


def read_results(path: Path) -> list[ReleaseResult]:
    """A pack run's rows (``results.jsonl``); a release run twice keeps its last row."""
    latest: dict[tuple[str, str], ReleaseResult] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = ReleaseResult(**json.loads(line))
            latest[(r.case, r.release)] = r
    return list(latest.values())


def _word(r: ReleaseResult | None, n: int) -> str:
    """One word and its n (the release ran the case's sessions), and what was expected where it differs."""
    if r is None:
        return "not run"
    mark = "" if r.as_expected else " (expected " + r.expect + ")"
    return f"{r.verdict}, n = {n}{mark}" if r.verdict != "run failed" else f"{r.verdict}{mark}"


def figures(cases: list[Case], results: list[ReleaseResult]) -> tuple[str, str]:
    """Recall over the buggy releases that ran, false alarms over the fixed ones that ran."""
    by = {(r.case, r.release): r for r in results}
    keys = [(rel.expect, (c.name, rel.name)) for c in cases for rel in c.releases]
    ran_of = [(expect, by[key]) for expect, key in keys if key in by]
    buggy = [r for expect, r in ran_of if expect == "failed"]
    fixed = [r for expect, r in ran_of if expect == "held"]
    ran = [r for r in buggy if r.verdict != "run failed"]
    caught = sum(r.as_expected for r in ran)
    alarms = sum(r.verdict == "failed" for r in fixed)
    recall = f"recall {caught} of {len(ran)} releases with the bug (failed, naming the place)"
    false = f"false alarms {alarms} of {len(fixed)} fixed releases"
    return recall, false


def table(cases: list[Case], results: list[ReleaseResult]) -> list[str]:
    by = {(r.case, r.release): r for r in results}
    lines = [
        "| case | stack | what the bug leaves | release with the bug | verdict | fixed release | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        buggy = next((r for r in c.releases if r.expect == "failed"), None)
        fixed = next((r for r in c.releases if r.expect == "held"), None)
        cells = [f"[{c.name}]({c.bug})", c.stack, c.leaves]
        for rel in (buggy, fixed):
            if rel is not None and not c.runnable:
                cells += [", ".join(rel.pins), "not reproduced"]
                continue
            if rel is None:
                cells += [c.fixed or "none", "-"]
                continue
            cells += [", ".join(rel.pins), _word(by.get((c.name, rel.name)), c.n)]
        lines.append("| " + " | ".join(cells) + " |")
    recall, false = figures(cases, results)
    skipped = [c for c in cases if not c.runnable]
    tail = [f"{recall}; {false}; {len(cases) - len(skipped)} of {len(cases)} cases reproduced."]
    if skipped:
        tail += ["", "Not reproduced here, and why:", ""]
        tail += [f"- `{c.name}` ({c.stack}, {c.title}): {c.not_reproduced}" for c in skipped]
    return [*lines, "", *tail]


def details(results: list[ReleaseResult]) -> list[str]:
    """Per release: where the failed rules named z, or why the release did not run."""
    out = []
    for r in results:
        said = (r.where or "every rule held") if r.verdict == "held" else (r.where or r.detail)
        pins = ", ".join(r.pins) or "no pins"
        out.append(f"- `{r.case}` {r.release} ({pins}): **{r.verdict}**, {said} ({r.seconds:.0f} s)")
    return out


HEADER = """# The residue pack: reported deletion bugs, through the gate

Each case is a deletion bug that users of a stack reported, pinned to the release that has it and, where
there is one, the release that fixed it; the same reference agent and episode run on each release, and
the gate must **fail** the buggy release naming the place (a table, a file region, a vector, a bystander)
and **hold** the fixed one. Cases: [`pack/`](../../pack/) (one `case.toml` each); made by
`eu-audit pack run [CASE] -o OUT --report reports/pack`, which adds each release's row to
[`results.jsonl`](results.jsonl) and keeps its masked audit in `rows/`.
"""


def write_pack_report(folder: Path, cases: list[Case], results: list[ReleaseResult], run: Path) -> Path:
    """Add ``results`` to the report folder's rows (a release run again replaces its row), keep each
    release's masked audit beside them, and write README.md from every row there."""
    import shutil

    from eu_audit.jsonl import atomic_writer

    folder.mkdir(parents=True, exist_ok=True)
    rows = folder / "results.jsonl"
    kept = read_results(rows) if rows.is_file() else []
    new = {(r.case, r.release) for r in results}
    merged = [r for r in kept if (r.case, r.release) not in new] + results
    merged.sort(key=lambda r: (r.case, r.release))
    with atomic_writer(rows, private=False) as f:
        f.write("".join(r.row() + "\n" for r in merged))
    for r in results:
        audit = run / r.case / r.release / "audit.json"
        if audit.is_file():  # masked: the audit never holds z unless made with --reveal-target
            (folder / "rows").mkdir(exist_ok=True)
            shutil.copyfile(audit, folder / "rows" / f"{r.case}-{r.release}.audit.json")
    readme = folder / "README.md"
    shown = [c for c in cases if not c.runnable or any(r.case == c.name for r in merged)]
    with atomic_writer(readme, private=False) as f:
        f.write("\n".join([HEADER, *table(shown, merged), "", "Per release:", "", *details(merged), ""]))
    return readme
