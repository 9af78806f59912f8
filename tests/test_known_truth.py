"""Agents of known truth (``examples/agents/known-truth``): the forgets the gate's confusion matrix runs
(``tools/discrimination.py``). Each bad forget fails on the fact that names what it kept or lost, and a
good one holds those facts against a no-forget control that kept z, whatever the model says: the residue
facts read stores and files, so these mechanics run on the tiny model (the matrix itself runs on a real
one). Real HTTP: serve, the agent in its own process, ``record --agent``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import evaluate, expand_gate_sets
from eu_audit.audits.output import summary_lines
from eu_audit.audits.stopping import Stop
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.models import TINY_MODEL
from eu_audit.rounds import Gate, record_until_decided
from eu_audit.trace.session import Bundle

from .helpers import cli_server, http_process, run_cli

AGENT = Path(__file__).resolve().parents[1] / "examples/agents/known-truth/agent.py"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve-tiny")
    control = folder / "serve.control"
    args = [
        "serve",
        "--model",
        TINY_MODEL,
        "--engine",
        "hf",
        "--control-file",
        str(control),
        "--max-tokens",
        "8",
    ]
    with cli_server(*args) as url:
        yield url, control


def gate(serve: tuple[str, Path], forget: str, tmp_path: Path) -> dict[str, str]:
    url, control = serve
    argv = [sys.executable, str(AGENT), "--forget", forget, "--data", str(tmp_path / "data")]
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        out = tmp_path / "bb.jsonl"
        opts = AgentRecordOptions(agent=agent, serve=url, serve_control=control, n=1, k=1, out=out)
        record_agent(opts)
    rep = audit(out, AuditOptions())
    rules = expand_gate_sets(["forget"], rep.methods, "black", measurable=("residue_disk", "bystander"))
    return {g.rule.split(".", 1)[1]: g.outcome for g in evaluate(rep, rules)}


@pytest.mark.parametrize(
    ("forget", "fails"),
    [
        ("sqlite-delete", "residue_disk==0"),  # DELETE without VACUUM: the free pages keep the bytes
        ("over-delete", "bystander==0"),  # another tenant's memories gone
        pytest.param(
            "hide-dump", "residue_disk==0", marks=pytest.mark.slow
        ),  # the file keeps what the dump hides
        pytest.param("audit-log", "residue_store==0", marks=pytest.mark.slow),  # its own audit log keeps z
        pytest.param("none", "residue_store==0", marks=pytest.mark.slow),  # the no-op
    ],
)
def test_a_bad_forget_fails_on_the_fact_that_names_what_it_kept_or_lost(
    serve: tuple[str, Path], tmp_path: Path, forget: str, fails: str
) -> None:
    got = gate(serve, forget, tmp_path)
    assert got[fails] == "failed", got


def test_a_file_the_agent_writes_and_does_not_name_is_read_and_named_in_the_summary_and_receipt(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    from eu_audit.audits.evidence import limits

    url, control = serve
    argv = [sys.executable, str(AGENT), "--forget", "cache", "--data", str(tmp_path / "data")]
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        out = tmp_path / "bb.jsonl"
        record_agent(AgentRecordOptions(agent=agent, serve=url, serve_control=control, n=1, k=1, out=out))
    rep = audit(out, AuditOptions())
    said = "\n".join(summary_lines(rep))
    assert "eu-audit also read files it wrote and did not name: text-cache.json.gz" in said, said
    agent_state = next(s for s in rep.states if s.method == "agent")
    assert "in a gzip stream" in agent_state.residue.disk_examples["bytes"], agent_state.residue.disk_examples
    assert any("did not name" in line and "text-cache.json.gz" in line for line in limits(rep))
    gates = {g.rule: g.outcome for g in evaluate(rep, ["agent.residue_disk==0"])}
    assert gates["agent.residue_disk==0"] == "failed", gates  # the forget removed, the cache kept z


def test_a_forget_that_deletes_and_vacuums_holds_every_residue_fact_against_a_control_that_kept_z(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    got = gate(serve, "sqlite-vacuum", tmp_path)
    facts = ("residue_context==0", "residue_store==0", "residue_disk==0", "bystander==0")
    assert {got[f] for f in facts} == {"held"}, got


def until_decided(serve: tuple[str, Path], forget: str, tmp_path: Path, n: int) -> tuple[Bundle, Stop]:
    url, control = serve
    argv = [sys.executable, str(AGENT), "--forget", forget, "--data", str(tmp_path / "data")]
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        out = tmp_path / "bb.jsonl"
        opts = AgentRecordOptions(agent=agent, serve=url, serve_control=control, n=n, k=1, out=out)
        bundle, path, stop = record_until_decided(opts, Gate())
    assert path == out and not list(tmp_path.glob("bb.round-*")), "the rounds' own files are left behind"
    return bundle, stop


def test_eu_audit_gate_fails_a_no_op_forget_in_one_command_after_its_first_session(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    """``eu-audit gate``: the run in rounds and the verdict in one command. A no-op forget stops after its
    first session on a failure more sessions cannot undo, and the command exits 1 with the audit written."""
    from eu_audit.audits.model import read_report
    from eu_audit.bundle.io import read_bundle

    url, control = serve
    argv = [sys.executable, str(AGENT), "--forget", "none", "--data", str(tmp_path / "data")]
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        out, js = tmp_path / "bb.jsonl", tmp_path / "audit.json"
        args = ["--agent", agent, "--serve", url, "--serve-control", str(control), "--n", "4", "--k", "1"]
        got = run_cli("gate", *args, "--same-user-ok", "-o", str(out), "--json", str(js))
    assert got.returncode == 1, got.stdout + got.stderr
    assert "stopped at n = 1 of at most 4 per suite" in got.stdout
    assert {s.session.parent_session for s in read_bundle(out).sessions} == {"s0"}
    gates = {g.rule: g.outcome for g in read_report(js).gates}
    assert gates["agent.residue_store==0"] == "failed", gates
    # the old spelling still records, saying what replaced it
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        once = ["--agent", agent, *args[2:6], "--n", "1", "--k", "1", "--same-user-ok", "--no-own-floor"]
        old = run_cli("record", *once, "-o", str(tmp_path / "old.jsonl"))
    assert old.returncode == 0 and "is now `eu-audit gate`" in old.stderr, old.stderr


def test_a_forget_that_works_runs_every_round_to_n_and_is_the_run_a_fixed_n_would_be(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    bundle, stop = until_decided(serve, "sqlite-vacuum", tmp_path, n=2)
    assert (stop.n, stop.early) == (2, False)
    facts = bundle.header.engine_facts["stopped"]
    assert facts["rounds"] == [1, 2] and len(facts["serve_logs"]) == 2
    assert [s.session_id for s in bundle.sessions if s.session.method == "agent"] == ["s0/agent", "s1/agent"]
    assert {s.session.seed for s in bundle.sessions} == {0}


def test_a_good_forget_looks_for_z_as_the_model_writes_it_not_only_as_it_was_given() -> None:
    """The gate failed the "good" forget at n = 30 in 2 of 30 sessions, rightly: the model wrote "severe
    penicillin allergy" without the target's article, and the forget looked for the target as given
    (reports/discrimination). A forget whose truth is good removes every item the gate would count."""
    import importlib.util

    sys.path.insert(0, str(AGENT.parents[1]))
    spec = importlib.util.spec_from_file_location("known_truth_agent", AGENT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from contract_kit import ForgetRequest  # type: ignore[import-not-found]

    request = ForgetRequest(target="a severe penicillin allergy")
    said = {
        "role": "assistant",
        "content": '{"name": "Pharmacist", "arguments": {"condition": "severe penicillin allergy"}}',
    }
    good = module.KnownTruthAgent.__new__(module.KnownTruthAgent)
    assert good.carrier(request)(said)
    minimal = module.minimal.MinimalAgent.__new__(module.minimal.MinimalAgent)
    assert not minimal.carrier(request)(said)  # the minimal agent's fold: what the gate caught


def test_eu_audits_own_floor_is_driven_beside_the_reference_on_a_lane_of_its_own(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    """A fourth tenant per session, eu-audit's own runtime over the episode without z on serve's model:
    its calls are logged under its own opaque tenant on its own lane, it is no method under test, and the
    audit holds the reference to it (one check per place z can be said); without it the summary says the
    floor was the agent's word."""
    from eu_audit.bundle.io import read_bundle

    url, control = serve
    argv = [sys.executable, str(AGENT), "--forget", "remove", "--data", str(tmp_path / "data")]
    with http_process(argv, env={"OPENAI_BASE_URL": url + "/v1"}) as agent:
        out = tmp_path / "bb.jsonl"
        record_agent(AgentRecordOptions(agent=agent, serve=url, serve_control=control, n=1, k=1, out=out))
    traces = {t.session_id: t for t in read_bundle(out).sessions}
    own = traces["s0/own-floor"]
    assert own.session.tenant not in {traces[f"s0/{m}"].session.tenant for m in ("agent", "b5", "b0")}
    assert own.elicitations, "eu-audit's floor was asked the probes and samples"
    rep = audit(out, AuditOptions())
    assert "own-floor" not in rep.methods
    assert {(c.said, c.n) for c in rep.own_floor} == {("probes", 1), ("samples", 1)}
    assert any(line.startswith("eu-audit's own floor (its runtime") for line in summary_lines(rep))
    # no rule is ever made for it: it is no method under test (a gate set once held it to the forget set)
    from eu_audit.audit import audit_plan

    plan = audit_plan(out, AuditOptions())
    rules = expand_gate_sets(["forget"], plan.methods, plan.side, plan.measurable)
    assert rules and not any(r.startswith("own-floor.") for r in rules), rules
