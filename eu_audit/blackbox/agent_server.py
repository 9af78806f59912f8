"""Serve a Python ``AgentUnderTest`` over the JSON-over-HTTP contract (FastAPI), so an agent written
against the protocol can be gated like one in any other language. ``eu-audit agent`` runs eu-audit's
reference agent this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eu_audit import __version__
from eu_audit.blackbox.adapter import AgentUnderTest
from eu_audit.blackbox.contract import (
    BY_OP,
    ENDPOINTS,
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
    StoreFiles,
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

    def optional(op: str, *args: Any) -> Any:
        """An optional operation: 501 when the agent object lacks it or says it does."""
        fn = getattr(agent, op, None)
        try:
            if fn is None:
                raise NotImplementedError(op)
            return fn(*args)
        except NotImplementedError:
            raise HTTPException(501, f"this agent lacks {op}") from None

    def capabilities() -> Capabilities:
        return agent.capabilities()

    def start(body: StartSession) -> Session:
        lane = {"model_base_url": body.model_base_url} if body.model_base_url else {}
        return Session(session_id=agent.start(body.tenant, seed=body.seed, tools=body.tools, **lane))

    def send(session_id: str, body: Message) -> Turn:
        return agent.send(session_id, body)

    def fork(session_id: str) -> Session:
        return Session(session_id=optional("fork", session_id))

    def memory(tenant: str, body: MemoryRecord) -> Turn:
        return optional("inject_memory", tenant, body)

    def compact(session_id: str) -> Turn:
        return optional("compact", session_id)

    def forget(tenant: str, body: ForgetRequest) -> ForgetReceipt:
        return agent.forget(tenant, body)

    def reset(tenant: str) -> Ok:
        agent.reset(tenant)
        return Ok()

    def dump(tenant: str) -> StoreDump:
        return optional("dump", tenant)

    def restart(tenant: str) -> Ok:
        optional("restart", tenant)
        return Ok()

    def reindex(tenant: str) -> Ok:
        optional("reindex", tenant)
        return Ok()

    def files(tenant: str) -> StoreFiles:
        return optional("files", tenant)

    handlers: dict[str, Callable[..., Any]] = {
        "capabilities": capabilities,
        "start": start,
        "send": send,
        "fork": fork,
        "compact": compact,
        "inject_memory": memory,
        "forget": forget,
        "reset": reset,
        "dump": dump,
        "restart": restart,
        "reindex": reindex,
        "files": files,
    }
    assert set(handlers) == set(BY_OP), "every endpoint of the contract has one handler"
    for e in ENDPOINTS:  # paths, verbs and answers from the contract's one table
        # an id travels percent-encoded as one segment, and ASGI servers decode %2F before routing:
        # the path converter takes it back whole, whatever characters it holds
        path = e.path.replace("}", ":path}")
        app.add_api_route(PREFIX + path, handlers[e.op], methods=[e.method], response_model=e.answer)
    app.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    return app


def run_agent_server(agent: AgentUnderTest, *, host: str = "127.0.0.1", port: int = 9000) -> None:
    import uvicorn

    uvicorn.run(create_agent_app(agent), host=host, port=port, log_level="warning", access_log=False)
