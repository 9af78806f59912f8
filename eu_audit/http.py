"""A small JSON-over-HTTP client (stdlib: no event loop, safe to share across threads) for the servers
and agents eu-audit talks to. Failures are typed, so each caller turns them into its own clear message
and exit code (a model server that stops answering is a failed run; an agent that was never reachable
is a configuration mistake).

Every call is bounded: ``timeout`` is the wall time of the whole exchange (a watchdog closes the socket
when it passes, so a peer that drips its answer a byte at a time cannot stretch it), and ``max_bytes``
caps the answer's size (read no further than that).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any

DEFAULT_MAX_BYTES = 64 << 20


class HttpFailure(Exception):
    """Base: ``where`` is 'METHOD URL'."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class Unreachable(HttpFailure):
    """Nothing answers at the address (refused, unknown host)."""


class TimedOut(HttpFailure):
    pass


class TooLarge(HttpFailure):
    """The answer is larger than the caller allows."""


#: how much of a peer's error body a message quotes (the rest is the peer's own business, and may hold
#: what it was sent)
QUOTED_BODY = 160


class HttpStatus(HttpFailure):
    def __init__(self, where: str, status: int, body: str) -> None:
        quoted = " ".join(body.split())[:QUOTED_BODY]
        super().__init__(where, f"HTTP {status}: {quoted}{'...' if len(body) > QUOTED_BODY else ''}")
        self.status, self.body = status, body


class Redirected(HttpFailure):
    """The peer answered with a redirect: eu-audit follows none (a redirect could send the harness's
    calls, or its secret, anywhere), so the exchange failed."""


class NotJson(HttpFailure):
    pass


def _read_capped(resp: http.client.HTTPResponse, max_bytes: int, where: str) -> bytes:
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise TooLarge(where, f"the answer is {int(declared)} bytes, over the {max_bytes} allowed")
    chunks, size = [], 0
    while chunk := resp.read(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(where, f"the answer is over the {max_bytes} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)


def request_json(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    timeout: float = 600.0,
    headers: dict[str, str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Any:
    """``method url`` with a JSON body; returns the decoded JSON answer (``{}`` for an empty one)."""
    where = f"{method} {url}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unreachable(where, "not an http:// or https:// URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    expired = threading.Event()

    held: list[socket.socket] = []  # the connection's socket (http.client drops its own handle early)

    def cut() -> None:  # the deadline passed: end the exchange wherever it is
        expired.set()
        for sock in [*held, *([conn.sock] if conn.sock is not None else [])]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()
        held.append(conn.sock)
        conn.request(method, target, body=data, headers=sent)
        resp = conn.getresponse()
        raw = _read_capped(resp, max_bytes, where)
        status = resp.status
    except TooLarge:
        raise
    except TimeoutError:
        raise TimedOut(where, f"no answer within {timeout:.0f} s") from None
    except (http.client.HTTPException, OSError) as exc:
        if expired.is_set():
            raise TimedOut(where, f"no whole answer within {timeout:.0f} s") from None
        if isinstance(exc, ConnectionRefusedError | socket.gaierror):
            raise Unreachable(where, f"unreachable ({exc})") from None
        raise Unreachable(where, f"the connection failed ({exc})") from None
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():  # cut short at the deadline, even where the cut read looked like an end
        raise TimedOut(where, f"no whole answer within {timeout:.0f} s")
    if 300 <= status < 400:
        location = (resp.getheader("Location") or "")[:200]
        raise Redirected(
            where, f"answered a redirect (HTTP {status} to {location or 'nowhere'}); none is followed"
        )
    if status >= 400:
        raise HttpStatus(where, status, raw.decode(errors="replace"))
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise NotJson(where, f"the answer is not JSON: {raw[:200]!r}") from None
