"""The CLI contract a CI job relies on: exit 3 (never 1) for a failed run, verdicts and JUnit that fail
closed without a floor, an --outbox that does what it says, one model load at the bundle's dtype, skipped
data-set items counted, empty comparisons not measured."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.ci_formats import junit_xml
from eu_audit.audits.embed import embedding_distance
from eu_audit.audits.metrics import ngram_distance, token_agreement, tool_consistency, total_variation
from eu_audit.audits.output import verdicts
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record
from eu_audit.runtime.dispatch import ToolDispatcher
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.tools import load_toolset
from eu_audit.unlearn import unlearn

from .helpers import run_cli

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny_states(tiny: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("contract")
    src = tmp / "trace.jsonl"
    record(RecordOptions(model="tiny-random", out=src, n=2), loaded=tiny)
    return unlearn(src, ["b0", "b5", "b7"], tmp / "states.jsonl", loaded=tiny).path


def _boom(*command: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    """The CLI with a library function that fails unexpectedly (a bug, not a user mistake)."""
    argv = ["eu-audit", *(["--debug"] if debug else []), *command]
    code = (
        "import sys, eu_audit.suites as s\n"
        "def boom(*a, **k): raise RuntimeError('disk on fire')\n"
        "s.load_suite = boom\n"
        "from eu_audit.cli import main\n"
        f"sys.argv = {argv!r}\n"
        "main()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_an_unexpected_failure_exits_3_with_one_line_and_the_traceback_only_with_debug() -> None:
    proc = _boom("suites", "show", "builtin")
    assert proc.returncode == 3, proc.stderr
    assert "disk on fire" in proc.stderr and "--debug" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2
    proc = _boom("suites", "show", "builtin", debug=True)
    assert proc.returncode == 3 and "Traceback" in proc.stderr


def test_a_report_on_a_folder_that_is_not_a_sweep_is_bad_input(tmp_path: Path) -> None:
    proc = run_cli("report", "--sweep", str(tmp_path / "typo"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "not a sweep folder" in proc.stderr and "Traceback" not in proc.stderr


def test_without_a_floor_no_method_is_called_forgotten_and_every_junit_case_fails(
    tiny: LoadedModel, tiny_states: Path
) -> None:
    rep = audit(tiny_states, AuditOptions(methods=["b0", "b7"], floor=False, k=1, max_tokens=4), loaded=tiny)
    assert set(verdicts(rep).values()) == {"not measured (no floor)"}
    cases = list(ET.fromstring(junit_xml(rep)).iter("testcase"))
    assert cases and all(c.find("failure") is not None for c in cases)
    assert all("floor" in (c.find("failure").get("message") or "") for c in cases)  # type: ignore[union-attr]
    from eu_audit.audits.gate import evaluate

    held = evaluate(rep, ["b0.leak_any<=floor"])
    assert not held[0].held and "without the floor" in held[0].detail


def test_a_gate_naming_a_method_the_audit_does_not_run_is_refused_before_any_model_runs(
    tiny_states: Path,
) -> None:
    proc = run_cli("audit", str(tiny_states), "-m", "b7", "--gate", "b3.leak_any<=floor")
    assert proc.returncode == 2 and "'b3' is not audited here" in proc.stderr


def test_an_outbox_call_id_never_fires_again_during_replay() -> None:
    """--outbox is the real sink: a call id it holds has happened, so replay shadows it and moves the
    environment as it did, and the outbox gets no second row."""
    box = Outbox(Path(":memory:"))
    box.fire("s0:t4:0", "s0", "transfer", {"iban": "DE00", "amount": 5})
    d = ToolDispatcher(load_toolset("builtin"), box, shadow=True)
    env: dict[str, object] = {}
    outcome = d.dispatch(
        env,
        call_id="s0:t4:0",
        session_id="s0",
        name="transfer",
        args={"iban": "DE00", "amount": 5},
        pending=False,
        before_side_effect=lambda: None,
    )
    assert outcome.status == "shadowed" and outcome.committed
    assert env["transactions"] == [{"iban": "DE00", "amount": 5}]
    assert len(box.rows()) == 1


def test_unlearn_refuses_an_outbox_that_does_not_exist(tiny_states: Path, tmp_path: Path) -> None:
    src = Path(str(tiny_states).replace("states.jsonl", "trace.jsonl"))
    proc = run_cli("unlearn", str(src), "-m", "b0", "--outbox", str(tmp_path / "nowhere.sqlite"))
    assert proc.returncode == 2 and "no such outbox" in proc.stderr


def test_audit_loads_the_model_once_at_the_bundles_dtype(
    tiny: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import eu_audit.engines.hf as engine_mod
    from eu_audit.models import load_model

    src = tmp_path / "trace.jsonl"
    record(RecordOptions(model="tiny-random", out=src, n=1, dtype="bfloat16"))
    calls: list[str] = []

    def counting(ref: str, *, dtype: str = "float32", tokenizer_only: bool = False) -> LoadedModel:
        calls.append(dtype)
        return load_model(ref, dtype=dtype, tokenizer_only=tokenizer_only)

    monkeypatch.setattr(engine_mod, "load_model", counting)
    rep = audit(src, AuditOptions(methods=["b7"], k=1, max_tokens=4))
    assert calls == ["bfloat16"]
    assert rep.errors == 0


def test_a_longmemeval_path_with_a_tilde_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from eu_audit.suites import load_suite

    (tmp_path / "lme.json").write_text((FIXTURES / "longmemeval_mini.json").read_text())
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_suite("longmemeval:~/lme.json")


def test_a_builder_counts_what_it_skips_and_a_bug_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from eu_audit.datasets.bfcl import builders
    from eu_audit.runtime.tools import ToolError
    from eu_audit.suites.build import Skips

    def refuses(*a: object, **k: object) -> object:
        raise ToolError("backend says no")

    monkeypatch.setattr(builders.bfcl_env, "call", refuses)
    skips = Skips()
    assert builders.find_identifier("multi_turn_base_0", skips) is None
    assert skips.lines() == ["1 skipped: bfcl-tools: a reference call failed before showing an identifier"]

    def bug(*a: object, **k: object) -> object:
        raise KeyError("a bug in our adaptor")

    monkeypatch.setattr(builders.bfcl_env, "call", bug)
    with pytest.raises(KeyError):
        builders.find_identifier("multi_turn_base_0", Skips())


def test_audit_rows_are_exported_as_a_parquet_data_set(tiny_states: Path, tmp_path: Path) -> None:
    rows = tmp_path / "rows.parquet"
    proc = run_cli(
        "audit", str(tiny_states), "-m", "b7", "--k", "1", "--max-tokens", "4", "--rows", str(rows)
    )
    assert proc.returncode == 0, proc.stderr
    from datasets import Dataset

    ds = Dataset.from_parquet(str(rows))
    # b7 as asked, and the audit's own: the floor B5 and the positive control B0
    assert set(ds["method"]) == {"b0", "b5", "b7"} and "leak_probes" in ds.column_names
    assert rows.stat().st_mode & 0o777 == 0o600


def test_empty_comparisons_are_not_measured_rather_than_equal_to_the_floor() -> None:
    assert token_agreement([], []) is None
    assert tool_consistency([], ["x"]) is None
    assert total_variation({}, {"a": 1.0}) is None
    assert ngram_distance([], []) is None
    assert embedding_distance([], ["x"]) is None


def test_an_audit_that_made_its_states_resumes_them_the_next_time(tiny: LoadedModel, tmp_path: Path) -> None:
    """The first audit of a recorded bundle applies the methods and writes the states beside it; run again
    (after an interruption, say), it resumes every state it finished instead of starting over."""
    src = tmp_path / "trace.jsonl"
    record(RecordOptions(model="tiny-random", out=src, n=1, max_tokens=8), loaded=tiny)
    opts = AuditOptions(methods=["b7"], k=1, max_tokens=4)
    first = audit(src, opts, loaded=tiny)
    again = audit(src, opts, loaded=tiny)
    assert first.cost["resumed_states"] == 0 and again.cost["resumed_states"] == len(again.states) == 3
    assert [s.values for s in again.states] == [s.values for s in first.states]


def test_the_audit_json_says_what_it_cost(tiny: LoadedModel, tiny_states: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "states.jsonl"  # a copy: no earlier audit of it to resume from
    fresh.write_bytes(tiny_states.read_bytes())
    rep = audit(fresh, AuditOptions(methods=["b7"], k=1, max_tokens=4), loaded=tiny)
    cost = json.loads(rep.model_dump_json())["cost"]
    assert cost["engine"] == "hf" and cost["branches"] == "one by one" and cost["cores"] >= 1
    assert cost["states"] == len(rep.states) == 6 and cost["resumed_states"] == 0  # b7, b5, b0; 2 sessions
    assert 0 < cost["audit_s"] <= cost["wall_s"]  # the states' audits are part of the whole job
    assert cost["methods_s"] == round(sum(s.values["wall_s"] or 0 for s in rep.states), 1)


def test_the_agent_contract_is_one_table_its_docs_server_and_client_are_made_from() -> None:
    import threading
    import time

    import uvicorn

    from eu_audit.blackbox import contract
    from eu_audit.blackbox.adapter import AgentUnreachable, HttpAgent
    from eu_audit.blackbox.agent_server import create_agent_app
    from eu_audit.engines.llamacpp_server import free_port

    from .scripted_agents import naive

    assert contract.markdown_table() in (contract.__doc__ or "")  # the docs cannot drift from the table
    schema = contract.agent_api_schema()["endpoints"]
    assert [(e["op"], e["method"], e["path"]) for e in schema] == [
        (e.op, e.method, contract.PREFIX + e.path) for e in contract.ENDPOINTS
    ]
    app = create_agent_app(naive())
    served = {(m, r.path.replace(":path}", "}")) for r in app.routes for m in getattr(r, "methods", ())}
    assert {(e.method, contract.PREFIX + e.path) for e in contract.ENDPOINTS} <= served
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    try:
        while not server.started:
            time.sleep(0.05)
        client = HttpAgent(f"http://127.0.0.1:{port}")  # every call's verb, path and answer from the table
        assert client.capabilities().store_dump
        sid = client.start("t/1", seed=0, tools=[])  # a tenant with a slash is one path segment
        assert "Alice" in client.send(sid, contract.Message(role="user", content="I am Alice")).text
        client.inject_memory("t/1", contract.MemoryRecord(id="m1", text="Alice likes tea"))
        assert client.forget("t/1", contract.ForgetRequest(target="Alice")).status == "ok"
        assert len(client.dump("t/1").items) == 2  # the naive forget kept both
        client.reset("t/1")
        assert client.dump("t/1").items == []
        with pytest.raises(AgentUnreachable, match=r"lacks POST /eu-audit/v1/sessions/.*/fork"):
            client.fork(sid)  # an optional call the agent lacks: 501, named
    finally:
        server.should_exit = True
