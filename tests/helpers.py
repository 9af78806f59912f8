"""Shared test helpers: run an episode through the agent on a given model."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from eu_audit.bundle.io import Bundle, read_bundle
from eu_audit.engines.hf import HFEngine
from eu_audit.episodes import Episode
from eu_audit.models import LoadedModel
from eu_audit.record import RecordOptions, record
from eu_audit.runtime.agent import Agent, AgentSettings
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.memory import MemoryStore, Outbox
from eu_audit.serve.api import LogEntry
from eu_audit.trace.records import SinkPolicy
from eu_audit.unlearn import unlearn


def logged(**fields: Any) -> LogEntry:
    """One entry of serve's log as the harness reads it (``LogEntry``), from the fields a test names."""
    return LogEntry.model_validate({"seq": 0, "time": 0.0, **fields})


def stopped_by_sigterm(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[float, str]:
    """SIGTERM to a running command: the seconds it took to exit after the signal, and its stderr."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, said = proc.communicate(timeout=timeout)
    return time.monotonic() - sent, said


def record_and_unlearn(
    loaded: LoadedModel, tmp: Path, episodes: list[Episode], methods: list[str], **opts: object
) -> tuple[Path, Bundle, Bundle]:
    """Record ``episodes`` on ``loaded`` into ``tmp``, apply ``methods``: (recorded path, recorded bundle,
    the methods' bundle, written to ``tmp/out.jsonl``)."""
    suite = tmp / "suite.jsonl"
    suite.write_text("".join(e.model_dump_json() + "\n" for e in episodes))
    src = tmp / "trace.jsonl"
    record(RecordOptions(suite=str(suite), model=loaded.name, out=src, **opts), loaded=loaded)  # type: ignore[arg-type]
    res = unlearn(src, methods, tmp / "out.jsonl", loaded=loaded)
    return src, read_bundle(src), read_bundle(res.path)


def make_agent(
    loaded: LoadedModel,
    episode: Episode,
    state: tuple[MemoryStore, Outbox],
    engine: HFEngine | None = None,
    sid: str = "s0",
    sink_policy: SinkPolicy | None = None,
    **settings: object,
) -> Agent:
    engine = engine or HFEngine(loaded)
    mem, box = state
    return Agent(
        engine,
        detect_chat_format(loaded.tokenizer),
        episode,
        sid,
        AgentSettings(**settings),  # type: ignore[arg-type]
        mem,
        box,
        sink_policy=sink_policy,
    )


def kv_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def turn_ids(agent: Agent) -> list[list[int]]:
    from eu_audit.trace.blocks import MODEL_DERIVED

    return [b.token_ids for b in agent.blocks if b.type in MODEL_DERIVED and b.token_span is not None]


#: EU_AUDIT_TEST_SUBPROCESS=1 runs every CLI call of the tests in a child process of its own
SUBPROCESS = os.environ.get("EU_AUDIT_TEST_SUBPROCESS") == "1"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``eu-audit ARGS``: the real exit code and streams, wide enough not to wrap. In this process, through
    the CLI's own ``main`` (the libraries and models it loads stay loaded for the next call: seconds
    saved per call), unless it needs a directory of its own or ``EU_AUDIT_TEST_SUBPROCESS=1``."""
    if cwd is None and not SUBPROCESS:
        return _in_process(args)
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "eu_audit.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def _in_process(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``main()`` as the console script runs it: argv, streams and the SIGTERM and SIGINT handlers it
    installs are this call's only, restored after."""
    import importlib
    import io

    from eu_audit.cli import main

    cli_app = importlib.import_module("eu_audit.cli.app")  # the module (eu_audit.cli.app is also the app)

    out, err = io.StringIO(), io.StringIO()
    saved = (sys.argv, signal.getsignal(signal.SIGTERM), cli_app.out._width, cli_app.err._width)
    sigint = signal.getsignal(signal.SIGINT)
    debug = os.environ.get(cli_app.DEBUG_ENV)  # --debug sets it for the rest of its process: this call's
    cli_app.out.width = cli_app.err.width = 200
    code = 0
    try:
        sys.argv = ["eu-audit", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 3
    finally:
        sys.argv = saved[0]
        signal.signal(signal.SIGTERM, saved[1])
        signal.signal(signal.SIGINT, sigint)
        cli_app.out._width, cli_app.err._width = saved[2], saved[3]
        if debug is None:
            os.environ.pop(cli_app.DEBUG_ENV, None)
        else:
            os.environ[cli_app.DEBUG_ENV] = debug
    return subprocess.CompletedProcess(["eu-audit", *args], code, out.getvalue(), err.getvalue())


HEAVY = ("torch", "transformers", "llama_cpp", "agentdojo")  # each costs seconds to import
_EXIT_AND_IMPORTS = (
    "import sys\n"
    "from eu_audit.cli.app import main\n"
    "sys.argv = ['eu-audit', *sys.argv[1:]]\n"
    "try:\n    main()\n"
    "except SystemExit as exc:\n"
    f"    print('exit', exc.code, 'loaded', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
)


def exit_and_heavy_imports(*args: str) -> str:
    """``eu-audit ARGS`` in a subprocess: 'exit CODE loaded [the heavy libraries it imported]'."""
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_AND_IMPORTS, *args], capture_output=True, text=True, timeout=300, env=env
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("exit ")]
    return line[-1] if line else f"no exit line: {proc.stdout[-500:]} {proc.stderr[-2000:]}"


@contextlib.contextmanager
def http_process(
    argv: list[str], health: str = "/health", env: dict[str, str] | None = None
) -> Iterator[str]:
    """A server in a child process (``argv`` gets ``--port P``), real HTTP on loopback; yields its URL once
    ``health`` answers. Its output is shown if it dies before that (``eu_audit.servers``)."""
    from eu_audit.servers import child_server

    with (
        tempfile.TemporaryDirectory() as tmp,
        child_server(argv, health, Path(tmp) / "out.log", env, 180) as url,
    ):
        yield url


def cli_server(*args: str) -> contextlib.AbstractContextManager[str]:
    """``eu-audit ARGS --port P`` in a child process; yields its URL."""
    return http_process([sys.executable, "-m", "eu_audit.cli", *args])
