"""The harness's hold on ``eu-audit serve``: marks, pinned decoding, the log.

Every control call carries the run's secret and the harness's running number for it
(``eu_audit.serve.control.CALL_HEADER``); the numbers it sent are kept, so the log can later show a control
call the harness never made (``eu_audit.blackbox.tamper``).
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from eu_audit.errors import BadInput, RunFailed
from eu_audit.http import HttpFailure, request_json
from eu_audit.serve.api import DecodingRequest, LogEntry, Mark, MarkRequest
from eu_audit.serve.control import (
    CALL_HEADER,
    CONTROL_HEADER,
    DECODING_ROUTE,
    INFO_ROUTE,
    LOG_ROUTE,
    MARK_ROUTE,
    control_file_for,
    key_id,
    read_control_file,
)


class CallNumbers:
    """The numbers of the control calls this harness sent, shared by every lane of one run."""

    def __init__(self) -> None:
        self.run = secrets.token_hex(4)  # so two runs' numbers never look alike in one log
        self._next = itertools.count(1)
        self._lock = threading.Lock()
        self.sent: set[str] = set()

    def take(self) -> str:
        with self._lock:
            number = f"{self.run}-{next(self._next)}"
            self.sent.add(number)
            return number


class ServeControl:
    """Marks, pinned decoding and the log of one lane of serve (the root lane when ``lane`` is None). The
    agent under test never has the secret."""

    def __init__(
        self, url: str | None, secret: str = "", lane: str | None = None, numbers: CallNumbers | None = None
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.secret = secret
        self.key = key_id(secret) if secret else ""
        self.lane = lane  # None: the root lane, every model call of a run driven one tenant at a time
        self.numbers = numbers or CallNumbers()
        #: a lane that also marks and pins serve's root URL (one tenant at a time): a call the agent sends to
        #: the root (a store's shared embedder) is still this tenant's, by the mark
        self.mirror = False

    @classmethod
    def open(cls, url: str | None, control_file: Path | None) -> ServeControl:
        """The hold on serve at ``url`` with the secret from ``control_file`` (default: where serve writes
        it for that port)."""
        if url is None:
            return cls(None)
        return cls(url, read_control_file(control_file or control_file_for(url)))

    def _call(self, path: str, body: Any = None) -> Any:
        """One control call (the secret and the next running number on it); ``body`` a request model of
        ``serve.api`` (the shape serve validates), or None for a GET."""
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        if self.url is None:
            return None
        try:
            return request_json(
                self.url + path,
                "POST" if body is not None else "GET",
                body,
                timeout=60,
                headers={CONTROL_HEADER: self.secret, CALL_HEADER: self.numbers.take()},
                max_bytes=1 << 30,  # the log: every prompt of the run
            )
        except HttpFailure as exc:
            raise RunFailed(f"eu-audit serve at {self.url}: {exc}") from None

    def info(self) -> dict[str, Any]:
        if self.url is None:
            return {}
        try:
            got = dict(request_json(self.url + INFO_ROUTE, timeout=60))
        except HttpFailure as exc:
            raise BadInput(f"--serve {self.url} is not an eu-audit serve that answers: {exc}") from None
        if got.get("control_key") != self.key:
            raise BadInput(
                f"--serve-control: this secret (key {self.key}) is not the one {self.url} was started with "
                f"(key {got.get('control_key')}); give the --control-file that serve wrote"
            )
        return got

    def _lanes(self) -> list[str | None]:
        return [self.lane, None] if self.mirror and self.lane is not None else [self.lane]

    def mark(self, **tag: Any) -> None:
        """The calls that follow belong to this tenant and phase (``serve.api.Mark``'s fields)."""
        for lane in self._lanes():
            self._call(MARK_ROUTE, MarkRequest(tag=Mark(**tag), lane=lane))

    def unmark(self) -> None:
        """Calls from now on belong to no tenant (a tenant's run is over)."""
        for lane in self._lanes():
            self._call(MARK_ROUTE, MarkRequest(tag=None, lane=lane))

    def greedy(self) -> None:
        for lane in self._lanes():
            self._call(DECODING_ROUTE, DecodingRequest(mode="greedy", temperature=0.0, seed=None, lane=lane))

    def sampled(self, temperature: float, seed: int) -> None:
        for lane in self._lanes():
            self._call(
                DECODING_ROUTE, DecodingRequest(mode="sampled", temperature=temperature, seed=seed, lane=lane)
            )

    def for_tenant(self, *, mirror: bool = False) -> ServeControl:
        """A fresh lane of serve for one tenant (its own marks and pinned decoding): the agent is told to
        send that tenant's model calls to ``model_base_url``, so calls of tenants driven at the same time
        are told apart by where they arrive. ``mirror`` (one tenant at a time): the root URL is marked and
        pinned the same way, so a call the agent sends there anyway is still attributed to the tenant."""
        lane = ServeControl(self.url, self.secret, secrets.token_hex(16), self.numbers)
        lane.mirror = mirror
        return lane

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """serve's own embeddings of ``texts``, asked on a lane of the harness's own, marked "forensics"
        (no tenant's: the calls count for no tenant and no tamper rule)."""
        if self.url is None:
            raise RunFailed("no serve to embed with")
        lane = ServeControl(self.url, self.secret, secrets.token_hex(16), self.numbers)
        lane.mark(tenant="", phase="forensics")
        try:
            got = request_json(
                f"{self.url}/lanes/{lane.lane}/v1/embeddings", "POST", {"input": list(texts)}, timeout=120
            )
        except HttpFailure as exc:
            raise RunFailed(f"eu-audit serve at {self.url}: {exc}") from None
        finally:
            lane.unmark()
        return [list(map(float, d["embedding"])) for d in got.get("data", [])]

    @property
    def model_base_url(self) -> str | None:
        if self.url is None or self.lane is None:
            return None
        return f"{self.url}/lanes/{self.lane}/v1"

    def log(self, since: int = 0) -> tuple[list[LogEntry], str]:
        """serve's log from entry ``since`` on, each entry read as serve wrote it (``LogEntry``: one
        definition on both sides), and the digest of the whole log."""
        got = self._call(f"{LOG_ROUTE}?since={since}")
        if not got:
            return [], ""
        try:
            entries = [LogEntry.model_validate(e) for e in got.get("entries", [])]
        except ValidationError as exc:
            raise RunFailed(
                f"eu-audit serve at {self.url}: its log is not in the shape this eu-audit reads "
                f"(a serve of another version?): {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
            ) from None
        return entries, str(got.get("digest", ""))

    def position(self) -> int:
        """How many entries serve's log holds now (a run's own entries start there)."""
        got = self._call(f"{LOG_ROUTE}?since=1000000000")
        return int(got.get("total", 0)) if got else 0
