"""``eu-audit report``: a Markdown report with PNG plots from sweep folders and audit JSON files.

Each figure is written next to the report with the exact command that made its data, the model, seed
and versions (from the sweep's ``sweep.json`` or the audit report), and the paper's figure beside ours.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from eu_audit.audits.merge import read_audits, shard_audits
from eu_audit.audits.metric import report_metrics
from eu_audit.audits.model import FLOOR, AuditReport, read_report
from eu_audit.audits.output import fmt, row_order, shown_suites
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer, check_input_file
from eu_audit.sweeps import SWEEPS, SweepRow, load_rows


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rate_table(rows: list[SweepRow], methods: list[str]) -> list[str]:
    values = list(dict.fromkeys(r.value for r in rows))
    lines = [
        "| value | " + " | ".join(f"{m} leak / CAD / recomputed" for m in methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for v in values:
        cells = []
        for m in methods:
            rs = [r for r in rows if r.value == v and r.method == m]
            if not rs:
                cells.append("-")
                continue
            cads = [r.cad for r in rs if r.cad is not None]
            cells.append(
                f"{fmean(r.leak_any for r in rs):.2f} / {fmean(cads) if cads else 0:.2f} / "
                f"{fmean(r.recomputed for r in rs):.0f}"
            )
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return lines


def sweep_section(folder: Path, out: Path) -> list[str]:
    manifest = _sweep_manifest(folder)
    rows = load_rows(folder)
    if not rows:
        raise BadInput(f"{folder} has no rows yet (run the sweep first)", path=str(folder))
    spec = SWEEPS.get(manifest["sweep"])
    methods = list(dict.fromkeys(r.method for r in rows))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    facts = spec.plot(rows, ax)
    ax.set_title(f"sweep {spec.name} ({manifest['model']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / f"sweep-{folder.name}.png"  # two folders may hold the same sweep (other builders)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines = [
        f"### sweep `{spec.name}` ({folder.name}, {manifest['suite']} episodes): "
        f"{manifest.get('describe', '')}",
        "",
        f"![{spec.name}]({png.name})",
        "",
    ]
    lines += [f"- {f}" for f in facts]
    lines += [
        "",
        *_rate_table(rows, methods),
        "",
        f"Paper: {spec.paper}.",
        "",
        f"Command: `{manifest['command']}`  ",
        f"Model {manifest['model']} (weights {manifest['weight_digest'][:12]}) on engine "
        f"{manifest.get('engine', 'hf')}, seed {manifest['seed']}, "
        f"suite builder {manifest['suite']}, n = {manifest['n']} per value, turns after the target "
        f"{manifest['turns_after']}; eu-audit {manifest['eu_audit']}, torch {manifest['torch']}, "
        f"transformers {manifest['transformers']}; commit {manifest.get('commit', 'not recorded')}.",
        "",
    ]
    return lines


@dataclass(frozen=True)
class AuditSource:
    """One audit section's input: an audit ``--json`` report, or a folder of one run's shard audits that
    the report merges (``eu_audit.shards``), so its rows hold each state once and no merged copy."""

    path: Path
    files: tuple[Path, ...]

    @classmethod
    def of(cls, path: Path) -> AuditSource:
        return cls(path, tuple(shard_audits(path) if path.is_dir() else [path]))

    @property
    def is_shards(self) -> bool:
        return self.files != (self.path,)

    def read(self) -> AuditReport:
        return read_audits(self.files)


def audit_section(src: AuditSource, out: Path, findings: bool = False) -> list[str]:
    rep = src.read()
    path = src.path
    from eu_audit.audits.output import channel_table, summary_lines

    metrics = [m for m in report_metrics() if not m.when_measured or m.measured_in(rep.states)]
    n = len(src.files)
    merged = f", {n} shard audit{'s merged' if n > 1 else ''}" if src.is_shards else ""
    lines = [f"### audit `{path.name}` ({rep.model}{merged})", "", *summary_lines(rep), ""]
    for suite in shown_suites(rep):
        lines += [
            f"**{suite}** (n = {next((c.n for c in rep.cells if c.suite == suite), 0)} per method; "
            "* p<0.05, ** p<0.01 vs the floor)",
            "",
            "| method | " + " | ".join(m.label for m in metrics) + " |",
            "|---|" + "---|" * len(metrics),
        ]
        for method in row_order(rep):
            c = rep.cell(method, suite)
            if c is None:
                continue
            name = f"{method} (floor)" if method == FLOOR else method
            lines.append(f"| {name} | " + " | ".join(fmt(m, c) for m in metrics) + " |")
        lines.append("")
    lines += channel_table(rep)
    lines += _verdict_lines(rep)
    if findings:
        from eu_audit.audits.findings import findings_table

        lines += findings_table(rep)
    lines += _rates_plot(rep, path, out)
    # the behavioral distribution with the floor
    pref = [s for s in rep.states if s.suite == "preference" and s.values.get("avoid") is not None]
    if pref:
        plt = _plt()
        methods = [m for m in rep.methods if any(s.method == m for s in pref)]
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        ax.boxplot([[s.values["avoid"] for s in pref if s.method == m] for m in methods], tick_labels=methods)
        floor = [s.values["avoid"] for s in pref if s.method == FLOOR]
        if floor:
            ax.axhline(fmean(floor), linestyle="--", color="grey", label="B5 floor")  # type: ignore[arg-type]
            ax.legend(fontsize=8)
        ax.set_ylabel("avoid rate (picks the other provider)")
        ax.set_title(f"behavioral extraction ({rep.model})")
        fig.tight_layout()
        png = out / f"behavior-{path.stem}.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        lines += [f"![behavior]({png.name})", ""]
    lines += [
        f"Command: `{rep.command or 'not recorded'}`  ",
        f"Audit of `{rep.bundle}` (sha256 {_short_digests(rep.bundle_digest)}), "
        f"k = {rep.k} at T = {rep.temperature}, seed {rep.seed}, margin {rep.margin}, "
        f"eu-audit {rep.tool_version} (commit {rep.tool_commit or 'not recorded'}); model {rep.model}"
        + (f" (weights sha256 {rep.model_digest[:12]})" if rep.model_digest else "")
        + f" on {rep.engine}"
        + (f" ({rep.engine_facts['library']})" if rep.engine_facts.get("library") else "")
        + "."
        + (
            f" Texts re-scored from these rows by the matcher of commit {rep.rescored_by} "
            "(`eu-audit rescore`)."
            if rep.rescored_by
            else ""
        ),
        "",
    ]
    return lines


def _short_digests(digests: str) -> str:
    """A merged audit's bundle digest is its shards' digests joined by commas: name each, not the first."""
    return ", ".join(d[:12] for d in digests.split(","))


def _verdict_lines(rep: AuditReport) -> list[str]:
    """The gates' verdicts (each with its n, test and what would decide it) and the control map: which
    obligation each rule's measurement speaks to, as "this run measured X", never as legal advice."""
    from eu_audit.audits.evidence import controls_for

    if not rep.gates:
        return []
    lines = ["| rule | verdict | n | test | detail |", "|---|---|---|---|---|"]
    for g in rep.gates:
        lines.append(f"| `{g.rule}` | {g.outcome} | {g.n} | {g.test} | {g.detail} |")
    lines += ["", "What this run measured, by obligation (not legal advice):", ""]
    lines += [f"- {c}" for c in controls_for([g.rule for g in rep.gates])]
    return [*lines, ""]


def rates_figure(rep: AuditReport) -> tuple[Any, str] | None:
    """The 0..1 rates of the pooled cells (every suite when there is one), one group per metric, one bar
    per method, the floor's bar hatched: what the tables say, at a glance. The figure and its caption;
    None when the audit has no rate to draw. The Markdown report saves it as PNG, ``view`` as SVG."""
    suite = shown_suites(rep)[-1]
    cells = {m: c for m in row_order(rep) if (c := rep.cell(m, suite)) is not None}
    metrics = [
        m
        for m in report_metrics()
        if m.fmt == "rate" and any(c.values.get(m.name) is not None for c in cells.values())
    ]
    if not cells or not metrics:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.5, 1.1 * len(metrics) + 2), 3.4))
    width = 0.8 / len(cells)
    for i, (method, cell) in enumerate(cells.items()):
        values = [cell.values.get(m.name) for m in metrics]
        xs = [j + (i - (len(cells) - 1) / 2) * width for j in range(len(metrics))]
        ax.bar(
            xs,
            [v if v is not None else 0.0 for v in values],
            width,
            label=f"{method} (floor)" if method == FLOOR else method,
            hatch="//" if method == FLOOR else None,
            edgecolor="black",
            linewidth=0.5,
        )
    ax.set_xticks(range(len(metrics)), [m.label for m in metrics], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rate")
    n = next(iter(cells.values())).n
    ax.set_title(f"{suite} (n = {n} per method), {rep.model}; unmeasured rates drawn as 0", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, len(cells)))
    fig.tight_layout()
    return fig, f"rates per method, {suite}"


def _rates_plot(rep: AuditReport, path: Path, out: Path) -> list[str]:
    got = rates_figure(rep)
    if got is None:
        return []
    fig, caption = got
    png = out / f"rates-{path.stem}.png"
    fig.savefig(png, dpi=110)
    _plt().close(fig)
    return [f"![{caption}]({png.name})", ""]


#: beside report.md: the data it was made from, so ``eu-audit report --rows`` makes it again, byte for byte
ROWS = "rows"
MANIFEST = "report.json"


def _origin(audits: list[AuditSource], sweeps: list[Path]) -> dict[str, list[str]]:
    """(model, engine, commit) -> the inputs made under it: a report mixes them only when asked."""
    out: dict[str, list[str]] = {}
    for a in audits:
        for f in a.files:  # each shard on its own: a folder may hold shards made at different commits
            rep = read_report(f)
            commit = rep.tool_commit or f"release {rep.tool_version}"
            key = f"model {rep.model}, engine {rep.engine}, commit {commit}"
            out.setdefault(key, []).append(str(f))
    for folder in sweeps:
        m = _sweep_manifest(folder)
        commit = m.get("commit") or f"release {m.get('eu_audit', '?')}"
        out.setdefault(f"model {m['model']}, engine {m.get('engine', 'hf')}, commit {commit}", []).append(
            str(folder)
        )
    return out


def _listed(origins: dict[str, list[str]], show: Callable[[str], str]) -> str:
    """Each origin and its inputs, as the refusal and the report's mixed-input line state them."""
    return "; ".join(f"{k}: {', '.join(show(x) for x in v)}" for k, v in origins.items())


def _sweep_manifest(folder: Path) -> dict[str, Any]:
    manifest_path = folder / "sweep.json"
    if not manifest_path.is_file():
        raise BadInput("not a sweep folder (no sweep.json): run eu-audit sweep first", path=str(folder))
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"not valid JSON: {exc}", path=str(manifest_path)) from None
    return manifest


def write_report(
    sweeps: list[Path],
    audits: Sequence[Path | AuditSource],
    out: Path,
    title: str,
    notes: Path | str | None,
    *,
    allow_mixed: bool = False,
    findings: bool = False,
) -> Path:
    """report.md and its figures in ``out``, and beside them ``rows/``: a copy of every input (audit JSON,
    sweep rows and manifest) and ``report.json``, from which ``regenerate`` makes the same report.
    ``findings`` adds each audit's paper-vs-ours table (``eu_audit.audits.findings``). An audit input may be a
    folder of one run's shard audits: merged here, and saved as its shards (the manifest lists them)."""
    sources = [a if isinstance(a, AuditSource) else AuditSource.of(a) for a in audits]
    for f in (f for a in sources for f in a.files):
        check_input_file(f)
    origins = _origin(sources, sweeps)
    if len(origins) > 1 and not allow_mixed:
        listed = _listed(origins, str)  # full paths: the user is to find and fix the inputs
        raise BadInput(f"the inputs come from different models, engines or commits ({listed}); --allow-mixed")
    notes_text = notes.read_text() if isinstance(notes, Path) else notes
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if notes_text:
        lines += [notes_text.strip(), ""]
    if len(origins) > 1:  # allowed, and said where a reader sees it, not only in the rows
        listed = _listed(origins, lambda x: Path(x).name)  # names: the report is read elsewhere
        lines += [
            f"**Inputs from more than one model, engine or commit** (made with `--allow-mixed`): {listed}.",
            "",
        ]
    if audits:
        lines += ["## Audits", ""]
        for a in sources:
            lines += audit_section(a, out, findings)
    if sweeps:
        lines += ["## Sweeps", ""]
        for s in sweeps:
            lines += sweep_section(s, out)
    _save_rows(out / ROWS, sweeps, sources, title, notes_text, allow_mixed, findings)
    path = out / "report.md"
    with atomic_writer(path, private=False) as f:
        f.write("\n".join(lines) + "\n")
    return path


def _copy(src: Path, dst: Path) -> None:
    if src.resolve() != dst.resolve():
        dst.parent.mkdir(parents=True, exist_ok=True)
        with atomic_writer(dst, private=False) as f:
            f.write(src.read_text(encoding="utf-8"))


def _save_rows(
    rows: Path,
    sweeps: list[Path],
    audits: list[AuditSource],
    title: str,
    notes: str | None,
    allow_mixed: bool,
    findings: bool,
) -> None:
    for a in audits:
        for f in a.files:
            _copy(f, rows / "audits" / a.path.name / f.name if a.is_shards else rows / "audits" / a.path.name)
    for folder in sweeps:
        for name in ("sweep.json", "rows.jsonl"):
            _copy(folder / name, rows / "sweeps" / folder.name / name)
    manifest = {
        "format": "eu-audit/report@1",
        "title": title,
        "notes": notes,
        "audits": [a.path.name for a in audits],
        # a folder of shard audits: the shards this report merged (a shard landing later changes nothing)
        **(
            {"shards": {a.path.name: [f.name for f in a.files] for a in audits if a.is_shards}}
            if any(a.is_shards for a in audits)
            else {}
        ),
        "sweeps": [s.name for s in sweeps],
        "allow_mixed": allow_mixed,
        **({"findings": True} if findings else {}),  # absent when off: older manifests stay as they were
    }
    with atomic_writer(rows / MANIFEST, private=False) as f:
        f.write(json.dumps(manifest, indent=1) + "\n")


def regenerate(folder: Path, out: Path) -> Path:
    """The report whose rows are in ``folder`` (a report folder, or its ``rows/``), written to ``out``:
    byte for byte the report.md they were saved with."""
    rows = folder / ROWS if (folder / ROWS / MANIFEST).is_file() else folder
    path = rows / MANIFEST
    check_input_file(path)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        shards = manifest.get("shards") or {}
        audits = [
            AuditSource(rows / "audits" / a, tuple(rows / "audits" / a / str(f) for f in shards[a]))
            if a in shards
            else rows / "audits" / str(a)
            for a in map(str, manifest["audits"])
        ]
        sweeps = [rows / "sweeps" / str(s) for s in manifest["sweeps"]]
        title, notes = str(manifest["title"]), manifest.get("notes")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise BadInput(
            f"not a report's rows manifest ({type(exc).__name__}: {exc})", path=str(path)
        ) from None
    return write_report(
        sweeps,
        audits,
        out,
        title,
        notes,
        allow_mixed=bool(manifest.get("allow_mixed")),
        findings=bool(manifest.get("findings")),
    )
