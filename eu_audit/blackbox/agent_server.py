"""Serve a Python ``AgentUnderTest`` over the JSON-over-HTTP contract (FastAPI), so an agent written
against the protocol can be gated like one in any other language. ``eu-audit agent`` runs eu-audit's
reference agent this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eu_audit import __version__
from eu_audit.blackbox.adapter import AgentUnderTest
from eu_audit.blackbox.contract import (
    PREFIX,
    Capabilities,
    ForgetReceipt,
    ForgetRequest,
    MemoryRecord,
    Message,
    Ok,
    Session,
    StartSession,
    StoreDump,
    Turn,
)
from eu_audit.errors import BadInput


def create_agent_app(agent: AgentUnderTest) -> Any:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="eu-audit agent", version=__version__)

    async def bad(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    app.add_exception_handler(BadInput, bad)

    def optional(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except NotImplementedError:
            raise HTTPException(501, "this agent lacks the operation") from None

    def capabilities() -> Capabilities:
        return agent.capabilities()

    def start(body: StartSession) -> Session:
        return Session(session_id=agent.start(body.tenant, seed=body.seed, tools=body.tools))

    def send(session_id: str, body: Message) -> Turn:
        return agent.send(session_id, body)

    def fork(session_id: str) -> Session:
        return Session(session_id=optional(lambda: agent.fork(session_id)))

    def memory(tenant: str, body: MemoryRecord) -> Turn:
        return optional(lambda: agent.inject_memory(tenant, body))

    def compact(session_id: str) -> Turn:
        fn = getattr(agent, "compact", None)
        if fn is None:
            raise HTTPException(501, "this agent lacks compaction")
        return fn(session_id)

    def forget(tenant: str, body: ForgetRequest) -> ForgetReceipt:
        return agent.forget(tenant, body)

    def reset(tenant: str) -> Ok:
        agent.reset(tenant)
        return Ok()

    def dump(tenant: str) -> StoreDump:
        return optional(lambda: agent.dump(tenant))

    routes: list[tuple[str, Callable[..., Any], str]] = [
        ("/capabilities", capabilities, "GET"),
        ("/sessions", start, "POST"),
        ("/sessions/{session_id}/messages", send, "POST"),
        ("/sessions/{session_id}/fork", fork, "POST"),
        ("/sessions/{session_id}/compact", compact, "POST"),
        ("/tenants/{tenant}/memory", memory, "POST"),
        ("/tenants/{tenant}/forget", forget, "POST"),
        ("/tenants/{tenant}/reset", reset, "POST"),
        ("/tenants/{tenant}/dump", dump, "GET"),
    ]
    for path, fn, method in routes:
        app.add_api_route(PREFIX + path, fn, methods=[method])
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    return app


def run_agent_server(agent: AgentUnderTest, *, host: str = "127.0.0.1", port: int = 9000) -> None:
    import uvicorn

    uvicorn.run(create_agent_app(agent), host=host, port=port, log_level="warning", access_log=False)
