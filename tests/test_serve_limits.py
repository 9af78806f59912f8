"""`eu-audit serve` answers only the harness on its control surface and bounds every request.

The agent under test shares the model server with the harness, so it must not be able to mark its own
prompts, change decoding or read the log; and no request it sends (wrong types, a huge ``max_tokens``, a
prompt past the context, a 50 MB body, a client that leaves) may crash the server, block it past the
request's deadline or go unlogged. Real HTTP on loopback, the tiny random model (mechanics only).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from eu_audit.blackbox.adapter import Bounds
from eu_audit.blackbox.drive import AgentRecordOptions, record_agent
from eu_audit.engines.llamacpp_server import free_port
from eu_audit.http import TimedOut, request_json
from eu_audit.models import TINY_MODEL

from . import scripted_agents
from .helpers import cli_server, run_cli

CONTROL = "X-EU-Audit-Control"


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str]]:
    """(URL, its log, the control secret): the tiny model, small caps so each limit shows in a second."""
    folder = tmp_path_factory.mktemp("serve")
    log, control = folder / "serve.jsonl", folder / "serve.control"
    args = [
        "serve",
        "--model",
        TINY_MODEL,
        "--engine",
        "hf",
        "--log",
        str(log),
        "--control-file",
        str(control),
    ]
    args += ["--max-body-mb", "0.5", "--request-timeout", "4", "--no-repetition-guard"]  # long decodes
    with cli_server(*args) as url:
        yield url, log, control.read_text().strip()


def call(
    url: str, path: str, body: Any = None, raw: bytes | None = None, secret: str = ""
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json", **({CONTROL: secret} if secret else {})}
    req = urllib.request.Request(url + path, data, headers, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


HI = [{"role": "user", "content": "hi"}]


def test_an_agent_cannot_mark_its_own_prompts_change_decoding_or_read_the_log(
    serve: tuple[str, Path, str],
) -> None:
    url, log, secret = serve
    verbs = [
        ("/eu-audit/v1/mark", {"tag": {"tenant": "forged", "phase": "stream"}}),
        ("/eu-audit/v1/decoding", {"mode": "agent"}),
        ("/eu-audit/v1/log", None),
    ]
    for path, body in verbs:
        for wrong in ("", "0" * 64, secret[:-1]):
            status, got = call(url, path, body, secret=wrong)
            assert status == 403, (path, wrong, got)
    refused = [e for e in entries(log) if e["status"] == 403]
    assert len(refused) == 9  # every refused control call is in the log
    status, _ = call(url, "/eu-audit/v1/mark", {"tag": {"tenant": "s", "phase": "probe"}}, secret=secret)
    assert status == 200
    call(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 2})
    marked = entries(log)[-1]["mark"]
    assert marked["tenant"] == "s" and marked["key"] == call(url, "/eu-audit/v1/info")[1]["control_key"]
    call(url, "/eu-audit/v1/mark", {"tag": None}, secret=secret)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": "hello"}, "messages"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": "abc"}, "max_tokens"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 0}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, "messages.0.content"),
        ("/v1/chat/completions", {"messages": HI, "temperature": "hot"}, "temperature"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": HI, "tools": "all"}, "tools"),
        ("/v1/completions", {"prompt": [10**9]}, "vocabulary"),
        ("/v1/completions", {"prompt": [1, 2], "segments": [5]}, "segments"),
        ("/v1/completions", {"prompt": {"a": 1}}, "prompt"),
        ("/v1/embeddings", {"input": [1, 2]}, "input"),
        ("/eu-audit/v1/decoding", {"mode": "sampled", "temperature": 1.0, "seed": "abc"}, "seed"),
        ("/eu-audit/v1/decoding", {"mode": "sampled", "temperature": 1.0}, "seed"),
        ("/eu-audit/v1/mark", {"tag": {"tenant": "s", "phase": "whenever"}}, "tag.phase"),
    ],
)
def test_a_wrong_typed_request_is_a_400_naming_the_field_never_a_500(
    serve: tuple[str, Path, str], path: str, body: dict[str, Any], field: str
) -> None:
    url, _, secret = serve
    status, got = call(url, path, body, secret=secret if path.startswith("/eu-audit") else "")
    assert status == 400, got
    assert field in got["error"]["message"], got
    # and the pinned decoding is still greedy: a refused setting is never half applied
    assert call(url, "/eu-audit/v1/decoding", {"mode": "greedy"}, secret=secret)[0] == 200


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate, escaped
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # an encoded surrogate, raw bytes
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    ],
)
def test_a_body_that_is_not_a_request_is_a_400(serve: tuple[str, Path, str], raw: bytes) -> None:
    status, got = call(serve[0], "/v1/chat/completions", raw=raw)
    assert status == 400, got


def test_max_tokens_is_capped_by_the_context_and_a_prompt_past_it_is_refused(
    serve: tuple[str, Path, str],
) -> None:
    url, _, _ = serve
    # six tokens of room: the cap shows in the count, and the decode ends well inside the 4 s deadline even
    # on a loaded machine (96 tokens of room once ran past it beside a model job)
    status, got = call(url, "/v1/completions", {"prompt": [1] * 4090, "max_tokens": 10**9})
    assert status == 200 and got["usage"]["completion_tokens"] <= 4096 - 4090, got
    status, got = call(url, "/v1/completions", {"prompt": [1] * 4096, "max_tokens": 1})
    assert status == 400 and "context holds 4096" in got["error"]["message"]


def test_a_request_that_names_no_max_tokens_gets_the_documented_budget_and_the_log_says_where_it_ended(
    tmp_path: Path,
) -> None:
    from eu_audit.serve.api import UNASKED_CHAT_TOKENS, UNASKED_COMPLETION_TOKENS

    log = tmp_path / "serve.jsonl"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(log), "--no-repetition-guard"]
    with cli_server(*args, "--control-file", str(tmp_path / "c")) as url:
        for path, body, budget in (
            ("/v1/chat/completions", {"messages": HI}, UNASKED_CHAT_TOKENS),
            ("/v1/completions", {"prompt": "Once upon a time"}, UNASKED_COMPLETION_TOKENS),
        ):
            status, got = call(url, path, body)
            assert status == 200, got
            used, last = got["usage"]["completion_tokens"], entries(log)[-1]
            # the random model rarely writes its end token: it runs to the budget, and both say "length"
            assert used <= budget and (used < budget or got["choices"][0]["finish_reason"] == "length")
            assert last["finish"] == ("length" if used == budget else "stop")


def test_a_body_over_the_cap_is_refused_before_it_is_read_whole(serve: tuple[str, Path, str]) -> None:
    url, log, _ = serve
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (1 << 20)}]}).encode()
    try:
        status, got = call(url, "/v1/chat/completions", raw=big)
        assert status == 413, got
    except urllib.error.URLError as exc:  # refused while the client was still sending
        assert isinstance(exc.reason, BrokenPipeError | ConnectionResetError), exc
    time.sleep(0.2)
    assert entries(log)[-1]["status"] == 413


def test_every_request_is_logged_failed_ones_too(serve: tuple[str, Path, str]) -> None:
    url, log, _ = serve
    before = len(entries(log))
    call(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 1})
    call(url, "/v1/chat/completions", {"messages": "nope"})
    call(url, "/v1/chat/completions", raw=b"{")
    new = entries(log)[before:]
    assert [e["status"] for e in new] == [200, 400, 400]
    assert "nope" in new[1]["body_excerpt"] and new[1]["error"]


def test_a_client_that_leaves_stops_its_decoding_and_a_slow_request_never_blocks_past_its_deadline(
    serve: tuple[str, Path, str],
) -> None:
    url, log, _ = serve
    body = json.dumps({"messages": HI, "max_tokens": 4000}).encode()
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.5)
    time.sleep(1.0)
    gone = entries(log)[-1]
    assert gone["status"] == 499 and gone["ms"] < 4000, gone  # a whole 4000-token decode takes ~10 s
    # a request past its deadline (4 s here) ends there, and the next one is answered
    t0 = time.monotonic()
    status, got = call(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 4000})
    assert status in (200, 504), got  # 504 when this machine decodes fewer than ~1000 tokens/s
    assert time.monotonic() - t0 < 6
    assert call(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 1})[0] == 200


def test_the_log_is_never_written_through_a_symlink_nor_over_a_file_without_force(tmp_path: Path) -> None:
    existing = tmp_path / "old.jsonl"
    existing.write_text("keep me\n")
    existing.chmod(0o644)
    proc = run_cli("serve", "--model", TINY_MODEL, "--log", str(existing), "--port", str(free_port()))
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert existing.read_text() == "keep me\n"
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    proc = run_cli("serve", "--model", TINY_MODEL, "--log", str(link), "--port", str(free_port()), "--force")
    assert proc.returncode == 2 and not (tmp_path / "elsewhere.jsonl").exists()


def test_sigterm_stops_a_decoding_server_at_once(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "eu_audit.cli", "serve", "--model", TINY_MODEL, "--engine", "hf"]
    argv += ["--control-file", str(tmp_path / "c"), "--max-tokens", "4000", "--no-repetition-guard"]
    port = free_port()
    proc = subprocess.Popen(
        [*argv, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while call_quiet(url + "/health") is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.3)
        body = {"messages": HI, "max_tokens": 4000}
        threading.Thread(target=call_quiet, args=(url + "/v1/chat/completions", body), daemon=True).start()
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - t0 < 8
    finally:
        if proc.poll() is None:
            proc.kill()


def call_quiet(url: str, body: Any = None) -> Any:
    try:
        return request_json(url, "POST" if body is not None else "GET", body, timeout=30)
    except Exception:
        return None


class _Upstream(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        self._send(200, {"data": [{"id": "upstream-model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        if body["messages"][0]["content"] == "fail":
            self._send(401, {"error": "invalid api key sk-secret-123 for org acme"})
        else:
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": "ok"}}], "usage": {}})

    def _send(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_proxy_mode_forwards_only_allowed_fields_and_never_echoes_the_upstreams_error(tmp_path: Path) -> None:
    httpd = HTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with cli_server("serve", "--upstream", upstream, "--control-file", str(tmp_path / "c")) as url:
            refused = call(url, "/v1/chat/completions", {"messages": HI, "api_key": "sk-mine"})
            body = {
                "messages": HI,
                "user": "alice",
                "temperature": 1.5,
                "max_tokens": 5,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "v", "schema": VERDICT_SCHEMA},
                },
            }
            assert call(url, "/v1/chat/completions", body)[0] == 200
            status, got = call(
                url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "fail"}]}
            )
    finally:
        httpd.shutdown()
    # a field serve does not take is refused (never forwarded, never silently dropped)
    assert refused[0] == 400 and "field 'api_key'" in refused[1]["error"]["message"]
    sent = _Upstream.seen[0]
    assert len(_Upstream.seen) == 2 and "user" not in sent and sent["max_tokens"] == 5
    assert sent["temperature"] == 0.0  # the pin, not the client
    assert sent["response_format"]["json_schema"]["schema"] == VERDICT_SCHEMA  # as the client wrote it
    assert status == 502 and "sk-secret" not in json.dumps(got) and "401" in got["error"]["message"]


def test_proxy_mode_answers_the_responses_and_messages_apis_through_the_upstreams_chat(
    tmp_path: Path,
) -> None:
    """An agent on the Responses or the Messages API is gated against an upstream model too: its request is
    forwarded as the chat request it means (pinned decoding, logged in the chat shape) and the upstream's
    chat answer comes back in the agent's API's shape."""
    httpd = HTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{httpd.server_address[1]}"
    _Upstream.seen.clear()
    log = tmp_path / "log.jsonl"
    try:
        with cli_server(
            "serve", "--upstream", upstream, "--control-file", str(tmp_path / "c"), "--log", str(log)
        ) as url:
            said = {"model": "m", "max_tokens": 5, "system": "be brief", "messages": HI}
            msg = call(url, "/v1/messages", said)
            resp = call(url, "/v1/responses", {"model": "m", "instructions": "be brief", "input": "hello"})
    finally:
        httpd.shutdown()
    assert msg[0] == 200 and msg[1]["type"] == "message" and msg[1]["content"][0]["text"] == "ok", msg
    assert resp[0] == 200 and resp[1]["output"][0]["content"][0]["text"] == "ok", resp
    sent = _Upstream.seen
    assert [m["role"] for m in sent[0]["messages"]] == ["system", "user"]
    assert sent[0]["messages"][0]["content"] == "be brief" and sent[0]["temperature"] == 0.0
    assert sent[1]["messages"][-1]["content"] == "hello"
    logged = [json.loads(x) for x in log.read_text().splitlines()]
    assert [e["endpoint"] for e in logged if e.get("reply")] == ["/v1/messages", "/v1/responses"]


class _Anthropic(BaseHTTPRequestHandler):
    """An Anthropic-compatible upstream: lists one model and answers every message with a text and a
    ``tool_use`` block, keeping what it was sent (headers and body)."""

    seen: ClassVar[list[tuple[dict[str, str], dict[str, Any]]]] = []

    def do_GET(self) -> None:
        self.seen.append((dict(self.headers), {}))
        _Upstream._send(self, 200, {"data": [{"id": "claude-upstream"}]})  # type: ignore[arg-type]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((dict(self.headers), body))
        if self.path != "/v1/messages":
            _Upstream._send(self, 404, {"error": "no such route"})  # type: ignore[arg-type]
            return
        answer = {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-upstream",
            "content": [
                {"type": "text", "text": "Booking it."},
                {"type": "tool_use", "id": "toolu_1", "name": "book", "input": {"day": "Tuesday"}},
            ],
            "stop_reason": "tool_use", "usage": {"input_tokens": 12, "output_tokens": 7},
        }  # fmt: skip
        _Upstream._send(self, 200, answer)  # type: ignore[arg-type]

    def log_message(self, *args: object) -> None:
        pass


def test_proxy_mode_speaks_the_messages_api_to_an_anthropic_compatible_upstream_with_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve --upstream URL --upstream-api messages``: a chat request (tools, a tool call and its result
    in the history) reaches the upstream as the Messages request it means, under the pinned decoding, with
    the key from the environment in Anthropic's header; its answer comes back as a chat completion; the
    key is in no log; an endpoint the Messages API lacks is a 400 naming it."""
    from eu_audit.serve.upstream import KEY_ENV, Upstream

    key = "sk-ant-test-4242"
    monkeypatch.setenv(KEY_ENV, key)
    assert Upstream("http://x", "chat").headers() == {"Authorization": f"Bearer {key}"}
    httpd = HTTPServer(("127.0.0.1", 0), _Anthropic)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{httpd.server_address[1]}"
    _Anthropic.seen.clear()
    log = tmp_path / "log.jsonl"
    tool = {"type": "function", "function": {"name": "book", "description": "book a slot",
            "parameters": {"type": "object", "properties": {"day": {"type": "string"}}}}}  # fmt: skip
    history = [
        {"role": "system", "content": "You book appointments."},
        {"role": "user", "content": "Book the dentist."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "book", "arguments": "{\"day\": \"Monday\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Monday is full"},
        {"role": "user", "content": "Then Tuesday."},
    ]  # fmt: skip
    try:
        with cli_server(
            "serve", "--upstream", upstream, "--upstream-api", "messages",
            "--control-file", str(tmp_path / "c"), "--log", str(log),
        ) as url:  # fmt: skip
            chat = call(
                url, "/v1/chat/completions", {"messages": history, "tools": [tool], "temperature": 1.2}
            )
            said = call(url, "/v1/messages", {"model": "m", "max_tokens": 9, "messages": HI})
            embed = call(url, "/v1/embeddings", {"input": "hi"})
    finally:
        httpd.shutdown()
    headers, sent = _Anthropic.seen[1]
    assert headers.get("x-api-key") == key and headers.get("anthropic-version")
    assert "Authorization" not in headers
    assert sent["system"] == "You book appointments." and sent["temperature"] == 0.0  # the pin, not 1.2
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]  # roles alternate
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "c1", "name": "book", "input": {"day": "Monday"}}
    ]
    result, again = sent["messages"][2]["content"]
    assert result == {"type": "tool_result", "tool_use_id": "c1", "content": "Monday is full"}
    assert again == {"type": "text", "text": "Then Tuesday."}
    assert sent["tools"][0]["name"] == "book" and sent["tools"][0]["input_schema"]["properties"]["day"]
    assert chat[0] == 200, chat
    choice = chat[1]["choices"][0]
    assert choice["message"]["content"] == "Booking it." and choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"day": "Tuesday"}
    assert said[0] == 200 and said[1]["content"][0]["text"] == "Booking it.", said
    assert embed[0] == 400 and "/v1/embeddings" in embed[1]["error"]["message"]
    assert key not in log.read_text()


def test_a_whole_call_deadline_holds_against_an_answer_dripped_a_byte_at_a_time() -> None:
    class Drip(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(TimedOut):
        request_json(f"http://127.0.0.1:{httpd.server_address[1]}/", timeout=1.0)
    assert time.monotonic() - t0 < 2
    httpd.shutdown()


def test_an_agent_that_forges_marks_still_has_its_post_forget_prompts_counted(
    serve: tuple[str, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _, secret = serve
    control = tmp_path / "control"
    control.write_text(secret)
    monkeypatch.setenv("EU_AUDIT_TEST_SERVE", url)
    opts = AgentRecordOptions(
        agent="tests.scripted_agents:forging",
        serve=url,
        serve_control=control,
        suite="builtin",
        n=1,
        k=1,
        out=tmp_path / "bb.jsonl",
        bounds=Bounds(call_s=60),
    )
    bundle, _ = record_agent(opts)
    forger = scripted_agents.AGENTS[-1]
    assert forger.attempts and set(forger.attempts) == {403}
    agent = next(s for s in bundle.sessions if s.session.method == "agent")
    residue = agent.residues[0]
    # it deleted nothing: every call after the forget still carries z, forged marks or not
    assert residue.context_calls and residue.context_calls_with_z == residue.context_calls
    assert bundle.header.engine_facts["serve_control_key"] == call(url, "/eu-audit/v1/info")[1]["control_key"]
    os.chmod(control, 0o600)
    # every refused attempt is a finding, counted per tenant, and fails the gate whatever else held
    tried = {  # eu-audit's own floor is driven by eu-audit, not by the forger
        s.session.method: s.residues[0].tamper for s in bundle.sessions if s.session.method != "own-floor"
    }
    assert all(t.get("control_refused", 0) >= 4 for t in tried.values()), tried
    from eu_audit.audit import AuditOptions, audit
    from eu_audit.audits.gate import evaluate

    report = audit(tmp_path / "bb.jsonl", AuditOptions())
    assert {t.tenant for t in report.tampering} == {"agent", "b5", "b0"}
    gates = {g.rule: g for g in evaluate(report, ["agent.residue_store==0"])}
    assert gates["no tampering"].outcome == "failed" and "without the secret" in gates["no tampering"].detail


def test_a_loop_no_agent_asked_for_is_stopped_and_logged_as_repetition() -> None:
    from eu_audit.serve import runaway

    assert runaway([5, 6, 7] * 20)  # a 3-token pattern, 60 tokens
    assert runaway([9] * 48) and not runaway([9] * 47)  # at least 48 tokens of it
    assert not runaway(list(range(200)))  # an answer that moves on
    assert not runaway([1, 2, 3] * 10 + list(range(50, 70)))  # a repeat that ended


def test_the_tiny_model_looping_under_greedy_decoding_is_cut_by_the_guard(tmp_path: Path) -> None:
    log = tmp_path / "serve.jsonl"
    args = ["serve", "--model", TINY_MODEL, "--engine", "hf", "--log", str(log)]
    with cli_server(*args, "--control-file", str(tmp_path / "c")) as url:  # the guard is on by default
        status, got = call(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 900})
    assert status == 200 and got["choices"][0]["finish_reason"] in ("length", "stop")
    last = entries(log)[-1]
    # the random model repeats itself long before 900 tokens; the guard ends it and says why
    assert last["finish"] == "repetition" and last["usage"]["completion_tokens"] < 900, last["usage"]


TAXI = [{"type": "function", "function": {"name": "book_taxi", "parameters": {"properties": {"to": {}}}}}]


def test_a_tool_call_the_request_requires_is_opened_for_the_model_and_a_choice_it_cannot_meet_is_a_400(
    serve: tuple[str, Path, str],
) -> None:
    """OpenAI's ``tool_choice``: a named function is called (even by the random tiny model, whose reply
    then holds that call), the choice is logged, and a choice the tools cannot meet is refused."""
    url, log, _ = serve
    named = {"type": "function", "function": {"name": "book_taxi"}}
    body = {"model": "m", "max_tokens": 6, "messages": HI, "tools": TAXI, "tool_choice": named}
    status, got = call(url, "/v1/chat/completions", body)
    assert status == 200, got
    calls = got["choices"][0]["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "book_taxi"
    assert got["choices"][0]["finish_reason"] == "tool_calls"
    assert entries(log)[-1]["tool_choice"] == "book_taxi"
    for choice, said in (
        ({"type": "function", "function": {"name": "fly"}}, "'fly' is not among the request's tools"),
        ("always", "is not auto, none, required or a function"),
    ):
        status, got = call(url, "/v1/chat/completions", {**body, "tool_choice": choice})
        assert (
            status == 400 and "tool_choice" in got["error"]["message"] and said in got["error"]["message"]
        ), got
    no_tools = {"model": "m", "max_tokens": 2, "messages": HI, "tool_choice": "required"}
    status, got = call(url, "/v1/chat/completions", no_tools)
    assert status == 400 and "has no tools" in got["error"]["message"], got


def test_a_required_call_names_one_of_the_offered_functions_whatever_the_model_begins(
    serve: tuple[str, Path, str],
) -> None:
    """``tool_choice: "required"`` promises a call to one of the request's functions (Letta's loop
    refuses a turn without one): the random tiny model begins no offered name, and its reply still calls
    one; the log keeps what it began and what it was given."""
    url, log, _ = serve
    two = [*TAXI, {"type": "function", "function": {"name": "send_message", "parameters": {}}}]
    body = {"model": "m", "max_tokens": 6, "messages": HI, "tools": two, "tool_choice": "required"}
    status, got = call(url, "/v1/chat/completions", body)
    assert status == 200, got
    calls = got["choices"][0]["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] in {"book_taxi", "send_message"}
    last = entries(log)[-1]
    assert last["tool_choice"] == "required"
    assert last["named_call"]["named"] == calls[0]["function"]["name"]
    # a prompt the server never saw reuses nothing, though its naming pass left its prefix in the cache
    # for the arguments' pass: usage counts what the request found, not what it prefilled itself
    fresh = [{"role": "system", "content": "Tools first. " * 12 + url}, *HI]
    status, got = call(url, "/v1/chat/completions", {**body, "messages": fresh})
    assert status == 200 and got["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, got["usage"]
    status, again = call(url, "/v1/chat/completions", {**body, "messages": fresh})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt again: its prefix


@pytest.mark.parametrize(
    ("began", "named"),
    [
        ("send_message", "send_message"),  # a name it finished
        ('send_message", "argu', "send_message"),
        ("send_mess", "send_message"),  # cut off: the offered name it began
        ("conversation_sea", "conversation_search"),
        ("apple-3-1-2-2-3-00", "send_message"),  # begins none: the first offered
        ("", "send_message"),
    ],
)
def test_a_forced_call_is_given_the_offered_name_the_model_began(began: str, named: str) -> None:
    from eu_audit.serve.chat_segments import offered_name, still_naming

    names = ["send_message", "conversation_search", "core_memory_append"]
    assert offered_name(began, names) == named
    assert still_naming("send_", names) and not still_naming("apple", names)
    assert not still_naming('send_message"', names)  # the name closed


def test_serve_never_answers_a_call_whose_name_it_would_refuse_when_echoed_back() -> None:
    """A sampled small model can write a 'function name' of hundreds of characters; sent back in the
    conversation, a request carrying it is refused (the name's bound). So it is not returned as a call."""
    from eu_audit.serve.api import MAX_FUNCTION_NAME
    from eu_audit.serve.chat_segments import split_reply

    fine = '<tool_call>{"name": "book_taxi", "arguments": {"to": "x"}}</tool_call>'
    long = '<tool_call>{"name": "' + "I am a tool_" * 40 + '", "arguments": {}}</tool_call>'
    assert [c["function"]["name"] for c in split_reply(fine)[1]] == ["book_taxi"]
    content, calls = split_reply(long)
    assert calls == [] and len("I am a tool_" * 40) > MAX_FUNCTION_NAME and "I am a tool_" in content


#: a schema a random model can complete in a few tokens: every key required, each value from a short set
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {"held": {"type": "boolean"}, "n": {"enum": [1, 2, 30]}},
    "required": ["held", "n"],
    "additionalProperties": False,
}


def test_a_reply_asked_for_json_matching_a_schema_matches_it_even_from_a_random_model(
    serve: tuple[str, Path, str],
) -> None:
    """``response_format`` as llama.cpp's server and vLLM honour it: a memory library that asks for JSON
    (Graphiti's extraction, mem0's) gets JSON, whatever the model would have written. The random tiny
    model writes noise unconstrained; held to the schema, every seed's reply parses and matches it."""
    url, log, _ = serve
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT_SCHEMA}}
    body = {"model": "m", "max_tokens": 40, "messages": HI, "response_format": fmt}
    for seed in range(3):
        status, got = call(url, "/v1/chat/completions", {**body, "temperature": 1.0, "seed": seed})
        assert status == 200, got
        reply = json.loads(got["choices"][0]["message"]["content"])
        assert set(reply) == {"held", "n"} and isinstance(reply["held"], bool) and reply["n"] in (1, 2, 30)
        assert got["choices"][0]["finish_reason"] == "stop"
        assert entries(log)[-1]["held_to"] == "json_schema verdict"
    status, got = call(url, "/v1/chat/completions", {**body, "response_format": {"type": "json_object"}})
    assert status == 200 and got["choices"][0]["message"]["content"].startswith("{"), got
    assert entries(log)[-1]["held_to"] == "json_object"


def test_a_json_format_with_tools_offered_is_not_enforced_and_the_log_says_so(
    serve: tuple[str, Path, str],
) -> None:
    """OpenAI's format binds a reply's content, not a call to an offered tool: with tools, the model may
    call one, so serve does not hold it to JSON, and its log does not claim it did."""
    url, log, _ = serve
    body = {"model": "m", "max_tokens": 4, "messages": HI, "tools": TAXI}
    status, got = call(url, "/v1/chat/completions", {**body, "response_format": {"type": "json_object"}})
    assert status == 200, got
    assert entries(log)[-1]["held_to"] == "json_object (not enforced: the request offers tools)"


@pytest.mark.parametrize(
    ("fmt", "said"),
    [
        ({"type": "json_schema"}, "response_format"),
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "nonsense"),
        ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nope"}}}, "/nope"),
    ],
)
def test_a_response_format_serve_cannot_hold_a_reply_to_is_a_400_naming_it(
    serve: tuple[str, Path, str], fmt: dict[str, Any], said: str
) -> None:
    url, _, _ = serve
    body = {"model": "m", "max_tokens": 4, "messages": HI, "response_format": fmt}
    status, got = call(url, "/v1/chat/completions", body)
    assert status == 400 and said in got["error"]["message"], got
    assert "response_format" in got["error"]["message"], got


def test_a_forced_calls_arguments_match_the_functions_parameters_even_from_a_random_model(
    serve: tuple[str, Path, str],
) -> None:
    """Letta refuses a call without its required argument ("send_message missing message argument"):
    under ``tool_choice`` the arguments are held to the function's ``parameters`` (OpenAI's strict calls,
    llama.cpp's server), so even the random tiny model's call carries every required argument, typed."""
    url, log, _ = serve
    params = {
        "type": "object",
        "properties": {"message": {"type": "string", "maxLength": 8}, "urgent": {"type": "boolean"}},
        "required": ["message", "urgent"],
        "additionalProperties": False,
    }
    send = [{"type": "function", "function": {"name": "send_message", "parameters": params}}]
    for choice in ("required", {"type": "function", "function": {"name": "send_message"}}):
        body = {"model": "m", "max_tokens": 60, "messages": HI, "tools": send, "tool_choice": choice}
        status, got = call(url, "/v1/chat/completions", body)
        assert status == 200, got
        (made,) = got["choices"][0]["message"]["tool_calls"]
        args = json.loads(made["function"]["arguments"])
        assert set(args) == {"message", "urgent"} and isinstance(args["urgent"], bool), args
        assert entries(log)[-1]["held_to"] == "arguments of send_message"
    # a schema serve cannot compile does not fail the request the client never asked serve to check
    odd = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    body = {"model": "m", "max_tokens": 4, "messages": HI, "tools": odd, "tool_choice": "required"}
    status, got = call(url, "/v1/chat/completions", body)
    assert status == 200, got
    held = entries(log)[-1]["held_to"]
    assert held.startswith("arguments of f (not enforced: field 'tools[0].function.parameters'"), held


def test_a_slow_loris_body_idle_sockets_and_a_client_that_leaves_mid_body_are_bounded_and_logged(
    tmp_path: Path,
) -> None:
    """serve --request-timeout 6: a body dripped in one byte at a time is answered 408 and its connection
    closed within 10 s; 100 connections that send nothing are closed too; a client that leaves mid-body is
    a 400 in the log. No traceback on serve's stderr for any of them."""
    port, log, err = free_port(), tmp_path / "serve.jsonl", tmp_path / "serve.err"
    argv = [sys.executable, "-m", "eu_audit.cli", "serve", "--model", TINY_MODEL, "--engine", "hf"]
    argv += [
        "--port",
        str(port),
        "--log",
        str(log),
        "--control-file",
        str(tmp_path / "c"),
        "--request-timeout",
        "6",
    ]
    with open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, stdout=stderr, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                request_json(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.3)
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        loris = socket.create_connection(("127.0.0.1", port))
        loris.sendall(head + b"Content-Length: 5000\r\n\r\n")
        loris.settimeout(0.2)
        t0, answer = time.monotonic(), b""
        while time.monotonic() - t0 < 15:
            try:
                loris.sendall(b" ")
            except OSError:
                break
            try:
                chunk = loris.recv(4096)
                if not chunk:
                    break
                answer += chunk
            except TimeoutError:
                pass
            time.sleep(0.3)
        cut = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408") and cut < 10, (answer[:200], cut)
        gone = socket.create_connection(("127.0.0.1", port))
        gone.sendall(head + b'Content-Length: 5000\r\n\r\n{"messages": [')
        gone.close()
        # past the idle bound (the request deadline, 6 s, here), counted from when they connected
        time.sleep(max(0.0, t0 + 7.5 - time.monotonic()))
        for s in idle:
            s.settimeout(1)
            assert s.recv(10) == b""  # closed by serve
            s.close()
        statuses = [json.loads(x)["status"] for x in log.read_text().splitlines()]
        assert 408 in statuses and 400 in statuses, statuses
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
