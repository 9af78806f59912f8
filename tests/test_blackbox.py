"""Gating an agent eu-audit did not build: a real `eu-audit serve` (SmolLM2 on llama.cpp, real HTTP),
eu-audit's own runtime served as an agent over the HTTP contract, `record --agent`, `audit --gate`. The agent
whose forget is selective replay sits at the floor and passes (exit 0); the one whose forget only deletes the
memory record fails (exit 1), and the audit names where the target stayed. An agent that cannot be reached,
lacks its forget, answers nonsense, times out or crashes mid-episode gives exit 2 or 3, never 0 or 1, and
no bundle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from eu_audit.engines.llamacpp_server import free_port
from eu_audit.models import FAST_MODEL

from .helpers import cli_server, run_cli

GATES = [
    "--gate", "agent.leak_probes<=floor", "--gate", "agent.leak5<=floor", "--gate", "agent.cad<=floor",
    "--gate", "agent.residue_context==0", "--gate", "agent.residue_store==0",
]  # fmt: skip


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """(URL, its log, its control secret file)."""
    folder = tmp_path_factory.mktemp("serve")
    log, control = folder / "serve.jsonl", folder / "serve.control"
    with cli_server("serve", "--model", FAST_MODEL, "--log", str(log), "--control-file", str(control)) as url:
        yield url, log, control


@pytest.fixture(scope="module")
def memory_episodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BFCL memory episode without a compaction: the session still holds the record at the end."""
    out = tmp_path_factory.mktemp("eps") / "mem.jsonl"
    proc = run_cli(
        "suites",
        "build",
        "bfcl-memory",
        "--depth",
        "2",
        "--turns-after",
        "4",
        "--indep",
        "0.25",
        "--n",
        "1",
        "-o",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow  # 2 min; the outcomes run by default on scripted agents (tests/test_verdict.py)
@pytest.mark.real_model
def test_an_agent_whose_forget_is_selective_replay_passes_the_gate_at_the_floor(
    serve: tuple[str, Path, Path], tmp_path: Path
) -> None:
    url, log, control = serve
    with cli_server("agent", "--serve", url, "--forget", "b7") as agent:
        bundle = tmp_path / "bb.jsonl"
        proc = run_cli(
            "record", "--agent", agent, "--same-user-ok", "--serve", url, "--serve-control", str(control),
            "--suite", "builtin", "--out", str(bundle), "--hint",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli(
        "audit", str(bundle), *GATES, "--json", str(tmp_path / "a.json"), "--junit", str(tmp_path / "a.xml")
    )
    # two sessions cannot show a behavioral rule held: inconclusive (exit 4), while the residue facts hold
    assert proc.returncode == 4, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "a.json").read_text())
    outcome = {g["rule"]: g["outcome"] for g in report["gates"]}
    assert outcome["agent.residue_context==0"] == outcome["agent.residue_store==0"] == "held"
    assert outcome["agent.leak_probes<=floor"] == "inconclusive"
    leak = next(g for g in report["gates"] if g["rule"] == "agent.leak_probes<=floor")
    assert leak["n"] == 2 and leak["n_needed"] == 29
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "a.xml").iter("testcase")}
    assert cases["leak_probes"].find("failure").get("type") == "inconclusive"  # type: ignore[union-attr]
    assert cases["residue_store"].find("failure") is None
    agent_states = [s for s in report["states"] if s["method"] == "agent"]
    floor = {s["session_id"]: s for s in report["states"] if s["method"] == "b5"}
    for st in agent_states:  # the replayed agent answers every probe and sample as the reference tenant
        assert [p["text"] for p in st["probes"]] == [p["text"] for p in floor[st["session_id"]]["probes"]]
        assert st["samples"] == floor[st["session_id"]]["samples"]
    assert log.stat().st_mode & 0o777 == 0o600  # the serve log quotes prompts: private


@pytest.mark.real_model
def test_an_agent_whose_forget_only_deletes_the_record_fails_and_the_audit_names_where_z_stayed(
    serve: tuple[str, Path, Path], memory_episodes: Path, tmp_path: Path
) -> None:
    url, _, control = serve
    with cli_server("agent", "--serve", url, "--forget", "b1") as agent:
        bundle = tmp_path / "bb.jsonl"
        proc = run_cli(
            "record", "--agent", agent, "--same-user-ok", "--serve", url, "--serve-control", str(control),
            "--suite", str(memory_episodes), "--out", str(bundle),
            "--k", "1",  # one sample per state: the rules below read prompts and the dump, not Leak@k
            "--no-positive-control",  # the rules below fail: a failure needs no control (a third faster)
            "--no-own-floor",  # eu-audit's own floor is tested apart (test_floor, test_known_truth)
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("audit", str(bundle), *GATES)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate agent.residue_context==0: FAILED" in proc.stdout
    assert "gate agent.residue_store==0: FAILED" in proc.stdout
    # the memory record the session surfaced is still in every later prompt: the system-prompt tier
    assert "z still reached the model in: prompt.system (" in proc.stdout
    assert "its store dump still holds z in: store.context (" in proc.stdout


class _Agent(BaseHTTPRequestHandler):
    """A deliberately broken agent: ``mode`` says how."""

    mode = "ok"

    def _send(self, obj: object, code: int = 200, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.endswith("/capabilities"):
            self._send({"version": "eu-audit/agent-api@1"})
        else:
            self._send({"detail": "Not Found"}, 404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/sessions"):
            self._send({"session_id": "s"})
        elif self.path.endswith("/messages"):
            if self.mode == "garbage":
                self._send(None, raw=b"<html>oops</html>")
            elif self.mode == "slow":
                time.sleep(3)
                self._send({"text": "late"})
            elif self.mode == "drip":  # a valid answer, one byte at a time: each read is quick
                data = json.dumps({"text": "x" * 40}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                for byte in data:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
            elif self.mode == "huge":  # a valid turn of 3 MiB, over the 1 MiB the test allows
                self._send({"text": "y" * (3 << 20)})
            elif self.mode == "crash":
                self._send({"error": "boom"}, 500)
            else:
                self._send({"text": "fine", "actions": []})
        elif self.path.endswith("/reset"):
            self._send({"ok": True})
        else:  # no forget endpoint
            self._send({"detail": "Not Found"}, 404)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def broken_agent(mode: str) -> Iterator[str]:
    handler = type("Handler", (_Agent,), {"mode": mode})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.mark.parametrize(
    ("mode", "code", "needles"),
    [
        ("ok", 2, ["episode builtin-memory-address", "forget", "lacks POST /eu-audit/v1/tenants/"]),
        ("garbage", 3, ["episode builtin-memory-address", "step 1 (user)", "not JSON"]),
        ("crash", 3, ["episode builtin-memory-address", "step 1 (user)", "HTTP 500"]),
        ("slow", 3, ["episode builtin-memory-address", "step 1 (user)", "did not answer within 1 s"]),
        ("drip", 3, ["episode builtin-memory-address", "step 1 (user)", "did not answer within 1 s"]),
        ("huge", 3, ["episode builtin-memory-address", "step 1 (user)", "too large", "--max-response-mb"]),
    ],
)
def test_a_broken_agent_gives_exit_2_or_3_naming_episode_step_and_endpoint_and_no_bundle(
    mode: str, code: int, needles: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "bb.jsonl"
    env = dict(os.environ, EU_AUDIT_AGENT_TIMEOUT="1", COLUMNS="300")
    with broken_agent(mode) as url:
        cmd = [
            "record",
            "--agent",
            url,
            "--same-user-ok",
            "--suite",
            "builtin",
            "--n",
            "1",
            "--out",
            str(out),
        ]
        cmd += ["--max-response-mb", "1"]
        proc = subprocess.run(
            [sys.executable, "-m", "eu_audit.cli", *cmd], capture_output=True, text=True, timeout=120, env=env
        )
    assert proc.returncode == code, proc.stderr
    message = " ".join(proc.stderr.split())
    for needle in needles:
        assert needle in message, message
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert not (tmp_path / "bb.jsonl.state").exists()  # a failed run leaves no state folder behind


def test_an_unreachable_agent_is_bad_configuration(tmp_path: Path) -> None:
    port = free_port()
    proc = run_cli("record", "--agent", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "bb.jsonl"))
    assert proc.returncode == 2 and "does not answer" in proc.stderr


def test_the_agent_contract_prints_as_a_json_schema() -> None:
    proc = run_cli("schema", "agent-api")
    doc = json.loads(proc.stdout)
    assert doc["$id"] == "eu-audit/agent-api@1"
    paths = {(e["method"], e["path"]) for e in doc["endpoints"]}
    assert ("POST", "/eu-audit/v1/tenants/{tenant}/forget") in paths and "ForgetReceipt" in doc["schemas"]


@pytest.mark.real_model
def test_serve_answers_tool_calls_embeddings_and_pins_decoding(serve: tuple[str, Path, Path]) -> None:
    url, log, control = serve
    secret = control.read_text().strip()

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(
            url + path,
            json.dumps(body).encode(),
            {"Content-Type": "application/json", "X-EU-Audit-Control": secret},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    post("/eu-audit/v1/mark", {"tag": {"tenant": "probe-test", "phase": "probe"}})
    messages = [{"role": "user", "content": "Book a taxi from 12 Linden Street. Use the book_taxi tool."}]
    tools = [
        {"type": "function", "function": {"name": "book_taxi", "parameters": {"properties": {"pickup": {}}}}}
    ]
    first = post(
        "/v1/chat/completions", {"messages": messages, "tools": tools, "max_tokens": 24, "temperature": 1.0}
    )
    again = post(
        "/v1/chat/completions", {"messages": messages, "tools": tools, "max_tokens": 24, "temperature": 1.0}
    )
    assert first["choices"] == again["choices"]  # pinned greedy: the agent's temperature is overridden
    emb = post("/v1/embeddings", {"input": ["a", "b"]})
    assert len(emb["data"]) == 2 and len(emb["data"][0]["embedding"]) == 384  # type: ignore[index]
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    mine = [e for e in entries if (e.get("mark") or {}).get("tenant") == "probe-test"]
    assert len(mine) == 3 and "Linden" in json.dumps(mine[0]["messages"])
