"""Servers eu-audit starts as child processes (``eu-audit serve``, a residue-pack case's agent; the tests'
servers too): each on a free loopback port, used once its health check answers, stopped on the way out.
One start-and-wait, so a server that dies before it answers is reported the same way everywhere: with
the tail of its own output."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from eu_audit.errors import RunFailed

#: seconds a server has to answer its health check (a model server loads its weights first)
START_S = 300


@contextlib.contextmanager
def child_server(
    argv: list[str], health: str, log: Path, env: dict[str, str] | None = None, start_s: float = START_S
) -> Iterator[str]:
    """``argv`` with ``--port P`` appended, its output appended to ``log``; yields its URL once ``health``
    answers. A server that exits or does not answer in ``start_s`` is a failed run naming its output."""
    from eu_audit.engines.llamacpp_server import free_port

    port = free_port()
    with open(log, "ab") as out:
        environ = {**os.environ, **(env or {})}
        argv = [*argv, "--port", str(port)]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environ)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                with urllib.request.urlopen(url + health, timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_bytes()[-2000:].decode(errors="replace")
                    raise RunFailed(
                        f"{Path(argv[0]).name} did not start (its output, {log}): {tail}"
                    ) from None
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
