"""`eu-audit serve` against llama.cpp's own HTTP server on the same model and cores, side by side in one
run: the same chat requests (greedy, up to 64 completion tokens each) at concurrency 1 and 8, the two
servers alternating level by level so machine noise hits both. Prints completion tokens per second of
wall time for each and the ratio serve / llama.cpp.

    python bench/serve_vs_llamacpp.py --model smollm2-135m --requests 16 --levels 1,8

llama.cpp's server runs with as many slots as the highest level (its continuous batching); serve runs
as a CI job runs it (``--log`` on, the repetition guard on).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eu_audit.engines.llamacpp_server import free_port, running, wait_healthy  # noqa: E402

TOPICS = ["rivers", "bridges", "markets", "trains", "gardens", "museums", "harbours", "festivals"]


def chat(url: str, i: int, max_tokens: int) -> int:
    """One request like an agent's (a system prompt, a user turn); returns its completion tokens."""
    body = {
        "model": "m",
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [
            {
                "role": "system",
                "content": "You are a travel agency's assistant. Answer in detail.",
            },
            {"role": "user", "content": f"Describe the {TOPICS[i % len(TOPICS)]} of city number {i}."},
        ],
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def measure(url: str, requests: int, level: int, max_tokens: int) -> tuple[float, int]:
    """(completion tokens per second, tokens) for ``requests`` requests ``level`` at a time."""
    chat(url, 1000, 4)  # warm: the first request pays one-time costs
    t0 = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        tokens = sum(pool.map(lambda i: chat(url, i, max_tokens), range(requests)))
    return tokens / (time.perf_counter() - t0), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="eu-audit-svl-"))
    port = free_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "eu_audit.cli", "serve", "--model", args.model, "--port", str(port),
         "--control-file", str(tmp / "control"), "--log", str(tmp / "serve.jsonl")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    serve_url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(serve_url, timeout=300, proc=serve)
        with running(args.model, parallel=max(levels)) as llama_url:
            print(f"{args.model}, {args.requests} requests per level, up to {args.max_tokens} tokens each")
            print("| concurrency | llama.cpp server tok/s | eu-audit serve tok/s | serve / llama.cpp |")
            print("|---|---|---|---|")
            for level in levels:
                ref, n_ref = measure(llama_url, args.requests, level, args.max_tokens)
                ours, n_ours = measure(serve_url, args.requests, level, args.max_tokens)
                print(f"| {level} | {ref:.1f} ({n_ref} tokens) | {ours:.1f} ({n_ours} tokens) | "
                      f"{ours / ref:.2f}x |", flush=True)  # fmt: skip
    finally:
        serve.terminate()
        serve.wait(timeout=30)


if __name__ == "__main__":
    main()
