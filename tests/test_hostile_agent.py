"""An agent that keeps z cannot pass. A hostile agent served over HTTP through the documented contract
(``tests/hostile_agent.py``) keeps z in every call and tries each route around the measurement: the
control secret read from its file, a forged secret, the reference's lane with and without holding the
reference, lanes serve never opened, lanes of tenants whose run is over. Every run ends with the run failed
(exit 3) or the gate failed (exit 1), never held (0) or inconclusive (4), and the audit names what it
tried, per tenant. Mechanics on the tiny model: seconds per route."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from eu_audit.models import TINY_MODEL
from eu_audit.serve.control import default_control_file

from .helpers import cli_server, http_process, logged, run_cli


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """serve as the README runs it: the control secret in its default, private place."""
    folder = tmp_path_factory.mktemp("serve")
    with cli_server(
        "serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(folder / "log.jsonl")
    ) as url:
        LOG[url] = folder / "log.jsonl"
        yield url


#: serve's log file, by serve's URL
LOG: dict[str, Path] = {}


def _gate(serve: str, route: str, concurrency: int, tmp_path: Path, cli: bool) -> tuple[int, str, dict]:
    """Record the hostile agent and audit the bundle with the forget gate set: (exit code, output, audit
    JSON). ``cli``: through the commands a CI job runs (their exit codes, JSON and JUnit); else the same
    through the library, seconds faster."""
    from eu_audit.audit import AuditOptions, audit
    from eu_audit.audits.gate import evaluate, exit_code, expand_gate_sets
    from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
    from eu_audit.errors import RunFailed

    control = default_control_file(int(serve.rsplit(":", 1)[1]))
    argv = [sys.executable, "-m", "tests.hostile_agent", "--route", route, "--serve", serve]
    out, report = tmp_path / "bundle.jsonl", tmp_path / "audit.json"
    with http_process([*argv, "--control-file", str(control)], health="/eu-audit/v1/capabilities") as agent:
        if not cli:
            opts = AgentRecordOptions(
                agent=agent, serve=serve, n=1, k=1, concurrency=concurrency, out=out, own_floor=False
            )
            try:
                record_agent(opts)
            except RunFailed as exc:
                return 3, str(exc), {}
            rep = audit(out, AuditOptions())
            gates = evaluate(rep, expand_gate_sets(["forget"], rep.methods, "black"))
            return (
                exit_code(gates),
                "",
                {**rep.model_dump(mode="json"), "gates": [g.model_dump() for g in gates]},
            )
        rec = run_cli(
            "record", "--agent", agent, "--same-user-ok", "--no-own-floor", "--serve", serve, "--suite",
            "builtin", "--n", "1",
            "--k", "1", "--concurrency", str(concurrency), "--out", str(out),
        )  # fmt: skip
    if rec.returncode != 0:
        return rec.returncode, rec.stdout + rec.stderr, {}
    junit = str(tmp_path / "j.xml")
    done = run_cli("audit", str(out), "--gate-set", "forget", "--json", str(report), "--junit", junit)
    said = done.stdout + done.stderr
    return done.returncode, said, json.loads(report.read_text()) if report.exists() else {"said": said}


@pytest.mark.parametrize(
    ("route", "concurrency", "kinds"),
    [
        ("secret-file", 1, {"control_foreign"}),
        ("no-secret", 1, {"control_refused"}),
        ("reference-lane", 3, {"reference_z", "unfed_text", "stray_call"}),
        ("hold", 3, {"reference_z", "unfed_text"}),
        ("unknown-lane", 3, {"unknown_route"}),
        ("other-lanes", 3, {"reference_z", "unfed_text", "stray_call"}),
        ("control-lane", 3, {"unheard_turn", "unfed_text", "stray_call"}),
    ],
)
def test_a_hostile_agent_that_keeps_z_never_passes_whatever_route_it_tries(
    serve: str, tmp_path: Path, route: str, concurrency: int, kinds: set[str]
) -> None:
    cli = route == "secret-file"  # one route through the CLI: exit codes, JSON and JUnit as CI sees them
    rc, said, report = _gate(serve, route, concurrency, tmp_path, cli)
    assert rc in (1, 3), f"{route}: exit {rc}\n{said[-3000:]}"
    if rc == 1:  # the gate failed: on the tamper finding, named per tenant in the JSON and the JUnit
        found = {t["kind"] for t in report["tampering"]}
        assert found and found <= set(kinds) | {"unfed_text", "stray_call"}, (
            route,
            report["tampering"],
            said[-1500:],
        )
        assert found & kinds, (route, report["tampering"])
        tamper = next(g for g in report["gates"] if g["rule"] == "no tampering")
        assert tamper["outcome"] == "failed" and "tried to get around" in tamper["detail"]
        if cli:
            assert "no tampering" in said and "no tampering" in (tmp_path / "j.xml").read_text()


def test_an_agent_that_sends_z_base64_encoded_fails_naming_it_and_serves_log_names_no_role(
    serve: str, tmp_path: Path
) -> None:
    rc, said, report = _gate(serve, "base64", 1, tmp_path, cli=False)
    assert rc == 1, f"exit {rc}\n{said[-3000:]}"
    failed = {g["rule"]: g for g in report["gates"] if g["outcome"] == "failed"}
    assert "agent.residue_context==0" in failed, report["gates"]
    # the example names the encoding, and shows the decoded text masked, never the encoded z
    assert "sent as base64" in json.dumps(report), report["states"]
    # serve's log is a file an agent of the harness's user could read: its marks say which tenant (an
    # opaque name) and which phase, never which tenant is the reference or the control, nor a session
    marks = [m for m in (json.loads(x).get("mark") for x in LOG[serve].read_text().splitlines()) if m]
    assert marks and all(set(m) <= {"tenant", "phase", "event", "key"} for m in marks), marks[:3]
    assert all(m["tenant"] == "" or len(m["tenant"]) == 16 for m in marks), {m["tenant"] for m in marks}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_an_agent_run_as_another_user_cannot_read_the_control_secret(serve: str) -> None:
    """The README's recipe runs the agent as another user: serve's default control file is in a 0700
    directory of the user who started serve, so the agent's process cannot open it."""
    control = default_control_file(int(serve.rsplit(":", 1)[1]))
    assert control.exists() and (control.stat().st_mode & 0o777) == 0o600
    assert (control.parent.stat().st_mode & 0o777) == 0o700
    probe = subprocess.run(["cat", str(control)], user="nobody", capture_output=True, text=True)
    assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr


def test_serve_refuses_to_write_its_secret_where_the_agent_is_started(tmp_path: Path) -> None:
    proc = run_cli("serve", "--model", TINY_MODEL, "--control-file", "eu-audit-serve.control", cwd=tmp_path)
    assert proc.returncode == 2 and "inside the directory serve was started from" in proc.stderr, proc.stderr
    assert not (tmp_path / "eu-audit-serve.control").exists()


def _misbehaving_agent(mode: str) -> Iterator[str]:
    """The notebook agent over HTTP, except that every message is answered with a redirect ("redirect"),
    or the first call carrying z with an HTTP 500 whose body quotes it twenty times ("echo")."""
    import threading

    import uvicorn
    from fastapi import Request
    from fastapi.responses import PlainTextResponse, RedirectResponse

    from eu_audit.blackbox.agent_server import create_agent_app
    from eu_audit.engines.llamacpp_server import free_port

    from .scripted_agents import naive

    app = create_agent_app(naive())

    @app.middleware("http")
    async def misbehave(request: Request, call_next):  # type: ignore[no-untyped-def]
        said = (await request.body()).decode()
        if mode == "redirect" and request.url.path.endswith("/messages"):
            return RedirectResponse("http://127.0.0.1:9/elsewhere", status_code=302)
        if mode == "echo" and "Linden" in said:  # the first call that carries z: echoed twenty times
            return PlainTextResponse(f"Traceback: while answering {said * 20}", status_code=500)
        return await call_next(request)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize("mode", ["redirect", "echo"])
def test_the_driver_refuses_a_redirect_and_never_echoes_an_agents_error_body(
    tmp_path: Path, mode: str
) -> None:
    """A redirect is no answer (once it was taken for an empty turn, and the run passed with seven empty
    turns): the run fails, exit 3, naming the endpoint. An agent's 500 is quoted in a short excerpt with
    the target masked (the episode's home address is in what it echoes)."""
    agent = contextlib.contextmanager(_misbehaving_agent)(mode)
    with agent as url:
        out = tmp_path / "b.jsonl"
        proc = run_cli(
            "record",
            "--agent",
            url,
            "--same-user-ok",
            "--suite",
            "builtin",
            "--n",
            "1",
            "--k",
            "1",
            "--out",
            str(out),
        )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 3 and not out.exists(), said
    assert "/eu-audit/v1/" in said, said
    if mode == "redirect":
        assert "redirect (HTTP 302" in said, said
    else:
        assert "HTTP 500" in said and len(said) < 1500, said
        assert "Linden" not in said and "[z]" in said, said  # the target, 12 Linden Street, masked


def test_z_in_the_references_calls_is_tampering_unless_its_own_model_wrote_z_first() -> None:
    """The reference (B5) was never fed z: z in its prompts means the agent put it there, unless its own
    model wrote z first (a guessable file name), which then explains the prompts that follow."""
    from eu_audit.blackbox.tamper import Tenant, find_tampering
    from eu_audit.matching import TargetMatcher

    ref = Tenant("s0", "b5", TargetMatcher.of("12 Linden Street"))

    def call(text: str, reply: str = "ok") -> dict:
        mark = {"key": "k", "tenant": "t5", "phase": "future"}
        msgs = [{"role": "user", "content": text}]
        return {
            "endpoint": "/v1/chat/completions",
            "status": 200,
            "mark": mark,
            "messages": msgs,
            "reply": reply,
        }

    def found(entries: list[dict]) -> dict:
        ref.own_z_replies.clear()  # each list of entries is a run of its own
        got = find_tampering(
            [logged(**e) for e in entries], key="k", sent=set(), tenants={"t5": ref}, lanes={},
            first=("s0", "agent"),
        )  # fmt: skip
        return got.counts.get(("s0", "b5"), {})

    assert found([call("you live at 12 Linden Street")]) == {"reference_z": 1}
    wrote = [call("where do I live?", reply="12 Linden Street?"), call("you said 12 Linden Street")]
    assert found(wrote) == {}
    # a reply held to a schema is the agent's doing (a pattern can spell z): it never excuses
    pattern = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": {"pattern": "\\x31\\x32 Linden"}},
    }
    held = [{**call("where do I live?", reply="12 Linden Street"), "response_format": pattern}]
    assert found([*held, call("you said 12 Linden Street")]) == {"reference_z": 1}
    forced = [{**call("where do I live?", reply="12 Linden Street"), "tool_choice": "required"}]
    assert found([*forced, call("you said 12 Linden Street")]) == {"reference_z": 1}
    # what its model wrote excuses quotes of it only, not z in other words of a later call
    guessed = [call("where do I live?", reply="I think it is 12 Linden Street, right?")]
    assert found([*guessed, call("you said: I think it is 12 Linden Street, right?")]) == {}
    assert found([*guessed, call("Address on file: 12 Linden Street")]) == {"reference_z": 1}


def test_a_call_quoting_a_turn_its_tenant_had_not_been_sent_yet_is_tampering() -> None:
    """A call sent down another tenant's lane carries that other tenant's turns: on this lane, turns the
    harness had not yet sent its tenant (serve logs the call before the harness sent the turn)."""
    from eu_audit.blackbox.tamper import Tenant, find_tampering
    from eu_audit.matching import TargetMatcher

    turn = "Please book the dentist for next Tuesday morning."
    held = Tenant("s0", "b0", TargetMatcher.of("12 Linden Street"), fed=[(100.0, "Hi"), (200.0, turn)])

    def at(when: float) -> dict:
        mark = {"key": "k", "tenant": "t0", "phase": "stream"}
        msgs = [{"role": "user", "content": turn}]
        entry = {"endpoint": "/v1/chat/completions", "status": 200, "mark": mark, "messages": msgs}
        got = find_tampering([logged(**entry, time=when)], key="k", sent=set(), tenants={"t0": held},
                             lanes={}, first=("s0", "agent"))  # fmt: skip
        return got.counts.get(("s0", "b0"), {})

    assert at(150.0) == {"unfed_text": 1}  # logged before the harness sent it the turn
    assert at(250.0) == {}  # after: an honest call
    # a quote altered by a space or a case is still the quote (both sides folded as the matcher folds)
    turn_altered = "Please  book the Dentist for next Tuesday morning."
    held.fed[1] = (200.0, turn_altered)
    held._first = None
    assert at(150.0) == {"unfed_text": 1}


def test_an_answer_or_a_turn_decoded_on_another_tenants_lane_is_tampering() -> None:
    """An agent that sends its tenant's calls down the positive control's lane (whose calls may carry z)
    leaves its own lane clean; but what it answers that tenant was then decoded on the other lane only
    (``foreign_answer``), and a call carrying its history there quotes replies decoded for it alone
    (``foreign_history``). What both tenants decoded (every turn before the forget) is each one's own."""
    from types import SimpleNamespace

    from eu_audit.blackbox.tamper import Tenant, find_tampering
    from eu_audit.matching import TargetMatcher
    from eu_audit.trace.blocks import BlockType, RuntimeBlock

    z = TargetMatcher.of("12 Linden Street")
    tenants = {"ta": Tenant("s0", "agent", z), "tc": Tenant("s0", "b0", z)}
    both = "Your dentist appointment is booked for Tuesday at nine."
    took = "I have noted the new address for the parcel delivery."
    decoy = "Happy to help with anything else you need today."

    def call(tenant: str, reply: str, history: tuple[str, ...] = ()) -> dict:
        msgs = [
            {"role": "user", "content": "and then?"},
            *({"role": "assistant", "content": h} for h in history),
        ]
        mark = {"key": "k", "tenant": tenant, "phase": "future"}
        return {"endpoint": "/v1/chat/completions", "mark": mark, "messages": msgs, "reply": reply}

    def answered(*texts: str) -> object:
        blocks = [
            RuntimeBlock(id=f"b{i}", type=BlockType.assistant, turn=i, text=x) for i, x in enumerate(texts)
        ]
        return SimpleNamespace(
            session_id="s0/agent", session=SimpleNamespace(method="agent"), blocks=blocks, tool_calls=[],
            elicitations=[], residues=[],
        )  # fmt: skip

    def found(entries: list[dict], *answers: str) -> dict:
        got = find_tampering(
            [logged(**e) for e in entries],
            key="k",
            sent=set(),
            tenants=tenants,
            lanes={},
            first=("s0", "agent"),
        )
        got.attach_to([answered(*answers)])  # type: ignore[list-item]
        return {w[1]: kinds for w, kinds in got.counts.items()}

    honest = [call("ta", both), call("tc", both), call("ta", decoy, (both,))]
    assert found(honest, both, decoy) == {}
    # its answer came back from the control's lane: never decoded on its own
    assert found([*honest, call("tc", took, (both,))], both, took) == {"agent": {"foreign_answer": 1}}
    # its history, with a reply decoded for it alone, sent down the control's lane
    assert found([*honest, call("tc", "ok", (both, decoy))], both, decoy) == {"b0": {"foreign_history": 1}}
    # the same text decoded for both (the turns before the forget) is each one's own; short texts tell nothing
    assert found([*honest, call("tc", "ok", (both,)), call("tc", "Fine.")], both, decoy, "Fine.") == {}


def test_a_turn_that_reached_the_model_only_on_another_tenants_lane_is_tampering() -> None:
    """An agent that answers its tenant's turn from a call down the positive control's lane, and rewords
    the answer so it is not the decoded text, leaves its own lane without the turn: ``unheard_turn``.
    Honest: the turn on its own lane; answered without the model; the control's own call while it answers
    the same turn itself (tenants driven alike); a call that ended before the turn was sent (the tenant
    driven before it, whose probes carry the whole history)."""
    from eu_audit.blackbox.tamper import Tenant, UserTurn, find_tampering
    from eu_audit.matching import TargetMatcher

    z = TargetMatcher.of("12 Linden Street")
    turn = "Please book the dentist for next Tuesday morning."

    def found(calls: list[tuple[str, float, str]], control_at: tuple[float, float] | None = None) -> dict:
        mine = Tenant("s0", "agent", z, turns=[UserTurn(100.0, 110.0, turn, True)])
        control = Tenant("s0", "b0", z, turns=[UserTurn(*control_at, turn, True)] if control_at else [])
        entries = [
            logged(
                endpoint="/v1/chat/completions",
                status=200,
                time=when,
                mark={"key": "k", "tenant": tenant, "phase": "future"},
                messages=[{"role": "user", "content": text}],
            )
            for tenant, when, text in calls
        ]
        tenants = {"ta": mine, "tc": control}
        got = find_tampering(entries, key="k", sent=set(), tenants=tenants, lanes={}, first=("s0", "agent"))
        return {w[1]: kinds for w, kinds in got.counts.items()}

    assert found([("tc", 105.0, turn)]) == {"agent": {"unheard_turn": 1}}  # down the control's lane only
    # folded as the matcher folds: a space or a case changed is still the turn
    assert found([("tc", 105.0, turn.upper().replace(" ", "  "))]) == {"agent": {"unheard_turn": 1}}
    assert found([("ta", 105.0, turn), ("tc", 106.0, turn)]) == {}  # both lanes: tenants driven alike
    assert found([("ta", 105.0, f"Earlier: hi. Now: {turn}")]) == {}  # its own lane, in a longer prompt
    assert found([]) == {}  # answered without the model, and no lane carried it
    assert found([("tc", 105.0, turn)], control_at=(104.0, 108.0)) == {}  # the control's own, same turn
    assert found([("tc", 99.5, turn)]) == {}  # ended before the turn was sent: the tenant driven before
    assert found([("tc", 150.0, turn)]) == {}  # the control's own turn, long after this one was answered


def test_eu_audits_own_agent_tokenizes_with_the_model_serve_runs_and_refuses_another(serve: str) -> None:
    """Token-id prompts carry no words: an agent tokenizing with another model's tokenizer would send serve
    other words, silently (the B7 agent on Qwen once sent SmolLM2 ids, and its control never said z). By
    default it takes the model serve lists; another one named is refused before it serves anything."""
    from eu_audit.engines.served import served_model
    from eu_audit.models import FAST_MODEL

    assert served_model(serve) == TINY_MODEL
    proc = run_cli("agent", "--serve", serve, "--model", FAST_MODEL, "--port", "9")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"serves {TINY_MODEL}" in proc.stderr and f"--model {TINY_MODEL}" in proc.stderr
    with cli_server("agent", "--serve", serve) as agent:  # serve's own model: it starts and answers
        got = json.loads(urllib.request.urlopen(agent + "/eu-audit/v1/capabilities").read())
        assert "eu-audit reference agent" in got["name"]
