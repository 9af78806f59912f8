"""What `eu-audit serve`'s request log costs a request, side by side in one run.

Two real servers on the same model, one with ``--log FILE`` and one without, answer the same chat
requests alternately (the agent's kind of request: a system prompt, a few turns, a short answer), so
machine noise hits both; medians are reported. Then the log's own work (JSON line, digest, flush to a
0600 file) is timed in-process on a request entry of the same size.

    python bench/serve_overhead.py --model smollm2-135m --requests 20 --max-tokens 8
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from eu_audit.serve import RequestLog


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return dict(json.loads(resp.read()))


def start(model: str, log: Path | None, control: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "eu_audit.cli", "serve", "--model", model, "--port", str(port)]
    cmd += ["--control-file", str(control)]
    if log is not None:
        cmd += ["--log", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"serve on {model} did not come up")


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a personal assistant. Memory: the user prefers mornings."},
        {"role": "user", "content": f"Request {i}: book a table for two on Friday."},
        {"role": "assistant", "content": "Which restaurant would you like?"},
        {"role": "user", "content": "The Italian place on the corner, at 7 pm."},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=8)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        logged, logged_url = start(args.model, Path(tmp) / "serve.jsonl", Path(tmp) / "a.control")
        bare, bare_url = start(args.model, None, Path(tmp) / "b.control")
        times: dict[str, list[float]] = {"log": [], "no log": []}
        try:
            for i in range(args.requests + 1):  # the first pair warms both servers up
                for name, url in (("log", logged_url), ("no log", bare_url)):
                    body = {"model": "m", "messages": messages(i), "max_tokens": args.max_tokens}
                    t0 = time.perf_counter()
                    post(url + "/v1/chat/completions", body)
                    if i:
                        times[name].append(time.perf_counter() - t0)
            log_bytes = (Path(tmp) / "serve.jsonl").stat().st_size
        finally:
            for proc in (logged, bare):
                proc.terminate()
                proc.wait(timeout=30)

        entry = {"endpoint": "/v1/chat/completions", "messages": messages(0), "reply": "x" * 40}
        log = RequestLog(Path(tmp) / "inproc.jsonl")
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            log.add(**entry)
        per_entry = (time.perf_counter() - t0) / n
        log.close()

    with_log, without = statistics.median(times["log"]), statistics.median(times["no log"])
    print(
        f"model {args.model}, {args.requests} chat requests each, "
        f"max_tokens {args.max_tokens}, cores {os.cpu_count()}"
    )
    print(f"median request: with --log {with_log * 1000:.1f} ms, without {without * 1000:.1f} ms")
    print(f"ratio with / without: {with_log / without:.3f}x")
    print(f"log file: {log_bytes / (args.requests + 1):.0f} bytes per request")
    print(f"the log's own work per request (in-process, {n} entries): {per_entry * 1e6:.0f} us")


if __name__ == "__main__":
    main()
