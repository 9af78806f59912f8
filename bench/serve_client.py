"""What the serve benchmarks share: start an ``eu-audit serve`` of its own, and time one greedy chat
request with the prompt tokens it served from the cache."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eu_audit.engines.llamacpp_server import free_port, wait_healthy  # noqa: E402


def post(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, int, int]:
    """(wall seconds, prompt tokens, cached prompt tokens) of one greedy chat request."""
    body = {"model": "m", "temperature": 0, "max_tokens": max_tokens, "messages": messages}
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as resp:
        usage = json.loads(resp.read())["usage"]
    return time.perf_counter() - t0, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def start(model: str, options: list[str], control: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A server of its own for ``model`` with serve ``options``; (its process, its URL) once healthy."""
    port = free_port()
    cmd = [sys.executable, "-m", "eu_audit.cli", "serve", "--model", model, "--port", str(port)]
    cmd += [*options, "--control-file", str(control)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, 600, proc)
    return proc, url
