"""A real llama.cpp server (llama.cpp's own C++ HTTP server, embedded in the prebuilt ``xllamacpp`` wheel)
on a model eu-audit ships, for the ``openai`` engine's tests and benchmarks, and for users who want a
served engine without a GPU:

    python -m eu_audit.engines.llamacpp_server --model smollm2-135m --port 8081

It listens on 127.0.0.1 only, with two slots (``--parallel``: a session and its isolated sub-tasks),
prompt caching on, the host-RAM prompt
cache off unless ``--cache-ram`` is given (so a slot erase really empties what the server holds), and
the ``/slots`` endpoint and slot actions on (the slot erase that the canonical served schedule and the
serving-residue audit call; llama.cpp enables slot actions only with a slot save path, ``--slot-save-path``
on its command line, which this launcher sets to a private temporary folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from eu_audit.errors import BadInput, RunFailed

SERVER_WHEEL = "xllamacpp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(gguf: Path, *, port: int, parallel: int = 1, n_ctx: int = 8192, cache_ram_mib: int = 0) -> None:
    """Run the server in this process until SIGTERM / SIGINT."""
    try:
        import xllamacpp as xlc
    except ImportError as exc:
        wheel = SERVER_WHEEL
        raise BadInput(f"the llama.cpp server needs the '{wheel}' wheel (pip install '{wheel}')") from exc
    params = xlc.CommonParams()
    params.model.path = str(gguf)
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_parallel = parallel
    params.n_ctx = n_ctx * parallel
    params.n_batch = n_ctx
    params.n_ubatch = n_ctx
    params.cache_prompt = True
    params.cache_ram_mib = cache_ram_mib
    params.endpoint_slots = True
    params.endpoint_props = True
    # slot actions (erase, which the canonical served schedule and the residue audit call) are enabled
    # only with a slot save path; nothing is saved there unless asked
    slot_dir = Path(tempfile.mkdtemp(prefix="eu-audit-slots-"))
    params.slot_save_path = str(slot_dir)
    params.warmup = False
    threads = int(os.environ.get("EU_AUDIT_THREADS", 0)) or max(1, os.cpu_count() or 1)
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    server = xlc.Server(params)
    print(json.dumps({"listening": server.listening_address}), flush=True)
    stop = {"now": False}

    def done(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, done)
    signal.signal(signal.SIGINT, done)
    while not stop["now"]:
        time.sleep(0.2)


def wait_healthy(url: str, timeout: float = 120.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``/health``; when ``proc`` (the server) dies first, say so at once, not at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RunFailed(
                f"the llama.cpp server for {url} exited with code {proc.returncode} before it was healthy"
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.3)
    raise RunFailed(f"the llama.cpp server at {url} did not become healthy within {timeout:.0f} s")


@contextlib.contextmanager
def running(
    model: str, *, port: int | None = None, cache_ram_mib: int = 0, parallel: int = 2
) -> Iterator[str]:
    """A llama.cpp server on ``model`` with ``parallel`` slots in a child process; yields its base URL;
    stopped on exit."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "eu_audit.engines.llamacpp_server",
        "--model",
        model,
        "--port",
        str(port),
        "--cache-ram",
        str(cache_ram_mib),
        "--parallel",
        str(parallel),
    ]
    # the server logs every request: to a file, never to a pipe nobody reads (a full pipe blocks it)
    with tempfile.TemporaryFile(prefix="eu-audit-llama-server-", suffix=".log") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_healthy(url, proc=proc)
            except RunFailed as exc:
                log.seek(0)
                tail = log.read()[-2000:].decode("utf-8", "replace")
                raise RunFailed(f"{exc}; its log ends:\n{tail}") from exc
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_llamacpp_server(argv: list[str] | None = None) -> int:
    from eu_audit.models import gguf_path, resolve_model

    ap = argparse.ArgumentParser(prog="python -m eu_audit.engines.llamacpp_server", description=__doc__)
    ap.add_argument("--model", default="smollm2-135m", help="a registered model or a .gguf file")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument(
        "--parallel", type=int, default=2, help="slots (a session and its isolated sub-tasks use one each)"
    )
    ap.add_argument("--ctx", type=int, default=8192, help="context per slot")
    ap.add_argument("--cache-ram", type=int, default=0, help="host-RAM prompt cache in MiB (0: off)")
    args = ap.parse_args(argv)
    gguf, _ = gguf_path(resolve_model(args.model))
    serve(gguf, port=args.port, parallel=args.parallel, n_ctx=args.ctx, cache_ram_mib=args.cache_ram)
    return 0


if __name__ == "__main__":
    sys.exit(run_llamacpp_server())
