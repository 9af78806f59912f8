"""Tenants driven at the same time (``record --agent --concurrency N``) are told apart by where their model
calls arrive: each tenant gets its own lane of serve, marked and pinned by the harness alone. A run four at a
time attributes every call exactly as a run one at a time does; an agent that cannot take a lane is refused
before it runs, and one that sends a call outside its lane fails the run (exit 3, no bundle). Mechanics on
the tiny model and a scripted agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eu_audit.bundle.io import read_bundle
from eu_audit.models import TINY_MODEL, LoadedModel

from .helpers import cli_server, http_process, run_cli, stopped_by_sigterm


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("serve")
    control = folder / "serve.control"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--control-file", str(control)]
    with cli_server(*args, "--log", str(folder / "serve.jsonl")) as url:
        yield url, control


def _record(serve: tuple[str, Path], agent: str, concurrency: int, out: Path) -> tuple[int, str]:
    url, control = serve
    proc = run_cli(
        "record",
        "--agent",
        f"tests.scripted_agents:{agent}",
        "--serve",
        url,
        "--serve-control",
        str(control),
        "--suite",
        "builtin",
        "--k",
        "1",
        "--concurrency",
        str(concurrency),
        "--no-own-floor",
        "--out",
        str(out),
    )  # fmt: skip  (the tenants the agent drives: eu-audit's own floor is tested apart)
    return proc.returncode, proc.stdout + proc.stderr


def _residues(path: Path) -> dict[str, tuple[int | None, int | None]]:
    return {
        s.session_id: (s.residues[0].context_calls, s.residues[0].context_calls_with_z)
        for s in read_bundle(path).sessions
    }


def test_tenants_driven_four_at_a_time_are_attributed_as_one_at_a_time(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    rc, said = _record(serve, "lanes", 1, tmp_path / "one.jsonl")
    assert rc == 0, said
    # an agent that takes a model URL per tenant gets one one tenant at a time too: every model call of
    # that run arrived in a tenant's lane
    log = [json.loads(line) for line in (serve[1].parent / "serve.jsonl").read_text().splitlines()]
    chats = [e for e in log if e.get("endpoint") == "/v1/chat/completions"]
    assert chats and all(e.get("lane") for e in chats)
    rc, said = _record(serve, "lanes", 4, tmp_path / "four.jsonl")
    assert rc == 0, said
    one, four = _residues(tmp_path / "one.jsonl"), _residues(tmp_path / "four.jsonl")
    assert one == four and len(four) == 6  # 2 sessions x (agent, reference B5, no-forget control B0)
    for sid, (calls, with_z) in four.items():
        assert calls and calls > 0, sid  # every tenant's post-forget calls were found in its lane
        # the naive forget keeps z in every later prompt, as does the control that was never asked to
        # forget; the reference tenant never saw it
        assert with_z == (calls if sid.endswith(("/agent", "/b0")) else 0), sid


def test_an_agent_that_cannot_take_a_lane_is_refused_and_one_that_leaves_it_fails_the_run(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    rc, said = _record(serve, "naive", 2, tmp_path / "naive.jsonl")
    assert rc == 2 and "tenant_model_url" in said and not (tmp_path / "naive.jsonl").exists(), said
    rc, said = _record(serve, "stray", 2, tmp_path / "stray.jsonl")
    assert rc == 3 and "root URL" in said and not (tmp_path / "stray.jsonl").exists(), said
    # one tenant at a time the root URL is marked too: the same agent's calls there are its tenant's
    rc, said = _record(serve, "stray", 1, tmp_path / "stray-one.jsonl")
    assert rc == 0, said
    one = _residues(tmp_path / "stray-one.jsonl")
    assert all(calls and with_z == calls for sid, (calls, with_z) in one.items() if sid.endswith("/agent"))
    proc = run_cli("record", "--agent", "tests.scripted_agents:lanes", "--concurrency", "0")
    assert proc.returncode == 2 and "--concurrency" in proc.stderr


def test_each_lane_keeps_its_own_cache_so_a_tenants_prefix_survives_the_others_requests(
    tiny: LoadedModel,
) -> None:
    """Tenants side by side send their requests interleaved. With one cache for all, each request would
    meet another tenant's prefix and prefill its whole prompt again; serve keeps one cache per recent lane
    (``--lane-caches``), and a lane's answers are the ones a lone cache gives."""
    import json
    import threading
    import time

    from eu_audit.engines.hf import HFEngine
    from eu_audit.serve import Backend, Call, RequestLog, Routes, create_app
    from eu_audit.serve.api import Limits

    backends: list[Backend] = []

    def routes(caches: int) -> Routes:
        backends.append(Backend(engine=HFEngine(tiny), model_name="tiny"))
        return create_app(backends[-1], RequestLog(None), limits=Limits(lane_caches=caches)).state.routes

    def chat(r: Routes, lane: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        call = Call(deadline=time.monotonic() + 60, stopping=threading.Event(), lane=r.lane(lane))
        return r._chat(json.dumps({"model": "m", "max_tokens": 4, "messages": messages}).encode(), call)

    def history(who: str, turns: int) -> list[dict[str, str]]:
        sys = {"role": "system", "content": f"You serve {who}. " + "Keep every answer short. " * 8}
        return [sys, *({"role": "user", "content": f"{who} question {i}"} for i in range(turns))]

    a, b = "a" * 32, "b" * 32
    for caches, kept in ((2, True), (1, False)):
        r = routes(caches)
        chat(r, a, history("ann", 1))
        chat(r, b, history("bob", 1))  # another tenant's request in between
        second = chat(r, a, history("ann", 2))
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert (cached > 20) is kept, (caches, cached)
        lone = routes(1)
        chat(lone, a, history("ann", 1))
        assert chat(lone, a, history("ann", 2))["choices"] == second["choices"]
    for backend in backends:
        backend.close()


def test_a_lanes_prompt_families_each_keep_their_prefix_and_the_answers_do_not_change(
    tiny: LoadedModel,
) -> None:
    """A memory library that sends its own long fixed prompt between the agent's chat calls (mem0's
    extraction at infer=True: 8k tokens of instructions) would have that prompt prefilled again on every
    switch with one cache per lane. serve keeps a cache per lane and opening message: both families stay
    cached, and every answer is the one a fresh cache gives."""
    import json
    import threading
    import time

    from eu_audit.engines.hf import HFEngine
    from eu_audit.serve import Backend, Call, RequestLog, Routes, create_app
    from eu_audit.serve.api import Limits

    backends: list[Backend] = []

    def routes() -> Routes:
        backends.append(Backend(engine=HFEngine(tiny), model_name="tiny"))
        return create_app(backends[-1], RequestLog(None), limits=Limits(lane_caches=4)).state.routes

    def chat(r: Routes, messages: list[dict[str, str]]) -> dict[str, Any]:
        call = Call(deadline=time.monotonic() + 60, stopping=threading.Event(), lane=r.lane("c" * 32))
        return r._chat(json.dumps({"model": "m", "max_tokens": 4, "messages": messages}).encode(), call)

    agent = {"role": "system", "content": "You are a helpful assistant. " * 6}
    extract = {"role": "system", "content": "Extract every fact from the new messages as JSON. " * 6}
    r = routes()
    chat(r, [agent, {"role": "user", "content": "hello"}])
    chat(r, [extract, {"role": "user", "content": "New messages: hello"}])
    again = chat(r, [agent, {"role": "user", "content": "hello"}, {"role": "user", "content": "and you?"}])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 40  # the agent's family was kept
    second = chat(r, [extract, {"role": "user", "content": "New messages: and you?"}])
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 40  # and the extractor's
    fresh = routes()
    assert (
        chat(fresh, [extract, {"role": "user", "content": "New messages: and you?"}])["choices"]
        == second["choices"]
    )
    for backend in backends:
        backend.close()


def test_a_system_prompt_that_changes_only_at_its_end_keeps_its_leading_pieces_cached(
    tiny: LoadedModel,
) -> None:
    """Letta ends its system prompt with the time its memory was last modified, so every call's first
    message differs at its end: as a whole message nothing of it is reused, and each call opens a new
    cache. With ``--piece-tokens`` the message is prefilled in fixed-offset pieces, the unchanged leading
    pieces stay cached, and the answer is the one a fresh cache with the same pieces gives."""
    import json
    import threading
    import time

    from eu_audit.engines.hf import HFEngine
    from eu_audit.serve import Backend, Call, RequestLog, Routes, create_app
    from eu_audit.serve.api import Limits

    backends: list[Backend] = []

    def routes(piece: int) -> Routes:
        backends.append(Backend(engine=HFEngine(tiny), model_name="tiny"))
        limits = Limits(lane_caches=4, piece_tokens=piece)
        return create_app(backends[-1], RequestLog(None), limits=limits).state.routes

    def chat(r: Routes, messages: list[dict[str, str]]) -> dict[str, Any]:
        call = Call(deadline=time.monotonic() + 60, stopping=threading.Event(), lane=r.lane("d" * 32))
        return r._chat(json.dumps({"model": "m", "max_tokens": 4, "messages": messages}).encode(), call)

    def system(minute: int) -> dict[str, str]:
        fixed = "You are a memory-augmented assistant. Keep every answer short. " * 6
        return {"role": "system", "content": fixed + f"Memory last modified at 16:{minute:02d}."}

    ask = {"role": "user", "content": "hello"}
    for piece in (0, 16):
        r = routes(piece)
        chat(r, [system(1), ask])
        second = chat(r, [system(2), ask, {"role": "user", "content": "and you?"}])
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert (cached == 0) if piece == 0 else (cached >= 48), (piece, cached)
        fresh = routes(piece)
        assert (
            chat(fresh, [system(2), ask, {"role": "user", "content": "and you?"}])["choices"]
            == second["choices"]
        )
    for backend in backends:
        backend.close()


def test_serve_computes_on_one_thread_whichever_request_thread_asks(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ggml and torch use OpenMP: a second thread that computes gets a worker pool of its own, and on a
    small machine the pools oversubscribe the cores (serve decoded 3x slower from its request threads).
    So every forward pass serve runs happens on its one model thread."""
    import json
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from eu_audit.engines.hf import HFEngine
    from eu_audit.serve import Backend, Call, RequestLog, create_app

    seen: set[int] = set()
    run = HFEngine._run

    def spy(self: HFEngine, ids: Any) -> Any:
        seen.add(threading.get_ident())
        return run(self, ids)

    monkeypatch.setattr(HFEngine, "_run", spy)
    backend = Backend(engine=HFEngine(tiny), model_name="tiny")
    r = create_app(backend, RequestLog(None)).state.routes
    body = json.dumps({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})

    def chat(lane: str) -> Any:
        call = Call(deadline=time.monotonic() + 60, stopping=threading.Event(), lane=r.lane(lane))
        return r._chat(body.encode(), call)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(chat, ["a" * 32, "b" * 32, "c" * 32, "a" * 32]))
    model_thread = backend.worker.submit(threading.get_ident).result()
    backend.close()
    assert all(a["choices"] for a in answers) and seen == {model_thread}


def test_model_calls_the_agent_makes_inside_its_forget_are_marked_forget(
    serve: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", serve[0])
    log_path = serve[1].parent / "serve.jsonl"
    start = len(log_path.read_text().splitlines())
    rc, said = _record(serve, "rewriting", 1, tmp_path / "rw.jsonl")
    assert rc == 0, said
    log = [json.loads(line) for line in log_path.read_text().splitlines()[start:]]
    phases = [(e.get("mark") or {}).get("phase") for e in log if e.get("endpoint") == "/v1/chat/completions"]
    # the agent's forget asks the model once per session (2 sessions); no other tenant is sent a forget
    assert phases.count("forget") == 2, phases
    assert {"stream", "future", "probe"} <= set(phases)


def test_an_output_that_cannot_be_written_is_refused_before_any_tenant_runs(tmp_path: Path) -> None:
    """The black-box record checks -o like the white-box one: a path under a file is bad input (exit 2)
    at once, not a run failure after every tenant's model calls."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = str(blocker / "x.jsonl")
    proc = run_cli("record", "--agent", "tests.scripted_agents:lanes", "--suite", "builtin", "-o", out)
    assert proc.returncode == 2 and "is a file, not a folder" in proc.stdout + proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_with_tenants_in_flight_stops_within_5_s_keeping_the_whole_sessions(
    serve: tuple[str, Path], tmp_path: Path
) -> None:
    """Three tenants in flight, the second session's three hung in the agent (``HangingAgent``, over
    HTTP): SIGTERM stops the run within 5 s, exit 3, and the first session, every tenant of it finished,
    is a valid bundle marked interrupted. The hung calls are not waited for (they would hold the process
    for as long as the agent takes)."""
    url, control = serve
    out, hung = tmp_path / "bb.jsonl", tmp_path / "hung"
    root = Path(__file__).resolve().parents[1]
    env = {"EU_AUDIT_TEST_SERVE": url, "EU_AUDIT_TEST_HANG": str(hung), "PYTHONPATH": str(root)}
    agent_argv = [sys.executable, "-m", "tests.scripted_agents", "hanging"]
    with http_process(agent_argv, "/eu-audit/v1/capabilities", {**os.environ, **env}) as agent:
        argv = [sys.executable, "-m", "eu_audit.cli", "gate", "--record-only", "--fixed-n", "--agent", agent]
        argv += ["--same-user-ok", "--serve", url, "--serve-control", str(control), "--suite", "builtin"]
        argv += ["--n", "2", "--k", "1", "--tenants-in-flight", "3", "--no-own-floor", "-o", str(out)]
        proc = subprocess.Popen(argv, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 240
        while not hung.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if not hung.exists():
            proc.kill()
            raise AssertionError(proc.communicate(timeout=30))
        took, said = stopped_by_sigterm(proc)
    assert proc.returncode == 3 and took < 5, (proc.returncode, took, said[-1500:])
    assert "interrupted after 1 of 2 session(s)" in said, said[-1500:]
    bundle = read_bundle(out)
    assert {t.session_id for t in bundle.sessions} == {"s0/agent", "s0/b5", "s0/b0"}
    assert bundle.header.engine_facts["interrupted"] == "after 1 of 2 session(s)"
