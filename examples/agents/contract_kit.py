"""The agent contract, as a kit an agent is served with: the request bodies and ``serve_agent``, which
builds the HTTP app from one table of endpoints, so an agent holds only its stack.

An agent is an object with a method per endpoint it serves, named as the contract's operation
(``eu-audit schema agent-api``): ``start(body)``, ``send(session_id, body)``, ``forget(tenant, body)``,
``reset(tenant)`` are required; ``fork``, ``compact``, ``inject_memory``, ``dump``, ``restart``,
``reindex`` and ``files`` are optional, and the capabilities say which it has (from the methods it
defines). With ``lock_of(tenant)`` and ``tenant_of(session_id)`` it also gets one lock per tenant: its
tenants run side by side, one tenant's calls in order. ``Tenants`` is that bookkeeping, ready to inherit:
sessions by id, a lock and a model URL (serve's lane) per tenant, and each tenant's session table on disk
for ``restart`` to read back.

Dependency-light on purpose (FastAPI, pydantic, uvicorn, which every reference agent has): it runs in the
agent's own venv, never imports eu-audit, and is copied beside an agent as it is. eu-audit's test keeps
``ROUTES`` equal to the contract's own table (``eu_audit.blackbox.contract.ENDPOINTS``).

    from contract_kit import ForgetRequest, serve_agent
    serve_agent(MyAgent(), name="my-agent", port=9000)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import json
import os
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

CONTRACT = "eu-audit/agent-api@1"
PREFIX = "/eu-audit/v1"


#: the instruction every reference agent gives its model, one text for all: the stacks are compared on the
#: same prompt, only their memory differs
SYSTEM = (
    "You are a personal assistant agent acting for one user. Be brief. Use the tools when a task needs "
    "them, and what you remember about the user when it helps."
)


ARTICLES = ("a ", "an ", "the ")


def needles(target: str, variants: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The target and its variants folded (``norm``), each also without a leading article: a model writes
    "severe penicillin allergy" for the target "a severe penicillin allergy"."""
    out = []
    for v in [target, *variants]:
        n = norm(v)
        out += [n, *(n[len(a) :] for a in ARTICLES if n.startswith(a) and len(n) > len(a) + 3)]
    return [n for n in dict.fromkeys(out) if n]


def norm(text: str) -> str:
    """Case and punctuation folded, the way the reference agents' forgets look for the target: "12 Linden
    St." and "12 linden st" are one needle."""
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).strip()


class StartSession(BaseModel):
    tenant: str
    seed: int = 0
    tools: list[dict[str, Any]] = Field(default_factory=list)
    model_base_url: str | None = None  # serve's lane for this tenant (sent when tenant_model_url is on)


class Message(BaseModel):
    role: str
    content: str
    tool_call_id: str | None = None
    name: str | None = None


class MemoryRecord(BaseModel):
    id: str
    text: str


class ForgetRequest(BaseModel):
    target: str
    variants: list[str] = Field(default_factory=list)
    hint: dict[str, Any] | None = None


@dataclass(frozen=True)
class Route:
    """One endpoint: the agent's method (the contract's operation), its HTTP method and path, its body,
    and the capability that says an agent serves it (None: every agent does)."""

    op: str
    method: str
    path: str
    body: type[BaseModel] | None = None
    capability: str | None = None

    @property
    def params(self) -> list[str]:
        return [part[1:-1] for part in self.path.split("/") if part.startswith("{")]


#: the contract's endpoints but ``capabilities`` (which the kit answers itself)
ROUTES: tuple[Route, ...] = (
    Route("start", "POST", "/sessions", StartSession),
    Route("send", "POST", "/sessions/{session_id}/messages", Message),
    Route("fork", "POST", "/sessions/{session_id}/fork", None, "fork"),
    Route("compact", "POST", "/sessions/{session_id}/compact", None, "compact"),
    Route("inject_memory", "POST", "/tenants/{tenant}/memory", MemoryRecord, "memory_inject"),
    Route("forget", "POST", "/tenants/{tenant}/forget", ForgetRequest),
    Route("reset", "POST", "/tenants/{tenant}/reset"),
    Route("dump", "GET", "/tenants/{tenant}/dump", None, "store_dump"),
    Route("restart", "POST", "/tenants/{tenant}/restart", None, "restart"),
    Route("reindex", "POST", "/tenants/{tenant}/reindex", None, "reindex"),
    Route("files", "GET", "/tenants/{tenant}/files", None, "store_files"),
)


class Tenants:
    """What every agent keeps besides its stack: its sessions by id (each a dict holding its ``tenant``),
    one lock per tenant, each tenant's model URL (``model_base_url``: serve's lane, else
    ``OPENAI_BASE_URL``), and each tenant's session table in a JSON file under ``data``, replaced whole on
    every save, so a restart finds its sessions again (``load_sessions``)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8088/v1")
        self.bases: dict[str, str] = {}  # tenant -> where its model calls go (its lane of the server)
        self.sessions: dict[str, dict[str, Any]] = {}  # session id -> its tenant and the agent's own fields
        self.locks: dict[str, threading.RLock] = {}  # one per tenant: tenants run side by side
        self.meta = threading.Lock()  # guards the dicts above

    def lock_of(self, tenant: str) -> threading.RLock:
        with self.meta:
            return self.locks.setdefault(tenant, threading.RLock())

    def session(self, session_id: str) -> dict[str, Any]:
        if session_id not in self.sessions:
            raise HTTPException(404, f"no session {session_id}")
        return self.sessions[session_id]

    def tenant_of(self, session_id: str) -> str:
        return str(self.session(session_id)["tenant"])

    def base_of(self, tenant: str) -> str:
        return self.bases.get(tenant, self.base)

    def folder(self, tenant: str) -> Path:
        """The tenant's own folder under ``data`` (its name made safe for a path)."""
        return self.data / re.sub(r"[^A-Za-z0-9_.-]", "_", tenant)

    def sessions_file(self, tenant: str) -> Path:
        return self.folder(tenant) / "sessions.json"

    def save_sessions(self, tenant: str) -> None:
        with self.meta:
            mine = {sid: s for sid, s in self.sessions.items() if s["tenant"] == tenant}
        path = self.sessions_file(tenant)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(mine))
        tmp.replace(path)

    def load_sessions(self, tenant: str) -> None:
        """What a restart does to the tenant's sessions: dropped from memory, read back from its file."""
        path = self.sessions_file(tenant)
        saved = json.loads(path.read_text()) if path.exists() else {}
        with self.meta:
            for sid in [k for k, v in self.sessions.items() if v["tenant"] == tenant]:
                del self.sessions[sid]
            self.sessions.update(saved)

    def fork_session(self, session_id: str, *, deep: bool = True) -> str:
        """A copy of the session under a new id (its table fields; ``deep``: nested ones too), saved with
        its tenant's sessions; the agent copies its stack's own state for the new id."""
        s = self.session(session_id)
        new = uuid.uuid4().hex[:12]
        with self.meta:
            self.sessions[new] = copy.deepcopy(s) if deep else dict(s)
        self.save_sessions(s["tenant"])
        return new

    def drop_sessions(self, tenant: str) -> None:
        """The tenant's sessions gone from memory (``reset``)."""
        with self.meta:  # in place: other tenants' threads add sessions meanwhile
            for sid in [k for k, v in self.sessions.items() if v["tenant"] == tenant]:
                del self.sessions[sid]


def action(call_id: str, name: str, arguments: str | None) -> dict[str, Any]:
    """A tool call as the contract's action; arguments that are not JSON are None (the harness records
    the call as malformed)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = None
    return {"id": call_id, "name": name, "arguments": args}


def actions(calls: list[Any] | None) -> list[dict[str, Any]]:
    """OpenAI tool calls, as the client returns them or as dicts (``{"id", "function": {"name",
    "arguments"}}``), as the contract's actions."""
    out = []
    for c in calls or []:
        if isinstance(c, dict):
            out.append(action(c["id"], c["function"]["name"], c["function"].get("arguments")))
        else:
            out.append(action(c.id, c.function.name, c.function.arguments))
    return out


#: every agent's last way to forget: acknowledge and remove nothing (B0), the no-op a gate must fail
NO_FORGET = {"none": "acknowledge and remove nothing (B0)"}


def arguments(
    doc: str | None, port: int, data: str, data_help: str, *, forgets: dict[str, str]
) -> argparse.ArgumentParser:
    """The command line every agent takes (``--port``, ``--data``, ``--model``, and ``--forget``: its ways
    to forget, name -> what it does, the first the default, then ``none``); it adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--data", type=Path, default=Path(data), help=data_help)
    ap.add_argument("--model", default="served", help="the model name sent to the endpoint")
    ways = {**forgets, **NO_FORGET}
    ap.add_argument(
        "--forget",
        choices=list(ways),
        default=next(iter(ways)),
        help="; ".join(f"{name}: {what}" for name, what in ways.items()),
    )
    return ap


def capabilities(agent: object, name: str, **flags: bool) -> dict[str, Any]:
    """What the agent serves: each optional endpoint whose method it defines, and ``flags`` (e.g.
    ``tenant_model_url``: it sends a tenant's model calls to the URL its session was started with)."""
    served = {r.capability: True for r in ROUTES if r.capability and callable(getattr(agent, r.op, None))}
    return {"version": CONTRACT, "name": name, **served, **flags}


def _handler(agent: Any, route: Route) -> Callable[..., Any]:
    """The endpoint's function: its path parameters and body, as FastAPI reads them from the signature,
    handed to the agent's method in order, under the tenant's lock where the agent keeps one."""
    method = getattr(agent, route.op)

    def lock(kw: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
        if not hasattr(agent, "lock_of"):
            return contextlib.nullcontext()
        tenant = (
            kw.get("tenant") or getattr(kw.get("body"), "tenant", None) or agent.tenant_of(kw["session_id"])
        )
        return agent.lock_of(tenant)

    def handler(**kw: Any) -> Any:
        args = [kw[p] for p in route.params] + ([kw["body"]] if route.body else [])
        with lock(kw):
            return method(*args)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(p, kind, annotation=str) for p in route.params]
    if route.body is not None:
        params.append(inspect.Parameter("body", kind, annotation=route.body))
    handler.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    handler.__name__ = route.op
    return handler


def create_app(agent: object, name: str, *, title: str = "", **flags: bool) -> FastAPI:
    """The agent's HTTP app: ``/health``, the capabilities, and a route per method it defines."""
    app = FastAPI(title=title or name)
    caps = capabilities(agent, name, **flags)
    app.get("/health")(lambda: {"ok": True})
    app.get(PREFIX + "/capabilities")(lambda: caps)
    for route in ROUTES:
        if route.capability is None and not callable(getattr(agent, route.op, None)):
            raise TypeError(f"{type(agent).__name__} lacks {route.op}(), which every agent serves")
        if callable(getattr(agent, route.op, None)):
            app.add_api_route(PREFIX + route.path, _handler(agent, route), methods=[route.method])
    return app


def serve_agent(agent: object, name: str, port: int, *, title: str = "", **flags: bool) -> None:
    """Serve the agent over the contract on loopback until the process is stopped."""
    import uvicorn

    uvicorn.run(
        create_app(agent, name, title=title, **flags), host="127.0.0.1", port=port, log_level="warning"
    )
