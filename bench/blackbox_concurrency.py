"""Black-box gate throughput at --concurrency 1, 4 and 8, side by side in one run, where concurrency pays:
the agent's model is remote. The remote model here is a SIMULATION of a hosted endpoint: every call takes a
fixed latency (1 s by default) and answers a fixed short reply; it stands behind ``eu-audit serve
--upstream``, which logs and pins as always. The agent is the scripted lane agent of the tests (one chat
call per message, its tenant's whole history in it) served over the HTTP contract (an in-process agent
runs on one thread of its own, so it gains nothing), driven with ``record --agent URL --concurrency N``.

    python bench/blackbox_concurrency.py [--latency 1.0] [--n 3] [--levels 1,4,8]

Prints sessions per minute at each level and the speed-up over --concurrency 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eu_audit.engines.llamacpp_server import free_port, wait_healthy  # noqa: E402


def hosted(latency: float) -> ThreadingHTTPServer:
    """The simulated hosted endpoint: /v1/models and /v1/chat/completions, ``latency`` s per call."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def _send(self, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"data": [{"id": "simulated-hosted-model"}]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency)
            reply = {"role": "assistant", "content": "Noted."}
            usage = {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}
            self._send({"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}], "usage": usage})

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_agent() -> str:
    """The scripted lane agent over HTTP (FastAPI runs each call on a pool thread: tenants in parallel)."""
    import uvicorn

    from eu_audit.blackbox.agent_server import create_agent_app
    from tests.scripted_agents import lanes

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_agent_app(lanes()), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per simulated model call")
    ap.add_argument("--n", type=int, default=3, help="episodes per suite (builtin has 2)")
    ap.add_argument("--levels", default="1,4,8", help="--concurrency values, side by side")
    args = ap.parse_args()
    up = hosted(args.latency)
    tmp = Path(tempfile.mkdtemp(prefix="eu-audit-conc-"))
    control = tmp / "serve.control"
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "eu_audit.cli", "serve", "--upstream", f"http://127.0.0.1:{up.server_port}",
         "--port", str(port), "--control-file", str(control), "--log", str(tmp / "serve.jsonl")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=120)
        env = dict(os.environ, EU_AUDIT_TEST_SERVE=url)
        os.environ["EU_AUDIT_TEST_SERVE"] = url
        agent_url = serve_agent()
        base = None
        print(f"simulated hosted endpoint: {args.latency:g} s per call; builtin,bfcl-memory, n {args.n}")
        for level in [int(x) for x in args.levels.split(",")]:
            out = tmp / f"c{level}.jsonl"
            cmd = [sys.executable, "-m", "eu_audit.cli", "record", "--agent", agent_url,
                   "--serve", url, "--serve-control", str(control), "--suite", "builtin,bfcl-memory",
                   "--n", str(args.n), "--k", "2", "--concurrency", str(level),
                   "--out", str(out)]  # fmt: skip
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"--concurrency {level} failed: {proc.stderr[-2000:]}")
            sessions = sum(1 for line in out.read_text().splitlines() if '"type":"session"' in line)
            rate = 60 * sessions / wall
            base = base or rate
            print(f"--concurrency {level}: {sessions} tenant runs in {wall:6.1f} s, {rate:5.1f} per min, "
                  f"{rate / base:4.2f}x")  # fmt: skip
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        up.shutdown()


if __name__ == "__main__":
    main()
