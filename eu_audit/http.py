"""A small JSON-over-HTTP client (stdlib: no event loop, safe to share across threads) for the servers
and agents eu-audit talks to. Failures are typed, so each caller turns them into its own clear message
and exit code (a model server that stops answering is a failed run; an agent that was never reachable
is a configuration mistake)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class HttpFailure(Exception):
    """Base: ``where`` is 'METHOD URL'."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class Unreachable(HttpFailure):
    """Nothing answers at the address (refused, unknown host)."""


class TimedOut(HttpFailure):
    pass


class HttpStatus(HttpFailure):
    def __init__(self, where: str, status: int, body: str) -> None:
        super().__init__(where, f"HTTP {status}: {body[:300]}")
        self.status, self.body = status, body


class NotJson(HttpFailure):
    pass


def request_json(
    url: str,
    method: str = "GET",
    body: Any = None,
    *,
    timeout: float = 600.0,
    headers: dict[str, str] | None = None,
) -> Any:
    """``method url`` with a JSON body; returns the decoded JSON answer (``{}`` for an empty one)."""
    where = f"{method} {url}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise HttpStatus(where, exc.code, exc.read().decode(errors="replace")) from None
    except TimeoutError as exc:
        raise TimedOut(where, f"no answer within {timeout:.0f} s ({exc})") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise TimedOut(where, f"no answer within {timeout:.0f} s") from None
        raise Unreachable(where, f"unreachable ({exc.reason})") from None
    except (ConnectionError, OSError) as exc:
        raise Unreachable(where, f"the connection failed ({exc})") from None
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise NotJson(where, f"the answer is not JSON: {raw[:200]!r}") from None
