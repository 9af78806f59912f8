"""The adapter seam: ``AgentUnderTest``, the Python form of the agent contract (``contract.py``), and the
adapters that reach an agent.

``--agent http://host:port`` speaks the JSON-over-HTTP contract (``HttpAgent``); ``--agent
module:factory`` calls ``factory()`` in the harness's process and uses what it returns (any object with
the protocol's methods). Register another kind with ``@ADAPTERS.register("scheme")`` on
``fn(spec) -> AgentUnderTest``; ``--agent scheme:...`` then reaches it.

Errors carry the contract's exit codes: an agent that cannot be reached at all, or that lacks a required
endpoint, is a configuration mistake (exit 2); an agent that fails, times out or answers nonsense in the
middle of an episode is a failed run (exit 3). The harness adds which episode and step it was driving.
"""

from __future__ import annotations

import importlib
import os
import queue
import threading
import urllib.parse
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from eu_audit.blackbox.contract import (
    API_VERSION,
    BY_OP,
    PREFIX,
    REQUIRED_OPS,
    Capabilities,
    ForgetReceipt,
    ForgetRequest,
    MemoryRecord,
    Message,
    OfferedTool,
    StartSession,
    StoreDump,
    StoreFiles,
    Turn,
)
from eu_audit.errors import BadInput, EuAuditError, RunFailed
from eu_audit.http import HttpFailure, HttpStatus, TimedOut, TooLarge, Unreachable, request_json
from eu_audit.registry import Registry

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
TIMEOUT_ENV = "EU_AUDIT_AGENT_TIMEOUT"  # seconds an agent call may take, whole (default 300)


def _default_call_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    try:
        return float(raw) if raw else 300.0
    except ValueError:
        raise BadInput(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None


@dataclass(frozen=True)
class Bounds:
    """What the agent under test may cost the harness: wall time per call (the whole call, not per
    read), bytes per answer, bytes in the bundle its run writes."""

    call_s: float = field(default_factory=_default_call_s)
    response_bytes: int = 4 << 20
    bundle_bytes: int = 512 << 20


@runtime_checkable
class AgentUnderTest(Protocol):
    """An agent eu-audit drives from the outside. Optional operations raise ``NotImplementedError`` when
    the agent lacks them; ``capabilities()`` says which it has."""

    def capabilities(self) -> Capabilities: ...

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        """``model_base_url`` is given only to an agent whose capabilities say ``tenant_model_url`` (an
        agent without that capability may leave the parameter out)."""
        ...

    def send(self, session_id: str, message: Message) -> Turn: ...

    def fork(self, session_id: str) -> str: ...

    def compact(self, session_id: str) -> Turn: ...

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn: ...

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt: ...

    def reset(self, tenant: str) -> None: ...

    def dump(self, tenant: str) -> StoreDump: ...

    def restart(self, tenant: str) -> None: ...

    def reindex(self, tenant: str) -> None: ...

    def files(self, tenant: str) -> StoreFiles: ...


class AgentUnreachable(BadInput):
    """Nothing answers at the agent's address, or it lacks a required endpoint (exit 2)."""


class AgentFailed(RunFailed):
    """The agent failed, timed out or answered outside the contract while driven (exit 3)."""


def guarded(what: str, fn: Callable[[], Any]) -> Any:
    """An agent operation, its failure named by the episode and step being driven: an agent that was
    never reachable is bad configuration (exit 2); one that fails while driven, a failed run (exit 3)."""
    try:
        return fn()
    except AgentUnreachable as exc:
        raise AgentUnreachable(f"{what}: {exc}") from None
    except AgentFailed as exc:
        raise AgentFailed(f"{what}: {exc}") from None
    except EuAuditError:
        raise
    except Exception as exc:  # an in-process agent's own error: the run failed, and where
        raise AgentFailed(f"{what}: the agent raised {type(exc).__name__}: {exc}") from exc


def _q(part: str) -> str:
    """A session id or tenant as one path segment, whatever characters it holds."""
    return urllib.parse.quote(part, safe="")


class HttpAgent:
    """An agent serving the JSON-over-HTTP contract at ``base_url``."""

    def __init__(self, base_url: str, *, bounds: Bounds | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BadInput(f"agent URL '{base_url}' must start with http:// or https://")
        self.base = base_url.rstrip("/")
        self.bounds = bounds or Bounds()

    def _call(self, method: str, path: str, answer: type[M], body: BaseModel | None = None) -> M:
        url = f"{self.base}{PREFIX}{path}"
        try:
            raw = request_json(
                url,
                method,
                None if body is None else body.model_dump(mode="json"),
                timeout=self.bounds.call_s,
                max_bytes=self.bounds.response_bytes,
            )
        except TimedOut:
            raise AgentFailed(
                f"the agent did not answer within {self.bounds.call_s:g} s (the whole call)"
            ) from None
        except TooLarge as exc:
            raise AgentFailed(f"the agent's answer is too large: {exc.why} (--max-response-mb)") from None
        except Unreachable as exc:
            raise AgentUnreachable(f"the agent does not answer: {exc}") from None
        except HttpStatus as exc:
            if exc.status in (404, 405, 501):
                raise AgentUnreachable(
                    f"the agent lacks {method} {PREFIX}{path} ({exc.why}); see eu-audit schema agent-api"
                ) from None
            raise AgentFailed(f"the agent failed: {exc}") from None
        except HttpFailure as exc:
            raise AgentFailed(f"the agent failed: {exc}") from None
        try:
            return answer.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "(answer)"
            raise AgentFailed(
                f"{method} {url}: the answer breaks the contract at '{where}': {err.get('msg')}"
            ) from None

    def _op(self, op: str, *path_args: str, body: BaseModel | None = None) -> Any:
        """One call of the contract by its table entry: verb, path and answer type come from there."""
        e = BY_OP[op]
        path = e.path.format(**{name: _q(v) for name, v in zip(e.params, path_args, strict=True)})
        return self._call(e.method, path, e.answer, body)

    def capabilities(self) -> Capabilities:
        caps: Capabilities = self._op("capabilities")
        if caps.version != API_VERSION:
            raise AgentUnreachable(f"the agent speaks {caps.version!r}; this eu-audit speaks {API_VERSION}")
        return caps

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        body = StartSession(tenant=tenant, seed=seed, tools=tools, model_base_url=model_base_url)
        return str(self._op("start", body=body).session_id)

    def send(self, session_id: str, message: Message) -> Turn:
        turn: Turn = self._op("send", session_id, body=message)
        return turn

    def fork(self, session_id: str) -> str:
        return str(self._op("fork", session_id).session_id)

    def compact(self, session_id: str) -> Turn:
        turn: Turn = self._op("compact", session_id)
        return turn

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        turn: Turn = self._op("inject_memory", tenant, body=record)
        return turn

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        receipt: ForgetReceipt = self._op("forget", tenant, body=request)
        return receipt

    def reset(self, tenant: str) -> None:
        self._op("reset", tenant)

    def dump(self, tenant: str) -> StoreDump:
        dump: StoreDump = self._op("dump", tenant)
        return dump

    def restart(self, tenant: str) -> None:
        self._op("restart", tenant)

    def reindex(self, tenant: str) -> None:
        self._op("reindex", tenant)

    def files(self, tenant: str) -> StoreFiles:
        got: StoreFiles = self._op("files", tenant)
        return got


class InProcessAgent:
    """An agent object in the harness's process, held to the same bounds as an HTTP one: each call runs
    on one worker thread of its own (the same thread every time, so an agent's thread-bound handles,
    such as SQLite connections, keep working) and the harness stops waiting at the deadline."""

    def __init__(self, build: Callable[[], Any], bounds: Bounds) -> None:
        """``build()`` makes the agent, on the worker thread too."""
        self.bounds = bounds
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="eu-audit-agent", daemon=True).start()
        fut: Future[Any] = Future()
        self._jobs.put((build, fut))
        self.agent = fut.result()  # its own errors (BadInput for a bad spec) propagate as they are

    def _work(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fut: Future[Any] = Future()
        self._jobs.put((lambda: getattr(self.agent, name)(*args, **kwargs), fut))
        try:
            got = fut.result(timeout=self.bounds.call_s)
        except TimeoutError:
            raise AgentFailed(
                f"{name}: the agent did not answer within {self.bounds.call_s:g} s (the whole call)"
            ) from None
        if isinstance(got, BaseModel):
            size = len(got.model_dump_json().encode())
            if size > self.bounds.response_bytes:
                raise AgentFailed(
                    f"{name}: the answer is {size} bytes, over the {self.bounds.response_bytes} allowed "
                    "(--max-response-mb)"
                )
        return got

    def capabilities(self) -> Capabilities:
        return self._run("capabilities")

    def start(
        self, tenant: str, *, seed: int, tools: list[OfferedTool], model_base_url: str | None = None
    ) -> str:
        lane = {"model_base_url": model_base_url} if model_base_url else {}  # older agents lack the parameter
        return self._run("start", tenant, seed=seed, tools=tools, **lane)

    def send(self, session_id: str, message: Message) -> Turn:
        return self._run("send", session_id, message)

    def fork(self, session_id: str) -> str:
        return self._run("fork", session_id)

    def compact(self, session_id: str) -> Turn:
        return self._run("compact", session_id)

    def inject_memory(self, tenant: str, record: MemoryRecord) -> Turn:
        return self._run("inject_memory", tenant, record)

    def forget(self, tenant: str, request: ForgetRequest) -> ForgetReceipt:
        return self._run("forget", tenant, request)

    def reset(self, tenant: str) -> None:
        self._run("reset", tenant)

    def dump(self, tenant: str) -> StoreDump:
        return self._run("dump", tenant)

    def restart(self, tenant: str) -> None:
        self._run("restart", tenant)

    def reindex(self, tenant: str) -> None:
        self._run("reindex", tenant)

    def files(self, tenant: str) -> StoreFiles:
        return self._run("files", tenant)


#: adapter kind -> factory from the part after ``kind:`` (or the whole URL for http / https)
ADAPTERS: Registry[Callable[[str], AgentUnderTest]] = Registry("adapters")
ADAPTERS.add("http", lambda spec: HttpAgent(spec))
ADAPTERS.add("https", lambda spec: HttpAgent(spec))


@ADAPTERS.register("python")
def python_agent(spec: str) -> AgentUnderTest:
    """``module:factory`` (or ``python:module:factory``): ``factory()`` builds the agent in-process."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise BadInput(f"--agent '{spec}': expected http://host:port or module:factory")
    try:
        factory: Any = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            # the module named is not there at all: a usage mistake
            raise BadInput(f"--agent '{spec}': cannot import {module}:{attr} ({exc})") from None
        # the agent's module is there and its own import failed (its stack is missing or broken)
        raise AgentFailed(f"agent {spec}, import: {type(exc).__name__}: {exc}") from None
    except AttributeError as exc:
        raise BadInput(f"--agent '{spec}': cannot import {module}:{attr} ({exc})") from None
    except Exception as exc:
        raise AgentFailed(f"agent {spec}, import: {type(exc).__name__}: {exc}") from None
    try:
        agent = factory()
    except EuAuditError:
        raise
    except Exception as exc:  # the agent did not start: a failed run, named
        raise AgentFailed(f"agent {spec}, start ({attr}()): {type(exc).__name__}: {exc}") from None
    missing = [op for op in REQUIRED_OPS if not callable(getattr(agent, op, None))]
    if missing:
        raise BadInput(f"--agent '{spec}': {attr}() returned an object without {', '.join(missing)}")
    return agent


def open_agent(spec: str, bounds: Bounds | None = None) -> AgentUnderTest:
    """The agent ``--agent`` names: a URL, ``module:factory``, or ``kind:rest`` of a registered adapter,
    held to ``bounds`` (an HTTP agent by its client, any other by running it on a worker thread)."""
    bounds = bounds or Bounds()
    kind, _, rest = spec.partition(":")
    if kind in ("http", "https"):
        return HttpAgent(spec, bounds=bounds)
    if kind in ADAPTERS and kind != "python":
        return InProcessAgent(lambda: ADAPTERS.get(kind)(rest), bounds)
    return InProcessAgent(lambda: python_agent(rest if kind == "python" else spec), bounds)
