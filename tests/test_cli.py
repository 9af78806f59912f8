"""The command line: exit codes (0 ok, 2 bad input), clear messages, no tracebacks for user mistakes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eu_audit.episodes import Episode

from .helpers import exit_and_heavy_imports
from .helpers import run_cli as run


def test_record_on_the_tiny_model_writes_a_bundle_and_inspect_reads_it(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "t.jsonl"
    proc = run("record", "--model", "tiny-random", "--n", "3", "--seed", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "checkpoints:" in proc.stdout and "s2" in proc.stdout
    proc = run("inspect", str(out), "--session", "s1")
    assert proc.returncode == 0 and "holds target" in proc.stdout
    again = run("record", "--model", "tiny-random", "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["record", "--model", "meta-llama/Llama-3.1-8B-Instruct"], "no model hub is reachable"),
        (["record", "--model", "no-such-model"], "unknown model"),
        (["record", "--model", "/nowhere/model.gguf"], "GGUF file not found"),
        (["record", "--suite", "nope"], "unknown suite 'nope'"),
        (["record", "--n", "0", "--model", "tiny-random"], "--n must be at least 1"),
        (["inspect", "/nowhere/trace.jsonl"], "no such file"),
        (["suites", "show", "/nowhere/eps.jsonl"], "no such file"),
        (["record", "--checkpoints", "hourly"], "Invalid value"),
    ],
)
def test_user_mistakes_exit_2_with_a_message_and_no_traceback(
    args: list[str], needle: str, tmp_path: Path
) -> None:
    proc = run(*args, "--out", str(tmp_path / "x.jsonl")) if args[0] == "record" else run(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_a_command_refused_on_its_input_never_loads_a_model_library(tmp_path: Path) -> None:
    """Everything that can be checked is checked before any model runs: a mistake is answered before
    torch, transformers or llama.cpp are even imported (each costs seconds)."""
    missing = str(tmp_path / "missing.jsonl")
    commands = [
        ["audit", missing],
        ["unlearn", missing, "-m", "b7"],
        ["record", "--suite", "no-such-suite", "--out", str(tmp_path / "o.jsonl")],
        ["report", "--rows", str(tmp_path / "nothing"), "-o", str(tmp_path / "r")],
        ["merge", missing, missing, "-o", str(tmp_path / "m.json")],
        ["power", missing],
    ]
    for args in commands:
        assert exit_and_heavy_imports(*args) == "exit 2 loaded []", args


def test_listing_the_suites_never_imports_agentdojo() -> None:
    """``suites list`` counts episodes; the toolset check (AgentDojo, seconds to import) runs when a run
    loads a suite, never for a listing."""
    assert exit_and_heavy_imports("suites", "list") == "exit 0 loaded []"


def test_a_bad_suite_file_names_its_line_and_field(builtin: list[Episode], tmp_path: Path) -> None:
    lines = [e.model_dump_json() for e in builtin]
    broken = json.loads(lines[1])
    broken["steps"][1]["kind"] = "telepathy"
    path = tmp_path / "eps.jsonl"
    path.write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
    proc = run("suites", "show", str(path))
    assert proc.returncode == 2
    assert "eps.jsonl:2" in proc.stderr and "steps.1.kind" in proc.stderr


def test_schema_and_listings(tmp_path: Path) -> None:
    proc = run("schema")
    assert proc.returncode == 0 and json.loads(proc.stdout)["$id"] == "eu-audit/trace@2"
    listed = run("suites", "list")
    assert listed.returncode == 0 and "builtin" in listed.stdout
    models = run("models")
    assert (
        models.returncode == 0 and "qwen2.5-coder-0.5b" in models.stdout and "smollm2-135m" in models.stdout
    )


def test_the_ci_examples_are_valid_workflows_naming_only_options_that_exist() -> None:
    import re
    import shlex

    import yaml

    root = Path(__file__).resolve().parent.parent
    commands: list[list[str]] = []
    for wf in [root / "action.yml", *sorted((root / "examples" / "ci").glob("*.yml"))]:
        doc = yaml.safe_load(wf.read_text())
        jobs = doc["jobs"].values() if "jobs" in doc else [doc["runs"]]  # a workflow, or the action
        assert jobs, wf
        for job in jobs:
            for step in job["steps"]:
                script = re.sub(r"\\\n\s*", " ", step.get("run", ""))
                for line in script.splitlines():
                    if line.strip().startswith("eu-audit "):
                        commands.append(shlex.split(line.split(">")[0].replace("&", "")))
    assert {c[1] for c in commands} >= {"serve", "gate", "audit", "merge", "view"}
    helps: dict[str, str] = {}
    for cmd in commands:
        name = cmd[1]
        if name not in helps:
            helps[name] = run(name, "--help").stdout
        for opt in (t.split("=")[0] for t in cmd[2:] if t.startswith("--")):
            assert opt in helps[name], f"eu-audit {name} has no {opt}"


def test_without_a_terminal_progress_is_plain_lines_not_a_silent_bar(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a CI log a bar cannot draw: a half-hour record must still say how far it is."""
    import importlib

    from rich.console import Console

    cli_app = importlib.import_module("eu_audit.cli.app")  # the package exports the Typer app as `app`

    monkeypatch.setattr(cli_app, "err", Console(stderr=True, force_terminal=False))
    with cli_app.progress_bar() as report:
        for done, what in enumerate(["s0/agent", "s0/b5", "s1/agent"], start=1):
            report(what, done, 4)
        report("written", 4, 4)
    lines = capsys.readouterr().err.splitlines()
    # the first unit, then nothing within the interval, then the end
    assert lines == ["[0:00] 1/4 s0/agent", "[0:00] 4/4 written"]


def test_a_table_printed_into_a_log_is_wide_enough_not_to_wrap_into_fragments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rich falls back to 80 columns without a terminal, which wrapped record's table into a column of word
    pieces in every CI log; a log gets LOG_COLUMNS, and COLUMNS still says otherwise."""
    import importlib
    import io
    import sys

    cli_app = importlib.import_module("eu_audit.cli.app")
    monkeypatch.delenv("COLUMNS", raising=False)
    for name in ("stdout", "stderr"):  # a log, even under `pytest -s` in a terminal
        monkeypatch.setattr(sys, name, io.StringIO())
    assert cli_app.console().width == cli_app.LOG_COLUMNS == 160
    assert cli_app.console(stderr=True).width == 160
    monkeypatch.setenv("COLUMNS", "100")
    assert cli_app.console().width == 100


def test_help_reads_as_paragraphs_not_as_the_source_lines() -> None:
    """A docstring's line breaks are the source file's, not the terminal's: --help joins them within a
    paragraph and keeps command examples on their own lines."""
    proc = run("audit", "--help")
    assert proc.returncode == 0
    assert "failed when the method is significantly worse at --alpha (one-sided" in proc.stdout
    merge = run("merge", "--help").stdout
    assert "\n" in merge.split("eu-audit merge bb.1.jsonl", 1)[1].split("eu-audit merge a1.json", 1)[0]


def test_every_help_text_is_shown_whole_no_bracket_eaten_by_markup() -> None:
    """Rich reads [x] in a help text as markup and drops it: "[z:DIGEST]" once printed as "masked: ,".
    Every bracketed word an option's help holds must reach the rendered --help; and the top-level help
    names every kind of schema the schema command prints."""
    import re

    import typer
    from typer.testing import CliRunner

    from eu_audit.cli import app

    styles = {"bold", "/", "/bold", "dim", "italic", "red", "green"}
    command = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for name, cmd in command.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None) or {name: cmd}
        for sub_name, sub in subs.items():
            words = [
                w
                for p in sub.params
                for w in re.findall(r"\[([^\]]+)\]", getattr(p, "help", None) or "")
                if w not in styles and not w.startswith("default")
            ]
            if not words:
                continue
            args = [name, sub_name, "--help"] if sub is not cmd else [name, "--help"]
            shown = " ".join(runner.invoke(app, args, env={"COLUMNS": "400"}).output.split())
            for w in words:
                assert f"[{w}]" in shown, f"eu-audit {name}: [{w}]"
                checked += 1
    assert checked  # the masked-target wording of audit and unlearn at least
    masked = " ".join(runner.invoke(app, ["audit", "--help"], env={"COLUMNS": "400"}).output.split())
    assert "masked: [z:DIGEST]" in masked
    top = " ".join(runner.invoke(app, ["--help"], env={"COLUMNS": "400"}).output.split())
    assert "agent-api" in top and "serve-log" in top
