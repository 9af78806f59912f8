"""The openai engine on a real llama.cpp server (llama.cpp's own C++ server from the xllamacpp wheel,
SmolLM2, loopback): it records, reuse is read from the server, B7 equals B5 on the returned token ids,
the serving layer's residue is there before a slot erase and gone after it. And a server that does not
report reuse leaves it unknown, never 0."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from eu_audit.audits.serving import measure
from eu_audit.bundle.io import read_bundle
from eu_audit.engines.llamacpp_server import running
from eu_audit.engines.served import OpenAIEngine, Server
from eu_audit.models import FAST_MODEL, load_model
from eu_audit.record import RecordOptions, record
from eu_audit.suites import load_suite
from eu_audit.unlearn import unlearn

from .helpers import run_cli


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running(FAST_MODEL) as url:
        yield url


@pytest.mark.real_model
def test_a_served_session_records_with_reuse_read_from_the_server_and_b7_equals_b5(
    server: str, tmp_path: Path
) -> None:
    src = tmp_path / "trace.jsonl"
    rec = record(
        RecordOptions(suite="builtin", n=1, model=FAST_MODEL, engine="openai", server=server, out=src)
    )
    h = rec.bundle.header
    assert h.engine == "openai" and h.engine_facts["dialect"] == "llamacpp"
    assert h.engine_facts["server"]["base_url"] == server
    out = unlearn(src, ["b5", "b7"], tmp_path / "out.jsonl").bundle
    by = {s.session_id: s for s in out.sessions}
    for s in read_bundle(src).sessions:
        b5, b7 = by[f"{s.session_id}/b5"], by[f"{s.session_id}/b7"]
        # measured on the token ids the server returned: the turns B7 re-decoded equal B5's
        assert [b.token_ids for b in b7.blocks if b.derived and b.token_span] == [
            b.token_ids for b in b5.blocks if b.derived and b.token_span
        ], s.session_id
        led = b7.ledgers[0]
        assert led.tokens_reused is not None and led.tokens_reused > 0  # the server reported its cache hits
        assert led.transitions_replayed == s.session.transitions - s.tau() + 1  # type: ignore[operator]


@pytest.mark.real_model
def test_the_prefix_that_carried_z_is_still_served_until_the_slot_is_erased(
    server: str, tmp_path: Path
) -> None:
    # the session ends while its context still holds the address (no compaction has rewritten it yet)
    ep = load_suite("builtin")[0]
    short = ep.model_copy(update={"steps": ep.steps[:5]})
    suite = tmp_path / "eps.jsonl"
    suite.write_text(short.model_dump_json() + "\n")
    src = tmp_path / "trace.jsonl"
    record(RecordOptions(suite=str(suite), model=FAST_MODEL, engine="openai", server=server, out=src))
    trace = read_bundle(src).sessions[0]
    engine = OpenAIEngine(load_model(FAST_MODEL, tokenizer_only=True), Server(server))
    r = measure(engine, trace)
    assert r.residual_cached_tokens is not None and r.residual_cached_tokens > 0  # right after the session
    assert r.residual_after_reset == 0 and r.reset_effective == 1.0
    assert "erase" in r.reset_call


@pytest.mark.slow  # 35 s; the residue it gates is measured by default in the test above
@pytest.mark.real_model
def test_the_serving_gate_reads_the_residue_and_a_served_audit_exits_by_it(
    server: str, tmp_path: Path
) -> None:
    src = tmp_path / "trace.jsonl"
    record(RecordOptions(suite="builtin", n=1, model=FAST_MODEL, engine="openai", server=server, out=src))
    proc = run_cli(
        "audit", str(src), "-m", "b7", "--k", "1", "--max-tokens", "4", "--serving",
        "--gate", "serving.reset_effective==1", "--gate", "b7.leak_any==0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Serving layer" in proc.stdout


class _SilentServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that answers completions without saying what it reused."""

    def do_GET(self) -> None:
        self._send(
            {"data": [{"id": "silent"}]} if self.path == "/v1/models" else {},
            200 if self.path == "/v1/models" else 404,
        )

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = len(body["prompt"])
        self._send({"choices": [{"text": " ok", "token_ids": [28, 1], "finish_reason": "length"}],
                    "usage": {"prompt_tokens": n, "completion_tokens": 2}})  # fmt: skip

    def _send(self, obj: object, code: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_does_not_report_reuse_leaves_it_unknown_not_zero(tiny) -> None:  # type: ignore[no-untyped-def]
    httpd = HTTPServer(("127.0.0.1", 0), _SilentServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        engine = OpenAIEngine(tiny, Server(f"http://127.0.0.1:{httpd.server_address[1]}"))
        engine.prefill([1, 2, 3])
        from eu_audit.engines import Sampling

        assert engine.decode(max_tokens=2, stop_ids=[], sampling=Sampling()) == [28, 1]
        assert engine.reuse_reported is False
        assert engine.facts()["reuse"].startswith("unknown")
        assert engine.cached_tokens_for([1, 2, 3]) is None
    finally:
        httpd.shutdown()
