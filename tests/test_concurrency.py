"""Tenants driven at the same time (``record --agent --concurrency N``) are told apart by where their model
calls arrive: each tenant gets its own lane of serve, marked and pinned by the harness alone. A run four at a
time attributes every call exactly as a run one at a time does; an agent that cannot take a lane is refused
before it runs, and one that sends a call outside its lane fails the run (exit 3, no bundle). Mechanics on
the tiny model and a scripted agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.runtime.models import TINY_MODEL

from .helpers import cli_server, run_cli


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve")
    control = folder / "serve.control"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--control-file", str(control)]
    with cli_server(*args, "--log", str(folder / "serve.jsonl")) as url:
        yield url, control


def _record(serve: tuple[str, Path], agent: str, concurrency: int, out: Path) -> tuple[int, str]:
    url, control = serve
    proc = run_cli(
        "record", "--agent", f"tests.scripted_agents:{agent}", "--serve", url,
        "--serve-control", str(control), "--suite", "builtin", "--k", "1",
        "--concurrency", str(concurrency), "--out", str(out),
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def _residues(path: Path) -> dict[str, tuple[int | None, int | None]]:
    return {
        s.session_id: (s.residues[0].context_calls, s.residues[0].context_calls_with_z)
        for s in read_bundle(path).sessions
    }


def test_tenants_driven_four_at_a_time_are_attributed_as_one_at_a_time(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    rc, said = _record(serve, "lanes", 1, tmp_path / "one.jsonl")
    assert rc == 0, said
    rc, said = _record(serve, "lanes", 4, tmp_path / "four.jsonl")
    assert rc == 0, said
    one, four = _residues(tmp_path / "one.jsonl"), _residues(tmp_path / "four.jsonl")
    assert one == four and len(four) == 4
    for sid, (calls, with_z) in four.items():
        assert calls and calls > 0, sid  # every tenant's post-forget calls were found in its lane
        # the naive forget keeps z in every later prompt; the reference tenant never saw it
        assert with_z == (calls if sid.endswith("/agent") else 0), sid


def test_an_agent_that_cannot_take_a_lane_is_refused_and_one_that_leaves_it_fails_the_run(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    rc, said = _record(serve, "naive", 2, tmp_path / "naive.jsonl")
    assert rc == 2 and "tenant_model_url" in said and not (tmp_path / "naive.jsonl").exists(), said
    rc, said = _record(serve, "stray", 2, tmp_path / "stray.jsonl")
    assert rc == 3 and "root URL" in said and not (tmp_path / "stray.jsonl").exists(), said
    proc = run_cli("record", "--agent", "tests.scripted_agents:lanes", "--concurrency", "0")
    assert proc.returncode == 2 and "--concurrency" in proc.stderr
