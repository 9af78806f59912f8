"""``eu-audit report``: a Markdown report with PNG plots from sweep folders and audit JSON files.

Each figure is written next to the report with the exact command that made its data, the model, seed
and versions (from the sweep's ``sweep.json`` or the audit report), and the paper's figure beside ours.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from eu_audit.audit import FLOOR, AuditReport
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer
from eu_audit.sweeps import SweepRow, fit_line, load_rows

#: the paper's figures, quoted beside ours
PAPER = {
    "tau": "R^2 = 1.000 for B7's recompute against T - tau + 1; B5 flat",
    "indep": "B7's decode falls linearly with indep; B5' flat; equal at indep = 0",
    "granularity": "any-leak and CAD flat across policies; only reused prefill changes",
    "position": "leakage position-invariant; cost ratio B7/B5 from 0.91 (early) to 0.14 (late)",
    "boundary": "span-only excision leaks up to 93% and has CAD worse than no forgetting (Table 4)",
    "depth": "B3 degrades as derivation depth grows; B7 holds",
}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mean_by(rows: list[SweepRow], key: str, method: str) -> dict[float, float]:
    acc: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        if r.method == method:
            acc[r.x].append(float(getattr(r, key)))
    return {x: fmean(v) for x, v in sorted(acc.items())}


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
    manifest = json.loads((folder / "sweep.json").read_text())
    rows = load_rows(folder)
    if not rows:
        raise BadInput(f"{folder} has no rows yet (run the sweep first)", path=str(folder))
    name = manifest["sweep"]
    methods = list(dict.fromkeys(r.method for r in rows))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    facts: list[str] = []
    if name == "tau":
        for m in methods:
            pts = [(float(r.T - r.tau + 1), float(r.recomputed)) for r in rows if r.method == m]
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.scatter(xs, ys, label=m, s=14)
            fit = fit_line(xs, ys)
            facts.append(
                f"{m}: recomputed = {fit.slope:.1f} x (T - tau + 1) + {fit.intercept:.0f}, "
                f"R^2 = {fit.r2:.3f} (n = {fit.n})"
            )
            trans = [(float(r.T - r.tau + 1), float(r.transitions)) for r in rows if r.method == m]
            tf = fit_line([t[0] for t in trans], [t[1] for t in trans])
            facts.append(
                f"{m}: transitions replayed = {tf.slope:.2f} x (T - tau + 1) + {tf.intercept:.2f}, "
                f"R^2 = {tf.r2:.3f}"
            )
        ax.set_xlabel("T - tau + 1")
        ax.set_ylabel("recomputed tokens")
    elif name == "indep":
        for m in methods:
            series = _mean_by(rows, "decoded", m)
            ax.plot(list(series), list(series.values()), marker="o", label=m)
            if len(series) > 1:
                fit = fit_line(list(series), list(series.values()))
                facts.append(
                    f"{m}: decoded = {fit.slope:.0f} x indep + {fit.intercept:.0f}, R^2 = {fit.r2:.3f}"
                )
        ax.set_xlabel("indep (fraction of post-target turns independent of z)")
        ax.set_ylabel("decoded tokens (mean)")
    else:
        labels = list(dict.fromkeys(r.value for r in rows))
        width = 0.8 / max(1, len(methods))
        # What each bar sweep is about: the reused prefix (granularity), the cost (position), else leakage.
        metric = {"granularity": "reused", "position": "recomputed"}.get(name, "leak_any")
        for k, m in enumerate(methods):
            ys = [
                fmean(float(getattr(r, metric)) for r in rows if r.value == v and r.method == m)
                for v in labels
            ]
            ax.bar([i + k * width for i in range(len(labels))], ys, width=width, label=m)
        ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(labels))], labels)
        ax.set_ylabel(
            {"reused": "reused tokens (mean)", "recomputed": "recomputed tokens (mean)"}.get(
                metric, "any-leak rate"
            )
        )
        if metric == "leak_any":
            ax.set_ylim(0, 1.05)  # a rate: an all-zero sweep reads as zero, not as an empty axis
        if name == "position":
            for v in labels:
                b5 = fmean(r.recomputed for r in rows if r.value == v and r.method == "b5")
                b7 = fmean(r.recomputed for r in rows if r.value == v and r.method == "b7")
                d5 = fmean(r.decoded for r in rows if r.value == v and r.method == "b5")
                d7 = fmean(r.decoded for r in rows if r.value == v and r.method == "b7")
                facts.append(f"{v}: cost ratio B7/B5 = {b7 / b5:.2f} recomputed, {d7 / d5:.2f} decoded")
        if name == "granularity":
            for v in labels:
                cb = fmean(r.checkpoint_bytes for r in rows if r.value == v and r.method == methods[0])
                kept = fmean(r.reused for r in rows if r.value == v and r.method == "b7")
                facts.append(
                    f"{v}: checkpoint metadata {cb:.0f} bytes per session; B7 reuses {kept:.0f} tokens"
                )
    ax.set_title(f"sweep {name} ({manifest['model']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / f"sweep-{folder.name}.png"  # two folders may hold the same sweep (other builders)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines = [
        f"### sweep `{name}` ({folder.name}, {manifest['suite']} episodes): {manifest.get('describe', '')}",
        "",
        f"![{name}]({png.name})",
        "",
    ]
    lines += [f"- {f}" for f in facts]
    lines += [
        "",
        *_rate_table(rows, methods),
        "",
        f"Paper: {PAPER.get(name, '-')}.",
        "",
        f"Command: `{manifest['command']}`  ",
        f"Model {manifest['model']} (weights {manifest['weight_digest'][:12]}), seed {manifest['seed']}, "
        f"suite builder {manifest['suite']}, n = {manifest['n']} per value, turns after the target "
        f"{manifest['turns_after']}; eu-audit {manifest['eu_audit']}, torch {manifest['torch']}, "
        f"transformers {manifest['transformers']}.",
        "",
    ]
    return lines


def audit_section(path: Path, out: Path) -> list[str]:
    rep = AuditReport.model_validate_json(path.read_text())
    from eu_audit.audits.output import summary_lines

    metrics = [
        ("leak_probes", "Leak@probes"),
        ("leak5", "Leak@k"),
        ("leak_any", "any-leak"),
        ("cad", "CAD"),
        ("utility", "utility"),
        ("avoid", "avoid"),
        ("agreement", "agree"),
        ("recomputed", "recomputed"),
    ]
    lines = [f"### audit `{path.name}` ({rep.model})", "", *summary_lines(rep), ""]
    for suite in [*rep.suites, "all"]:
        lines += [
            f"**{suite}** (n = {next((c.n for c in rep.cells if c.suite == suite), 0)} per method)",
            "",
            "| method | " + " | ".join(lab for _, lab in metrics) + " |",
            "|---|" + "---|" * len(metrics),
        ]
        for method in [m for m in rep.methods if m != FLOOR] + [FLOOR]:
            c = next((c for c in rep.cells if c.method == method and c.suite == suite), None)
            if c is None:
                continue

            def fmt(m: str, c: Any = c) -> str:
                v = c.values.get(m)
                return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.2f}")

            name = f"{method} (floor)" if method == FLOOR else method
            lines.append(f"| {name} | " + " | ".join(fmt(m) for m, _ in metrics) + " |")
        lines.append("")
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
        f"Audit of `{rep.bundle}` (sha256 {rep.bundle_digest[:12]}), k = {rep.k} at T = {rep.temperature}, "
        f"seed {rep.seed}, margin {rep.margin}, eu-audit {rep.tool_version}.",
        "",
    ]
    return lines


def write_report(sweeps: list[Path], audits: list[Path], out: Path, title: str, notes: Path | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if notes:
        lines += [notes.read_text().strip(), ""]
    if audits:
        lines += ["## Audits", ""]
        for a in audits:
            lines += audit_section(a, out)
    if sweeps:
        lines += ["## Sweeps", ""]
        for s in sweeps:
            lines += sweep_section(s, out)
    path = out / "report.md"
    with atomic_writer(path, private=False) as f:
        f.write("\n".join(lines) + "\n")
    return path
