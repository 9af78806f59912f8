"""``eu-audit view``: a static HTML site from audit reports. One folder, no server, no script and no
external fetch (it opens from disk and from a CI artifact); Jinja2 templates with autoescaping, charts as
SVG files from matplotlib.

What it reads: an audit ``--json`` file; a report folder (``eu-audit report``'s, whose ``rows/report.json``
names its audits, a folder of shard audits merged as one run); a folder of audits (each one a page, and a
comparison page with one row per audit); or a folder of report folders. It holds z only where the audit
does: an audit made with ``--reveal-target`` (its command says so) gives a site of 0600 files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eu_audit.audits.model import AuditReport
from eu_audit.audits.rules import overall
from eu_audit.errors import BadInput
from eu_audit.view.pages import AuditPage, audit_page

#: written into every site: a folder holding it is a site ``view`` made, and may be replaced
VIEW_MARKER = ".eu-audit-view"
REVEALED = "--reveal-target"


@dataclass(frozen=True)
class SweepSource:
    """One report's sweeps (``eu-audit report``'s sections, each with its plot): a page of their own."""

    label: str
    folders: tuple[Path, ...]
    title: str


@dataclass(frozen=True)
class Source:
    """One audit to show: its files (several: one run's shard audits, merged) and its title."""

    label: str
    files: tuple[Path, ...]
    title: str

    def read(self) -> AuditReport:
        from eu_audit.audits.merge import read_audits

        return read_audits(self.files)


def _is_audit(path: Path) -> bool:
    """A ``*.json`` that declares itself an audit report (a report manifest or a sweep's file is not)."""
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"eu-audit/audit@1"' in head


def _report_folder(folder: Path) -> list[Source | SweepSource]:
    """An ``eu-audit report`` folder: the audits its manifest names (a folder entry is one run's shards)."""
    rows = folder / "rows"
    try:
        manifest = json.loads((rows / "report.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"not a readable report manifest ({exc})", path=str(rows / "report.json")) from None
    out: list[Source | SweepSource] = []
    for name in manifest.get("audits", []):
        entry = rows / "audits" / name
        files = sorted(entry.glob("*.json")) if entry.is_dir() else [entry]
        title = manifest.get("title") or folder.name
        label = folder.name if len(manifest["audits"]) == 1 else f"{folder.name}/{Path(name).stem}"
        out.append(Source(label, tuple(files), title))
    if manifest.get("sweeps"):
        sweeps = tuple(rows / "sweeps" / str(name) for name in manifest["sweeps"])
        out.append(SweepSource(f"{folder.name}-sweeps", sweeps, manifest.get("title") or folder.name))
    return out


def find_sources(paths: Sequence[Path], *, merge: bool = False) -> list[Source | SweepSource]:
    """Every audit (and report's sweeps) the given paths hold, refused with exit 2 naming the path when one
    holds none."""
    out: list[Source | SweepSource] = []
    for path in paths:
        if path.is_file():
            out.append(Source(path.stem, (path,), path.stem))
            continue
        if not path.is_dir():
            raise BadInput("no such file or folder", path=str(path))
        if (path / "rows" / "report.json").is_file():
            out += _report_folder(path)
            continue
        audits = sorted(p for p in path.glob("*.json") if p.is_file() and _is_audit(p))
        if audits and merge:
            out.append(Source(path.name, tuple(audits), path.name))
            continue
        if audits:
            out += [Source(p.stem, (p,), p.stem) for p in audits]
            continue
        reports = sorted(d for d in path.iterdir() if (d / "rows" / "report.json").is_file())
        if not reports:
            raise BadInput("holds no audit (*.json) and no report folder", path=str(path))
        for d in reports:
            out += _report_folder(d)
    return out


def _slug(label: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") or "audit"
    slug, i = base, 2
    while slug in taken:
        slug, i = f"{base}-{i}", i + 1
    taken.add(slug)
    return slug


def _check_out(out: Path) -> None:
    """The site's folder: new, empty, or a site ``view`` made before (never someone's files)."""
    if out.exists() and not out.is_dir():
        raise BadInput("exists and is not a folder", path=str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / VIEW_MARKER).is_file():
        raise BadInput(
            "is a folder that view did not make; give a new or empty folder (view never writes over "
            "other files)",
            path=str(out),
        )


def _environment() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("eu_audit.view", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,  # a name the template expects and the page lacks is a bug, not a blank
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["cls"] = lambda word: re.sub(r"[^a-z]+", "-", str(word).lower()).strip("-")
    return env


def _chart(page: AuditPage, out: Path, private: bool) -> None:
    """The rates chart as SVG, written with no date and a fixed hash salt: the same audit, the same file."""
    from eu_audit.jsonl import atomic_writer
    from eu_audit.view.report import _plt, rates_figure

    got = rates_figure(page.report)
    if got is None:
        return
    import io

    import matplotlib

    fig, caption = got
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "eu-audit", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    _plt().close(fig)
    name = f"{page.slug}-rates.svg"
    with atomic_writer(out / name, private=private) as f:
        f.write(buf.getvalue())
    page.charts.append((name, caption))


def build_site(paths: Sequence[Path], out: Path, *, merge: bool = False) -> list[Path]:
    """Write the site: one page per audit and ``index.html`` (the comparison, or the one audit's page when
    there is one). Returns the files written. Every input is read and checked before anything is written."""
    from eu_audit.jsonl import atomic_writer

    sources = find_sources(paths, merge=merge)
    _check_out(out)
    # a bad file is refused before any page is written
    reports = [(s, s.read()) for s in sources if isinstance(s, Source)]
    sweeps = [s for s in sources if isinstance(s, SweepSource)]
    out.mkdir(parents=True, exist_ok=True)
    private = any(REVEALED in rep.command for _, rep in reports)
    env = _environment()
    taken: set[str] = {"index"}
    pages = [
        audit_page(rep, _slug(s.label, taken), s.title, ", ".join(map(str, s.files))) for s, rep in reports
    ]
    written = []
    for page in pages:
        _chart(page, out, private)
    sweep_pages = [_sweep_page(env, s, _slug(s.label, taken), out) for s in sweeps]
    many = len(pages) + len(sweep_pages) > 1
    css = env.get_template("style.css").render()
    for name, text in [
        ("style.css", css),
        *[(f"{p.slug}.html", env.get_template("audit.html.j2").render(page=p, many=many)) for p in pages],
        *sweep_pages,
        ("index.html", _index(env, pages, [(p[0], s) for p, s in zip(sweep_pages, sweeps, strict=True)])),
    ]:
        with atomic_writer(out / name, private=private) as f:
            f.write(text)
        written.append(out / name)
    with atomic_writer(out / VIEW_MARKER, private=False) as f:
        f.write("a site written by eu-audit view; view may replace this folder's files\n")
    plots = [f for slug, _ in sweep_pages for f in sorted((out / slug.removesuffix(".html")).glob("*.png"))]
    return [*written, *(out / name for p in pages for name, _ in p.charts), *plots]


def _sweep_page(env: Any, source: SweepSource, slug: str, out: Path) -> tuple[str, str]:
    """A report's sweeps as one page: each sweep's section (its plot, facts, rate table, paper and command)
    as ``eu-audit report`` writes it, rendered from Markdown, its plot in a folder of the page's own."""
    from markdown_it import MarkdownIt

    from eu_audit.view.report import sweep_section

    folder = out / slug
    folder.mkdir(exist_ok=True)
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    sections = []
    for sweep in source.folders:
        text = "\n".join(sweep_section(sweep, folder))
        # the plot lies in the page's folder: its link from the page goes through it
        sections.append(md.render(text.replace("](sweep-", f"]({slug}/sweep-")))
    html = env.get_template("sweeps.html.j2").render(title=source.title, slug=slug, sections=sections)
    return f"{slug}.html", html


def _index(env: Any, pages: list[AuditPage], sweeps: list[tuple[str, SweepSource]]) -> str:
    if len(pages) == 1 and not sweeps:
        return env.get_template("audit.html.j2").render(page=pages[0], many=False)
    verdict = overall([p.verdict for p in pages if p.verdict != "no rules"])
    return env.get_template("index.html.j2").render(pages=pages, verdict=verdict, sweeps=sweeps)
