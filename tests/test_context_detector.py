"""``residue_context`` reads what the model received: every string of the request, not one field. A
hostile agent that keeps z only where a content-only detector does not look fails the gate, naming the
tier (the tiny model over HTTP: seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eu_audit.audit import AuditOptions, audit
from eu_audit.audits.gate import evaluate
from eu_audit.blackbox.drive import AgentRecordOptions, Bounds, record_agent
from eu_audit.bundle.io import read_bundle
from eu_audit.models import TINY_MODEL

from .helpers import cli_server, run_cli


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve")
    control = folder / "serve.control"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(folder / "serve.jsonl")]
    with cli_server(*args, "--control-file", str(control)) as url:
        yield url, control


@pytest.mark.parametrize(
    ("mode", "tier"),
    [("calls", "calls"), ("specs", "specs"), ("format", "format"), ("split", "split")],
)
def test_an_agent_that_smuggles_z_past_message_content_fails_residue_context_naming_the_tier(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, tier: str
) -> None:
    url, control = serve
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", url)
    out = tmp_path / f"{mode}.jsonl"
    opts = AgentRecordOptions(
        agent=f"tests.scripted_agents:smuggle_{mode}",
        serve=url,
        serve_control=control,
        suite="builtin",
        n=1,
        k=1,
        out=out,
        bounds=Bounds(call_s=60),
    )
    record_agent(opts)
    rep = audit(out, AuditOptions())
    got = {g.rule: g for g in evaluate(rep, ["agent.residue_context==0", f"agent.prompt.{tier}==0"])}
    assert all(g.outcome == "failed" for g in got.values()), {r: g.detail for r, g in got.items()}
    residue = next(s for s in read_bundle(out).sessions if s.session.method == "agent").residues[0]
    assert residue.context_calls and residue.context_calls_with_z == residue.context_calls
    if mode == "calls":  # the CLI's gate exits 1 on it
        proc = run_cli("audit", str(out), "--gate", "agent.residue_context==0")
        assert proc.returncode == 1, proc.stdout + proc.stderr
