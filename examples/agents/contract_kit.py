"""The agent contract, as a kit an agent is served with: the request bodies and ``serve_agent``, which
builds the HTTP app from one table of endpoints, so an agent holds only its stack.

An agent is an object with a method per endpoint it serves, named as the contract's operation
(``eu-audit schema agent-api``): ``start(body)``, ``send(session_id, body)``, ``forget(tenant, body)``,
``reset(tenant)`` are required; ``fork``, ``compact``, ``inject_memory``, ``dump``, ``restart``,
``reindex`` and ``files`` are optional, and the capabilities say which it has (from the methods it
defines). With ``lock_of(tenant)`` and ``tenant_of(session_id)`` it also gets one lock per tenant: its
tenants run side by side, one tenant's calls in order.

Dependency-light on purpose (FastAPI, pydantic, uvicorn, which every reference agent has): it runs in the
agent's own venv, never imports eu-audit, and is copied beside an agent as it is. eu-audit's test keeps
``ROUTES`` equal to the contract's own table (``eu_audit.blackbox.contract.ENDPOINTS``).

    from contract_kit import ForgetRequest, serve_agent
    serve_agent(MyAgent(), name="my-agent", port=9000)
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

CONTRACT = "eu-audit/agent-api@1"
PREFIX = "/eu-audit/v1"


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
