"""The FastAPI application and the server that runs it (uvicorn), bounded per connection."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Request

from eu_audit import __version__
from eu_audit.serve.api import (
    LANE_PATTERN,
    Limits,
)
from eu_audit.serve.backend import Backend, PinnedDecoding, open_backend
from eu_audit.serve.control import (
    DECODING_ROUTE,
    INFO_ROUTE,
    LOG_ROUTE,
    MARK_ROUTE,
    PROGRESS_ROUTE,
    check_not_where_agents_start,
    default_control_file,
    new_secret,
    write_control_file,
)
from eu_audit.serve.log import RequestLog
from eu_audit.serve.routes import Routes
from eu_audit.serve.upstream import UpstreamApi

DEFAULT_PORT = 8088
#: seconds a connection may sit with no request under way (idle, or its headers dripping in)
IDLE_S = 10.0


def create_app(
    backend: Backend,
    log: RequestLog,
    decoding: PinnedDecoding | None = None,
    *,
    secret: str | None = None,
    limits: Limits | None = None,
) -> Any:
    """The FastAPI application (the CLI runs it under uvicorn). ``app.state.routes`` holds the routes,
    ``app.state.secret`` the control secret (a fresh one when none is given)."""
    from fastapi import FastAPI

    app = FastAPI(title="eu-audit serve", version=__version__)
    limits = limits or Limits()
    backend.max_caches = limits.lane_caches
    backend.piece = limits.piece_tokens
    r = Routes(backend, log, decoding or PinnedDecoding(), secret or new_secret(), limits)
    app.state.routes, app.state.secret = r, r.secret

    def model_route(fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        async def endpoint(request: Request) -> Any:
            return await fn(request)

        return endpoint

    def lane_route(fn: Callable[..., Awaitable[Any]]) -> Callable[[Request, str], Awaitable[Any]]:
        async def endpoint(request: Request, lane: str) -> Any:
            return await fn(request, lane if re.fullmatch(LANE_PATTERN, lane) else "-")

        return endpoint

    async def read_log(request: Request, since: int = 0) -> Any:
        return await r.read_log(request, since)

    routes: list[tuple[str, Callable[..., Any], str]] = [
        ("/health", r.health, "GET"),
        ("/v1/models", r.models, "GET"),
        ("/v1/chat/completions", model_route(r.chat), "POST"),
        ("/v1/completions", model_route(r.completions), "POST"),
        ("/v1/embeddings", model_route(r.embeddings), "POST"),
        ("/v1/responses", model_route(r.responses), "POST"),
        ("/v1/messages", model_route(r.messages), "POST"),
        ("/lanes/{lane}/v1/chat/completions", lane_route(r.chat), "POST"),
        ("/lanes/{lane}/v1/completions", lane_route(r.completions), "POST"),
        ("/lanes/{lane}/v1/embeddings", lane_route(r.embeddings), "POST"),
        ("/lanes/{lane}/v1/responses", lane_route(r.responses), "POST"),
        ("/lanes/{lane}/v1/messages", lane_route(r.messages), "POST"),
        ("/lanes/{lane}/v1/models", r.models, "GET"),
        (INFO_ROUTE, r.info, "GET"),
        (PROGRESS_ROUTE, r.progress, "GET"),
        (MARK_ROUTE, model_route(r.mark), "POST"),
        (DECODING_ROUTE, model_route(r.decoding), "POST"),
        (LOG_ROUTE, read_log, "GET"),
    ]
    for path, fn, method in routes:
        app.add_api_route(path, fn, methods=[method])
    # last: any other route is a 404 that is logged (a probe of the surface shows in the audit)
    app.add_api_route("/{path:path}", r.unknown_route, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    return app


def bounded_protocol(idle_s: float) -> type:
    """uvicorn's h11 protocol with one more bound: a connection with no request under way (idle, or still
    sending its request line and headers) is closed after ``idle_s``. uvicorn's own keep-alive timeout
    starts only after a first answer, so without this a client could hold a socket open by connecting and
    sending nothing, or one header byte at a time. A request under way is bounded by its own deadline
    (its body included: ``Routes._body``)."""
    import time

    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Bounded(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._waiting_since = time.monotonic()
            self._watch = self.loop.call_later(1.0, self._check)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._waiting_since = time.monotonic()

        def connection_lost(self, exc: Exception | None) -> None:
            self._watch.cancel()
            super().connection_lost(exc)

        def _check(self) -> None:
            if self.transport.is_closing():
                return
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and time.monotonic() - self._waiting_since > idle_s:
                self.transport.close()
                return
            self._watch = self.loop.call_later(1.0, self._check)

    return Bounded


def run_server(
    *,
    model: str,
    engine: str = "auto",
    ctx: int | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    log_path: Path | None = None,
    upstream: str | None = None,
    upstream_api: UpstreamApi = "chat",
    pin: str = "greedy",
    control_file: Path | None = None,
    limits: Limits | None = None,
    force: bool = False,
) -> None:
    """Load the model, then serve until SIGINT / SIGTERM: in-flight decoding stops at its next token,
    the log is flushed and closed."""
    import uvicorn

    control_file = control_file or default_control_file(port)
    check_not_where_agents_start(control_file)  # before the model loads: a refusal costs nothing
    fresh = log_path is not None and not log_path.exists()
    log = RequestLog(log_path, force=force)  # before loading: a log we may not write fails at once
    try:
        try:
            backend = open_backend(model, engine, upstream, ctx, upstream_api)
        except BaseException:
            if fresh and log_path is not None:  # nothing was served: leave no empty log behind
                log.close()
                log_path.unlink(missing_ok=True)
            raise
        secret = new_secret()
        app = create_app(backend, log, PinnedDecoding(mode=pin), secret=secret, limits=limits)
        write_control_file(control_file, secret)
        routes: Routes = app.state.routes

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                routes.stopping.set()
                super().handle_exit(sig, frame)

        limits = limits or Limits()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=10,
            http=bounded_protocol(min(IDLE_S, limits.request_timeout_s)),
        )
        Server(config).run()
    finally:
        log.close()
