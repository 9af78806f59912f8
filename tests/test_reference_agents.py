"""Real memory stacks under the gate. The mem0 reference agent (examples/agents/mem0, the real ``mem0ai``
library, qdrant local mode, its model calls and embeddings through a real `eu-audit serve`) forgets the way
mem0 offers, search and delete, and the gate fails on what that leaves: mem0's own history table still
holds the deleted memory. (The passing control, eu-audit's runtime with selective replay behind the same
contract, is tests/test_blackbox.py.)"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eu_audit.models import FAST_MODEL

from .helpers import cli_server, http_process, run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "agents"
GATES = [
    "--gate", "agent.leak_probes<=floor", "--gate", "agent.leak5<=floor", "--gate", "agent.cad<=floor",
    "--gate", "agent.residue_context==0", "--gate", "agent.residue_store==0",
]  # fmt: skip


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, its control secret file)."""
    folder = tmp_path_factory.mktemp("serve")
    log, control = folder / "serve.jsonl", folder / "serve.control"
    with cli_server("serve", "--model", FAST_MODEL, "--log", str(log), "--control-file", str(control)) as url:
        yield url, control


def reference_agent(name: str, serve: str, data: Path) -> object:
    script = EXAMPLES / name / "agent.py"
    return http_process(
        [sys.executable, str(script), "--data", str(data)], env={"OPENAI_BASE_URL": serve + "/v1"}
    )


def test_no_example_is_imported_by_eu_audit_and_no_agent_imports_eu_audit() -> None:
    package = Path(__file__).resolve().parent.parent / "eu_audit"
    imports = re.compile(r"^\s*(from|import)\s+examples\b|['\"]examples[./]agents", re.M)
    assert not [p for p in package.rglob("*.py") if imports.search(p.read_text())]
    for agent in EXAMPLES.glob("*/agent.py"):
        assert "eu_audit" not in agent.read_text(), agent


def test_the_contract_kit_serves_exactly_the_contracts_endpoints_and_every_agent_uses_it() -> None:
    """The kit the reference agents are served with (examples/agents/contract_kit.py) is the contract's
    table, endpoint for endpoint and field for field; no agent re-types the contract's bodies or routes."""
    from eu_audit.blackbox.contract import ENDPOINTS

    sys.path.insert(0, str(EXAMPLES))
    try:
        import contract_kit as kit
    finally:
        sys.path.remove(str(EXAMPLES))
    served = {r.op: r for r in kit.ROUTES}
    assert set(served) == {e.op for e in ENDPOINTS} - {"capabilities"}
    for e in ENDPOINTS:
        if e.op == "capabilities":
            continue
        r = served[e.op]
        assert (r.method, r.path, r.capability) == (e.method, e.path, e.capability), e.op
        if e.request is None:
            assert r.body is None, e.op
        else:
            assert r.body is not None and r.body.__name__ == e.request.__name__, e.op
            assert set(r.body.model_fields) == set(e.request.model_fields), e.op
    for agent in EXAMPLES.glob("*/agent.py"):
        text = agent.read_text()
        assert "from contract_kit import" in text, agent
        assert not re.search(r"^class (StartSession|Message|MemoryRecord|ForgetRequest)\b", text, re.M), agent
        assert "def create_app" not in text and "/eu-audit/v1" not in text, agent


@pytest.mark.slow  # 3 min of a real stack; its committed run is reports/agents/mem0
@pytest.mark.real_model
def test_mem0s_delete_leaves_the_target_in_its_history_and_the_gate_fails(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    url, control = serve
    bundle = tmp_path / "mem0.jsonl"
    with reference_agent("mem0", url, tmp_path / "mem0-data") as agent:  # type: ignore[attr-defined]
        proc = run_cli(
            "record",
            "--agent",
            agent,
            "--same-user-ok",  # a test rig: the agent runs as this user
            "--serve",
            url,
            "--serve-control",
            str(control),
            "--suite",
            "builtin",
            "--n",
            "1",
            "--k",
            "2",
            "-o",
            str(bundle),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("audit", str(bundle), *GATES, "--json", str(tmp_path / "audit.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate agent.residue_store==0: FAILED" in proc.stdout
    # the residue is really there: the bundle quotes the store item, mem0's DELETE row with the old text
    residues = [json.loads(x) for x in bundle.read_text().splitlines() if '"type":"residue"' in x]
    agent_residue = next(r for r in residues if r["session_id"].endswith("/agent"))
    assert agent_residue["store_tiers"].get("history", 0) >= 1
    assert "12 Linden" in agent_residue["store_example"] and "history" in proc.stdout
    floor = next(r for r in residues if r["session_id"].endswith("/b5"))
    assert floor["store_items_with_z"] == 0  # the reference tenant never saw z, and its store says so


@pytest.mark.parametrize(
    "name",
    [  # one real stack gated by default (the quickest to start); the others with -m slow
        "openai-agents",
        *(pytest.param(n, marks=pytest.mark.slow) for n in ("mem0", "langgraph", "llamaindex", "langmem")),
    ],
)
def test_the_reference_agents_take_lanes_so_their_tenants_run_side_by_side(
    name: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each reference agent sends a tenant's model calls (and mem0's embeddings) to the lane it was
    started with: driven two tenants at a time, every call is attributed (a stray call fails the run).
    Each restarts a tenant from what it persisted, and the rechecks after the forget run on it."""
    from eu_audit.models import TINY_MODEL

    folder = tmp_path_factory.mktemp("serve-tiny")
    control = folder / "serve.control"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--control-file", str(control)]
    with (
        cli_server(*args, "--max-tokens", "8") as url,
        reference_agent(name, url, tmp_path / "data") as agent,  # type: ignore[attr-defined]
    ):
        proc = run_cli(
            "record", "--agent", agent, "--same-user-ok", "--no-own-floor", "--serve", url,
            "--serve-control", str(control),
            "--suite", "builtin", "--k", "1", "--concurrency", "2", "-o", str(tmp_path / "b.jsonl"),
            "--recheck", "restart,compact,turns-1",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    residues = [
        json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines() if '"type":"residue"' in x
    ]
    first = [r for r in residues if not r.get("after")]
    # 2 sessions x 3 tenants: the agent, the reference B5 and the positive control B0 (never sent the forget)
    assert len(first) == 6 and all(r["context_calls"] for r in first)
    after = {(r["session_id"], r["after"]): r for r in residues if r.get("after")}
    # three events on each agent tenant and on each no-forget tenant (its after.* controls), none on B5
    assert len(after) == 2 * 3 * 2 and {sid.split("/")[1] for sid, _ in after} == {"agent", "b0"}
    for (sid, event), r in after.items():
        if event == "compact" and r.get("skipped"):
            assert r["skipped"] == "agent lacks compact", r
            continue
        assert r["store_items"] is not None and r["context_calls"], (sid, event, r)


def test_the_minimal_example_agent_serves_the_contract_and_its_forget_leaves_nothing_its_dump_shows(
    tmp_path: Path,
) -> None:
    """examples/agents/minimal: the agent a user copies first. No model call is needed to check its
    memory and its forget: inject, dump, forget, dump, restart (read back from its file), files."""
    import httpx

    script = EXAMPLES / "minimal" / "agent.py"
    with http_process([sys.executable, str(script), "--data", str(tmp_path)]) as url:
        api = url + "/eu-audit/v1"
        caps = httpx.get(api + "/capabilities").json()
        assert caps["version"] == "eu-audit/agent-api@1" and caps["store_files"] and caps["fork"]
        sid = httpx.post(api + "/sessions", json={"tenant": "t1"}).json()["session_id"]
        httpx.post(api + "/tenants/t1/memory", json={"id": "m1", "text": "Dana lives at 12 Linden Street."})
        httpx.post(api + "/tenants/t1/memory", json={"id": "m2", "text": "Dana prefers mornings."})
        assert "12 Linden Street" in httpx.get(api + "/tenants/t1/dump").text
        got = httpx.post(api + "/tenants/t1/forget", json={"target": "12 linden street"}).json()
        assert got["receipt"]["removed"] == 1
        httpx.post(api + "/tenants/t1/restart")
        kept = httpx.get(api + "/tenants/t1/dump").json()["items"]
        assert [i["text"] for i in kept] == ["Dana prefers mornings."]
        paths = httpx.get(api + "/tenants/t1/files").json()["paths"]
        assert paths and not any("Linden" in Path(p).read_text() for p in paths)
        assert httpx.post(api + f"/sessions/{sid}/fork").json()["session_id"] != sid
        assert httpx.post(api + "/sessions/nosuch/fork").status_code == 404


def test_an_agent_on_anthropics_sdk_is_gated_through_the_messages_api_at_the_sdks_defaults(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """examples/agents/anthropic-sdk: ``anthropic.Anthropic().messages.create`` as a team using Claude
    writes it, only its base URL on serve. Every model call of every tenant arrives on /v1/messages, is
    attributed to its lane, and its residue is read from the request like any other; its forget keeps
    tool_use and tool_result paired, and leaves nothing its dump or its files show."""
    from eu_audit.audit import AuditOptions, audit
    from eu_audit.audits.gate import evaluate
    from eu_audit.models import TINY_MODEL

    folder = tmp_path_factory.mktemp("serve-tiny")
    control, log = folder / "serve.control", folder / "serve.jsonl"
    args = [
        "serve",
        "--model",
        TINY_MODEL,
        "--engine",
        "hf",
        "--control-file",
        str(control),
        "--log",
        str(log),
    ]
    script = EXAMPLES / "anthropic-sdk" / "agent.py"
    with (
        cli_server(*args, "--max-tokens", "8") as url,
        http_process([sys.executable, str(script), "--data", str(tmp_path / "data")], env={}) as agent,
    ):
        proc = run_cli(
            "record", "--agent", agent, "--same-user-ok", "--no-own-floor", "--serve", url,
            "--serve-control", str(control),
            "--suite", "builtin", "--n", "1", "--k", "1", "-o", str(tmp_path / "b.jsonl"),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    # every generation (the embeddings are eu-audit's own, for its read of the agent's files)
    model_calls = [c for c in calls if c["endpoint"] not in ("/v1/models", "/v1/embeddings")]
    model_calls = [c for c in model_calls if c["endpoint"].startswith("/v1/")]
    assert model_calls and {c["endpoint"] for c in model_calls} == {"/v1/messages"}
    assert all(c.get("lane") and c.get("mark") for c in model_calls)
    rep = audit(tmp_path / "b.jsonl", AuditOptions())
    got = {g.rule: g.outcome for g in evaluate(rep, ["agent.residue_store==0", "agent.residue_disk==0"])}
    assert got == {"agent.residue_store==0": "held", "agent.residue_disk==0": "held"}, got
    residues = [
        json.loads(x) for x in (tmp_path / "b.jsonl").read_text().splitlines() if '"type":"residue"' in x
    ]
    assert all(r["context_calls"] for r in residues)  # every tenant's requests after the forget were read
