"""A gate run in rounds stops only where a fixed-n run would have failed too (``audits.stopping``): on a
failure more sessions cannot undo; every other verdict waits for the last round."""

from __future__ import annotations

from pathlib import Path

import pytest

from eu_audit.audits.model import GateResult
from eu_audit.audits.stopping import final_at_any_n, sessions_schedule, should_stop
from eu_audit.audits.verdict import TESTS

from .helpers import run_cli


def result(outcome: str, test: str, rule: str = "agent.leak_probes<=floor") -> GateResult:
    return GateResult(rule=rule, outcome=outcome, detail="", test=test)  # type: ignore[arg-type]


def test_rounds_double_from_one_session_and_end_at_the_most() -> None:
    assert sessions_schedule(30) == [1, 2, 4, 8, 16, 30]
    assert sessions_schedule(1) == [1]
    assert sessions_schedule(8) == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        sessions_schedule(0)


@pytest.mark.parametrize(
    "test",
    [
        "fact: every session observed",
        "fact: every session observed against its floor",
        TESTS["rate"].worse,
        "",
    ],
)
def test_a_fact_a_closed_rule_or_the_betting_test_stops_the_run_at_once(test: str) -> None:
    stop = should_stop([result("held", "fact: every session observed"), result("failed", test)], 2, 30)
    assert stop is not None and stop.early and stop.n == 2


def test_a_fixed_n_test_never_stops_a_run_early_whatever_it_says() -> None:
    """McNemar and the hold bounds are valid at one n only: read after every round they would err."""
    for g in (result("failed", TESTS["binary"].worse), result("held", TESTS["binary"].bound)):
        assert not final_at_any_n(g)
        assert should_stop([g], 4, 30) is None


def test_the_last_round_always_stops_and_says_it_was_not_early() -> None:
    stop = should_stop([result("inconclusive", TESTS["binary"].bound)], 30, 30)
    assert stop is not None and not stop.early
    assert "every round run" in stop.sentence()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--until-decided", "--shard", "1/2"], "a shard cannot see the other shards' failures"),
        (["--until-decided"], "--until-decided needs --n"),
        (["--until-decided", "--n", "4", "--sessions", "2:4"], "the rounds choose the sessions"),
        (["--n", "4", "--sessions", "4:8"], "TO at most --n (4)"),
        (["--until-decided", "--n", "4", "--no-positive-control"], "no round could ever hold"),
        (["--n", "4", "--until-gate-set", "forget"], "add it"),
        (["--n", "4", "--until-decided", "--until-gate-set", "forgot"], "unknown gate set 'forgot'"),
    ],
)
def test_a_run_in_rounds_that_could_not_be_decided_is_refused_before_any_agent_runs(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    # no agent listens on port 9: a refusal that came after contacting it would say so instead
    got = run_cli("record", "--agent", "http://127.0.0.1:9", "-o", str(tmp_path / "bb.jsonl"), *extra)
    assert got.returncode == 2, got.stderr
    assert said in " ".join(got.stderr.split()), got.stderr


@pytest.mark.parametrize("part", [["--shard", "1/2"], ["--sessions", "2:4"]])
def test_a_part_of_a_run_is_recorded_only_and_gated_on_the_parts_union(
    tmp_path: Path, part: list[str]
) -> None:
    nobody = ["--agent", "http://127.0.0.1:9"]  # a refusal after contacting it would say so instead
    got = run_cli("gate", *nobody, "--n", "4", "--fixed-n", "-o", str(tmp_path / "bb.jsonl"), *part)
    assert got.returncode == 2, got.stderr
    said = " ".join(got.stderr.split())
    assert f"{part[0]} records part of a fixed run: add --fixed-n --record-only" in said, said
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--until-decided"], "--until-decided needs --n"),
        (["--n", "2", "--methods", "b7"], "add it"),
        (["--n", "2", "--until-decided", "--shard", "1/2"], "a shard cannot see the other shards' failures"),
        (["--n", "2", "--until-decided", "--sessions", "0:1"], "the rounds choose the sessions"),
        (["--n", "2", "--until-decided", "--methods", "b42"], "unknown method 'b42'"),
        (["--n", "2", "--until-decided", "--until-gate", "b9.cad==0"], "b9"),
    ],
)
def test_a_white_box_run_in_rounds_that_could_not_be_decided_is_refused_before_any_model_loads(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    # a model that does not exist: a refusal that came after loading one would say so instead
    got = run_cli("record", "--model", "no-such-model", "-o", str(tmp_path / "t.jsonl"), *extra)
    assert got.returncode == 2, got.stderr
    assert said in " ".join(got.stderr.split()), got.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_white_box_run_in_rounds_stops_at_the_first_failure_more_sessions_cannot_undo(
    tmp_path: Path,
) -> None:
    """Record, forget and audit on the runtime in rounds (tiny model: mechanics): B0 keeps the user's
    record, a fact one session shows, so the run stops after its first round of at most 2; the audit, its
    gates and the joined recording say where it stopped. No round's own file is left behind."""
    import json

    out, js = tmp_path / "t.jsonl", tmp_path / "audit.json"
    argv = [
        "record",
        "--model",
        "tiny-random",
        "--n",
        "2",
        "--until-decided",
        "--methods",
        "b7,b0",
        "--k",
        "1",
    ]
    got = run_cli(*argv, "--until-gate", "b0.leak_record==0", "--json", str(js), "-o", str(out))
    assert got.returncode == 1, got.stdout + got.stderr
    said = " ".join(got.stdout.split())
    assert "stopped at n = 1 of at most 2 per suite: b0.leak_record==0 failed" in said, said
    report = json.loads(js.read_text())
    gates = {g["rule"]: g["outcome"] for g in report["gates"]}
    assert gates["b0.leak_record==0"] == "failed", gates
    assert {s["session_id"] for s in report["states"]} == {"s0"}  # one session: the second never ran
    assert report["bundle"] == str(out) and report["cost"]["rounds"] == 1  # what stays, not a round's file
    header = json.loads(out.read_text().splitlines()[0])
    assert header["engine_facts"]["stopped"] == {
        "n": 1,
        "max_n": 2,
        "why": "b0.leak_record==0 failed (fact: every session observed): more sessions cannot undo it",
        "early": True,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.json", "t.jsonl", "t.jsonl.salt"]
