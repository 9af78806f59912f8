"""``eu-audit agent``: the reference agents behind the contract."""

from __future__ import annotations

from typing import Annotated

import typer

from eu_audit.cli.app import (
    app,
    err,
    say,
)
from eu_audit.errors import BadInput


@app.command("agent")
def agent_cmd(
    serve_url: Annotated[str, typer.Option("--serve", help="The eu-audit serve its model calls go through.")],
    forget: Annotated[
        str,
        typer.Option(
            help="Its forget: b7 (selective replay), b1 (memory delete) or b0 (switched off: answers ok, "
            "changes nothing; a gate must never pass it)."
        ),
    ] = "b7",
    model: Annotated[
        str | None,
        typer.Option(
            help="The model serve runs, for its tokenizer (default: the one serve lists at /v1/models; a "
            "model other than serve's is refused, its token ids would be other words)."
        ),
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 9000,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    max_tokens: Annotated[int, typer.Option(min=1, help="Cap on tokens per model turn.")] = 48,
) -> None:
    """Run eu-audit's own runtime as an agent under test, over the agent contract: the passing control
    of a black-box gate (--forget b7), the failing one (--forget b1), or a forget switched off (b0).

    Example:

    [bold]eu-audit agent --serve http://127.0.0.1:8088 --forget b7 --port 9000[/]
    """
    from eu_audit.blackbox.agent_server import run_agent_server
    from eu_audit.blackbox.reference import FORGET_KINDS, ReferenceAgent
    from eu_audit.engines import open_engine

    if forget not in FORGET_KINDS:
        raise typer.BadParameter(f"--forget must be one of {', '.join(FORGET_KINDS)}")
    from eu_audit.engines.served import served_model

    if model is None:
        model = served_model(serve_url)
        if model is None:
            raise BadInput(f"--serve {serve_url} lists no model eu-audit knows at /v1/models: give --model")
    engine = open_engine("openai", model, server=serve_url)
    ref = ReferenceAgent(engine, forget=forget, max_tokens=max_tokens)
    say(err, f"eu-audit agent (forget = {forget}) on http://{host}:{port}, model via {serve_url}")
    run_agent_server(ref, host=host, port=port)
