"""The pack's table: one row per case, one word per release, and the two figures a reader wants: recall
(the releases with the bug that the gate failed, naming the place) and false alarms (fixed releases the
gate failed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from eu_audit.pack.case import Case
from eu_audit.pack.run import ReleaseResult
from eu_audit.trace.records import AGENT_METHOD


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


def measured_results(cases: list[Case]) -> list[ReleaseResult]:
    """The runs of cases marked not reproduced after they ran (``Case.measured``): still counted."""
    out = []
    for c in cases:
        for rel in c.releases:
            if rel.name in c.measured:
                verdict = c.measured[rel.name]
                r = ReleaseResult(c.name, c.stack, rel.name, list(rel.pins), rel.expect, verdict=verdict)
                r.as_expected = verdict == rel.expect and rel.expect != "failed"
                out.append(r)
    return out


def figures(cases: list[Case], results: list[ReleaseResult]) -> tuple[str, str]:
    """Recall over every buggy release that ran, false alarms over every fixed one that ran: a case marked
    not reproduced after it ran still counts its run (``Case.measured``)."""
    by = {(r.case, r.release): r for r in [*measured_results(cases), *results]}
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
                got = c.measured.get(rel.name)
                said = f"{got}, n = {c.n} (ran; expected {rel.expect}: below)" if got else "not reproduced"
                cells += [", ".join(rel.pins), said]
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


def redecided(folder: Path, cases: list[Case], results: list[ReleaseResult]) -> list[ReleaseResult]:
    """Each release whose masked audit is kept in ``folder/rows`` decided again from it by today's rules,
    gated on its case's rules and on every rule of the forget set its run measured (a fixed release
    holds only where nothing the gate reads keeps z, each hold earned against its control)."""
    from eu_audit.audits.gate import evaluate, expand_gate_sets
    from eu_audit.audits.model import read_report
    from eu_audit.audits.rules import overall

    by_name = {c.name: c for c in cases}
    out = []
    for r in results:
        rows = folder / "rows" / f"{r.case}-{r.release}.audit.json"
        case = by_name.get(r.case)
        if case is None or not rows.is_file() or r.verdict == "run failed":
            out.append(r)
            continue
        rep = read_report(rows)
        # the forget set's facts about what the release keeps or loses (its stores, files, prompts, another
        # tenant's memories), where its run measured them: what a case's store bug is about. The rules on
        # what the agent says need a model that repeats z (the pack runs on SmolLM2: they never decide)
        measured = {
            m for s in rep.states if s.method == AGENT_METHOD for m, v in s.values.items() if v is not None
        }
        forget = [
            r for r in expand_gate_sets(["forget"], rep.methods, rep.side, measured) if _keeps(r, measured)
        ]
        rules = list(dict.fromkeys([*case.gate, *forget]))
        gates = evaluate(rep, rules)
        again = replace(r, rules={g.rule: g.outcome for g in gates})
        again.verdict = overall(g.outcome for g in gates)
        if again.verdict != "failed":
            open_ = [f"{g.rule} {g.outcome}" for g in gates if g.outcome != "held"]
            again.where = "; ".join(open_)
        else:
            failed = "; ".join(f"{g.rule}: {g.detail}" for g in gates if g.outcome == "failed")
            again.where = r.where if r.verdict == "failed" else failed
        again.as_expected = again.verdict == r.expect and (r.expect != "failed" or r.named)
        out.append(again)
    return out


def _keeps(rule: str, measured: set[str]) -> bool:
    """A rule of the forget set on what a release keeps or loses, which its run measured."""
    from eu_audit.audits.gate import parse_rule
    from eu_audit.audits.metric import METRICS

    metric = parse_rule(rule).metric
    return metric in measured and (METRICS.get(metric).shows == "keeps" or not METRICS.get(metric).control)


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
[`results.jsonl`](results.jsonl) and keeps its masked audit in `rows/`. Every verdict below is decided
again from those audits by today's rules, each release gated on its case's rules and on every rule of the
forget set on what it keeps or loses that its run measured (stores, files, prompts, a bystander's
memories), each hold earned against the no-forget tenant: a fixed release that still
keeps z somewhere the gate reads fails (mem0-4349's history table, the open mem0-6512), and one whose
rules its control could not fail reads insensitive. A case marked not reproduced after it ran keeps its
run's verdicts in the figures.
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
    return write_readme(folder, cases, merged)


def write_readme(folder: Path, cases: list[Case], results: list[ReleaseResult]) -> Path:
    """README.md from the rows: every release decided again by today's rules (``redecided``)."""
    from eu_audit.jsonl import atomic_writer

    readme = folder / "README.md"
    with atomic_writer(readme, private=False) as f:
        f.write(readme_text(folder, cases, results))
    return readme


def readme_text(folder: Path, cases: list[Case], results: list[ReleaseResult]) -> str:
    now = redecided(folder, cases, results)
    shown = [c for c in cases if not c.runnable or any(r.case == c.name for r in now)]
    return "\n".join([HEADER, *table(shown, now), "", "Per release:", "", *details(now), ""])
