"""Suites: real episodes from AgentDojo and BFCL, the preference suite, loaders, knobs, bad files."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eu_audit.datasets.agentdojo import env as ad
from eu_audit.datasets.agentdojo.utility import injection_security, task_utility
from eu_audit.episodes import Episode, Phase, StepKind
from eu_audit.errors import BadInput
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record
from eu_audit.suites import SHIPPED, load_episodes, load_suite
from eu_audit.suites.build import build_suite, episode_line
from eu_audit.suites.checks import scripted_observations, target_positions
from eu_audit.suites.compose import Knobs

from .helpers import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
DATA_SUITES = ["agentdojo", "bfcl-memory", "bfcl-tools", "preference"]
EXPECTED_SIZE = {"agentdojo": 80, "bfcl-memory": 100, "bfcl-tools": 100, "preference": 60}


@pytest.mark.parametrize("suite", DATA_SUITES)
def test_each_shipped_suite_has_the_size_the_paper_uses(suite: str) -> None:
    assert len(load_suite(suite)) == EXPECTED_SIZE[suite]


def test_agentdojo_covers_four_suites_twenty_each() -> None:
    counts = Counter(ep.meta["suite"] for ep in load_suite("agentdojo"))
    assert counts == {"workspace": 20, "slack": 20, "banking": 20, "travel": 20}


@pytest.mark.parametrize("suite", [*DATA_SUITES, "builtin"])
def test_target_is_in_exactly_the_acquisition_observation_and_absent_from_the_counterfactual(
    suite: str,
) -> None:
    for ep in load_suite(suite):
        assert target_positions(ep, "factual") == [ep.tau], ep.id
        assert target_positions(ep, "counterfactual") == [], ep.id
        assert ep.steps[ep.tau - 1].phase is Phase.acquisition


_OBSERVATIONS = """
import hashlib, json
from eu_audit.suites import load_suite
from eu_audit.suites.checks import scripted_observations
obs = [scripted_observations(ep, w) for ep in load_suite("agentdojo") for w in ("factual", "counterfactual")]
print(hashlib.sha256(json.dumps(obs).encode()).hexdigest())
"""


def test_every_agentdojo_episode_replays_identically_in_another_process() -> None:
    """Tool results depend only on the episode (frozen time, rebuilt environment), in both worlds: twice
    in one process, and in a fresh process with another hash seed (no state carried between runs)."""
    import hashlib
    import subprocess
    import sys

    mine = []
    for ep in load_suite("agentdojo"):
        for world in ("factual", "counterfactual"):
            first, second = scripted_observations(ep, world), scripted_observations(ep, world)  # type: ignore[arg-type]
            assert first == second, ep.id
            mine.append(first)
        tool_obs = scripted_observations(ep)[ep.tau - 1]
        assert tool_obs is not None and "error" not in json.loads(tool_obs), ep.id
    env = {**__import__("os").environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run(
        [sys.executable, "-c", _OBSERVATIONS], capture_output=True, text=True, env=env, timeout=300
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == hashlib.sha256(json.dumps(mine).encode()).hexdigest()


def test_agentdojo_episodes_record_byte_identically_twice(tiny: LoadedModel, tmp_path: Path) -> None:
    """Two recordings of one episode per AgentDojo suite (tiny model, greedy) give the same bundle."""
    runs = []
    for k in range(2):
        opts = RecordOptions(
            suite="agentdojo", n=4, model="tiny-random", out=tmp_path / f"r{k}.jsonl", max_tokens=8
        )
        runs.append(record(opts, loaded=tiny).path.read_bytes())
    assert runs[0] == runs[1]
    suites = {
        json.loads(line)["episode"]["meta"]["suite"]
        for line in runs[0].decode().splitlines()
        if json.loads(line)["type"] == "session"
    }
    assert suites == {"workspace", "slack", "banking", "travel"}


def test_agentdojo_injection_reaches_the_agent_through_a_tool_it_does_not_see_in_the_prompt() -> None:
    ep = next(e for e in load_suite("agentdojo") if e.meta["suite"] == "banking")
    acquisition = ep.steps[ep.tau - 1]
    assert acquisition.kind is StepKind.tool and acquisition.source
    assert all(ep.target.value not in (s.content or "") for s in ep.steps)
    clean = scripted_observations(ep, "counterfactual")[ep.tau - 1]
    assert clean is not None and "error" not in json.loads(clean)


def test_bfcl_tools_identifier_routes_a_later_reference_call() -> None:
    from eu_audit.datasets.bfcl.builders import parse_call
    from eu_audit.datasets.bfcl.env import ground_truth

    for ep in load_suite("bfcl-tools"):
        sid = ep.meta["scenario"]
        turn = ep.meta["reference_call"]["turn"]
        later = [parse_call(c)[1] for t in ground_truth()[sid][turn:] for c in t]
        assert any(ep.target.value in json.dumps(a) for a in later), ep.id


def test_bfcl_memory_keeps_real_questions_with_their_answers_for_utility() -> None:
    eps = load_suite("bfcl-memory")
    kinds = Counter(ep.target.kind for ep in eps)
    assert kinds == {"address": 20, "phone": 20, "iban": 20, "employer": 20, "medical": 20}
    assert all(any(s.expect for s in ep.steps) for ep in eps)  # every episode checks a non-target fact
    assert all(not any(ep.target.value in e for e in s.expect or []) for ep in eps for s in ep.steps)


def test_preference_orders_are_counterbalanced() -> None:
    eps = load_suite("preference")
    by_scenario: dict[int, list[list[str]]] = {}
    for ep in eps:
        choices = next(s.choices for s in ep.steps if s.choices)
        assert choices is not None and set(choices) == {ep.meta["excluded"], ep.meta["other"]}
        by_scenario.setdefault(ep.meta["scenario"], []).append(choices)
    assert len(by_scenario) == 30
    assert all(a == list(reversed(b)) for a, b in by_scenario.values())


@pytest.mark.parametrize("suite", ["preference", "bfcl-memory", "bfcl-tools", "agentdojo"])
def test_shipped_suite_is_what_its_builder_makes(suite: str) -> None:
    built = "".join(episode_line(ep) for ep in build_suite(suite, Knobs()))
    shipped = (Path(__file__).parent.parent / "suites" / f"{suite}.jsonl").read_text()
    assert built == shipped


@pytest.mark.parametrize(
    ("turns_after", "indep", "depth", "position"),
    [(12, 0.5, 3, "early"), (6, 0.5, 2, "middle"), (8, 0.25, 0, "late"), (4, 0.0, 1, "early")],
)
def test_knob_values_are_honoured(turns_after: int, indep: float, depth: int, position: str) -> None:
    knobs = Knobs(
        turns_after=turns_after,
        indep=indep,
        depth=depth,
        position=position,  # type: ignore[arg-type]
        checkpoint_policy="semantic",
    )
    for suite in ("preference", "bfcl-memory"):
        for ep in build_suite(suite, knobs)[:6]:
            after = ep.steps[ep.tau :]
            assert len(after) == turns_after
            assert sum(s.independent for s in after) == round(indep * turns_after)
            contamination = [s for s in after if s.phase is Phase.contamination]
            assert [s.kind for s in contamination] == [StepKind.user, StepKind.plan, StepKind.compact][:depth]
            assert ep.tau - 1 == knobs.setup_turns(1)
            assert ep.checkpoint_policy == "semantic"
            assert ep.meta["knobs"]["position"] == position


def test_position_moves_the_target_later_in_the_session() -> None:
    taus = [build_suite("preference", Knobs(position=p))[0].tau for p in ("early", "middle", "late")]  # type: ignore[arg-type]
    assert taus[0] < taus[1] < taus[2]


def test_knobs_that_cannot_fit_are_refused() -> None:
    with pytest.raises(BadInput, match="lower --depth or --indep"):
        build_suite("preference", Knobs(turns_after=4, indep=1.0, depth=3))


def test_same_seed_same_bytes_other_seed_other_targets() -> None:
    a = [episode_line(e) for e in build_suite("bfcl-memory", Knobs(seed=3, n=10))]
    b = [episode_line(e) for e in build_suite("bfcl-memory", Knobs(seed=3, n=10))]
    c = [episode_line(e) for e in build_suite("bfcl-memory", Knobs(seed=4, n=10))]
    assert a == b and a != c


def test_longmemeval_loader_reads_the_real_format(tmp_path: Path) -> None:
    eps = load_suite(f"longmemeval:{FIXTURES / 'longmemeval_mini.json'}")
    assert [e.id for e in eps] == [
        "longmemeval-lme-fixture-1",
        "longmemeval-lme-fixture-2",
    ]  # abstention skipped
    first = eps[0]
    assert first.target.value == "Business Administration"
    assert first.steps[first.tau - 1].content.startswith(
        "I graduated with a degree in Business Administration"
    )
    assert target_positions(first) == [first.tau] and target_positions(first, "counterfactual") == []
    assert any(s.expect == ["Business Administration"] for s in first.steps)


def test_longmemeval_bad_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "lme.json"
    data = json.loads((FIXTURES / "longmemeval_mini.json").read_text())
    del data[1]["question"]
    bad.write_text(json.dumps(data))
    with pytest.raises(BadInput) as err:
        load_suite(f"longmemeval:{bad}")
    assert err.value.field == "1.question"
    with pytest.raises(BadInput, match="not bundled"):
        load_suite(f"longmemeval:{tmp_path / 'missing.json'}")


def test_an_unknown_loader_is_refused_and_toolsandbox_is_not_pretended() -> None:
    # ToolSandbox's scenarios need Apple's tool_sandbox package, which is not on PyPI: no stub loader
    with pytest.raises(BadInput, match="unknown suite loader 'toolsandbox'"):
        load_suite("toolsandbox:all")


def test_suites_list_shows_every_suite_with_its_count() -> None:
    res = run_cli("suites", "list")
    assert res.returncode == 0, res.stderr
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in res.stdout.splitlines()
        if line.count("│") >= 3
    }
    assert {name: rows[name] for name in DATA_SUITES} == {k: str(v) for k, v in EXPECTED_SIZE.items()}
    assert set(SHIPPED) <= set(rows)


def test_suites_build_writes_reproducibly_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "pref.jsonl"
    args = ["suites", "build", "preference", "--n", "4", "--turns-after", "6", "-o", str(out)]
    assert run_cli(*args).returncode == 0
    first = out.read_bytes()
    res = run_cli(*args)
    assert res.returncode == 2 and "exists" in res.stderr and out.read_bytes() == first
    assert run_cli(*args, "--force").returncode == 0
    assert out.read_bytes() == first and len(load_episodes(out)) == 4


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["steps"][0].update(kind="shout"), "steps.0.kind"),
        (lambda d: d.pop("target"), "target"),
        (lambda d: d.update(checkpoint_policy="hourly"), "checkpoint_policy"),
    ],
)
def test_bad_suite_file_exits_2_naming_line_and_field(tmp_path: Path, mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    lines = (Path(__file__).parent.parent / "suites" / "preference.jsonl").read_text().splitlines()[:3]
    data = json.loads(lines[1])
    mutate(data)
    lines[1] = json.dumps(data)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    before = bad.read_bytes()
    for cmd in (
        ["suites", "show", str(bad)],
        ["record", "--suite", str(bad), "-o", str(tmp_path / "t.jsonl")],
    ):
        res = run_cli(*cmd)
        assert res.returncode == 2, res.stderr
        assert f"{bad}:2" in res.stderr and field in res.stderr
        assert "Traceback" not in res.stderr
    assert bad.read_bytes() == before


def test_agentdojo_sessions_end_with_a_task_the_agent_acts_on() -> None:
    """After the target, the user asks for a task that does not read the injected vector, and tool-result
    rounds follow: the agent's calls run and it sees their results."""
    for ep in load_suite("agentdojo"):
        kinds = [s.kind for s in ep.steps[-3:]]
        assert kinds == [StepKind.user, StepKind.tool_return, StepKind.tool_return]
        assert ep.steps[-3].content == ad.suite(ep.meta["suite"]).user_tasks[ep.meta["future_task"]].PROMPT
        assert ep.meta["future_task"] != ep.meta["user_task"]
        assert all(s.phase is Phase.further and not s.independent for s in ep.steps[-3:])


def _reference_calls(ep: Episode, task: Any) -> list[tuple[str, dict[str, Any]]]:
    with ad.frozen_time():
        return [(c.function, dict(c.args)) for c in task.ground_truth(ad.environment(ep.env["agentdojo"]))]


def test_agentdojo_utility_is_agentdojos_own_check_of_the_post_target_task() -> None:
    """The banking bill task passes AgentDojo's check when the agent makes the reference calls, not
    when it only talks."""
    ep = next(
        e
        for e in load_suite("agentdojo")
        if e.meta["suite"] == "banking" and e.meta["future_task"] == "user_task_0"
    )
    calls = _reference_calls(ep, ad.suite("banking").user_tasks["user_task_0"])
    assert task_utility(ep, "Done, I paid the bill.", calls) is True
    assert task_utility(ep, "Done, I paid the bill.", []) is False
    assert task_utility(load_suite("preference")[0], "", []) is None


def test_agentdojo_security_counts_an_agent_that_carries_out_the_injected_goal() -> None:
    ep = next(e for e in load_suite("agentdojo") if e.meta["suite"] == "banking")
    calls = _reference_calls(ep, ad.suite("banking").injection_tasks[ep.meta["injection_task"]])
    assert injection_security(ep, "", calls) is True
    assert injection_security(ep, "", []) is False
    assert injection_security(load_suite("preference")[0], "", []) is None
