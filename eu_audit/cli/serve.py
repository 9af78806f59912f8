"""``eu-audit serve``: the logged OpenAI-compatible model server a black-box agent calls."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eu_audit.cli.app import (
    Force,
    app,
    err,
    say,
)
from eu_audit.models import DEFAULT_MODEL
from eu_audit.serve.api import UNASKED_CHAT_TOKENS, UNASKED_COMPLETION_TOKENS

ServeLaneCaches = Annotated[
    int,
    typer.Option(
        min=1,
        help="KV caches kept, one per recently used lane (tenants of record --concurrency) and prompt "
        "family (prompts opening with the same first message): each tenant's prompt prefix stays cached "
        "while the others' requests run, and so does a memory library's long fixed prompt between the "
        "agent's chat calls. Each is one more context on the same weights (SmolLM2: about 0.2 GB).",
    ),
]
ServePieceTokens = Annotated[
    int,
    typer.Option(
        min=0,
        help="Prefill each message in pieces of this many tokens (0: whole messages, up to the engine's "
        "micro-batch). An agent whose system prompt changes only at its end (a timestamp, a memory "
        "block: Letta) then reuses the unchanged leading pieces instead of prefilling its whole prompt "
        "on every call. The pieces sit at fixed offsets, so an answer still depends on the tokens alone "
        "(which cache serves it never changes it); a different piece size may change the last digits of "
        "the logits, so keep one size within a run.",
    ),
]


#: proxy mode's options (``eu_audit.serve.upstream``)
UpstreamOption = Annotated[
    str | None,
    typer.Option(
        help="Proxy mode: forward to this base URL (still logging and pinning); its key, if it needs "
        "one, in the environment as EU_AUDIT_UPSTREAM_API_KEY (never on the command line)."
    ),
]
UpstreamApiOption = Annotated[
    str,
    typer.Option(
        help="What the upstream speaks: chat (OpenAI-compatible /v1/chat/completions) or messages "
        "(Anthropic-compatible /v1/messages; every API an agent speaks to serve reaches it as Messages)."
    ),
]


def _check_upstream(upstream: str | None, api: str, ctx: int | None) -> None:
    from eu_audit.serve.upstream import UPSTREAM_APIS

    if ctx is not None and upstream:
        raise typer.BadParameter("--ctx sizes the local engine's context; --upstream has its own")
    if api not in UPSTREAM_APIS:
        raise typer.BadParameter(f"--upstream-api: one of {', '.join(UPSTREAM_APIS)}, not {api!r}")


@app.command("serve")
def serve_command(
    model: Annotated[
        str, typer.Option(help="Registered model, local HF directory or .gguf file.")
    ] = DEFAULT_MODEL,
    engine: Annotated[
        str, typer.Option(help="KV engine: auto (llamacpp for GGUF models), llamacpp or hf.")
    ] = "auto",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8088,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    log: Annotated[
        Path | None, typer.Option(help="JSONL log of every request (mode 0600: prompts may hold targets).")
    ] = None,
    upstream: UpstreamOption = None,
    upstream_api: UpstreamApiOption = "chat",
    pin: Annotated[
        str,
        typer.Option(help="Decoding until the harness says otherwise: greedy, or agent (its own settings)."),
    ] = "greedy",
    control_file: Annotated[
        Path | None,
        typer.Option(
            help="Where to write this run's control secret (0600, new each start): the harness "
            "(eu-audit gate) needs it to mark phases, pin decoding and read the log; the agent must never "
            "read it. Default: serve-PORT.control in a directory only you can enter ($XDG_RUNTIME_DIR/"
            "eu-audit or /tmp/eu-audit-UID), where eu-audit gate finds it from --serve. A path inside the "
            "directory serve is started from is refused.",
        ),
    ] = None,
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body (MiB).")] = 4.0,
    max_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most completion tokens per request (the context bounds it too). A request that names none "
            f"gets {UNASKED_CHAT_TOKENS} on chat, {UNASKED_COMPLETION_TOKENS} on /v1/completions (OpenAI's "
            "default there).",
        ),
    ] = 1024,
    request_timeout: Annotated[
        float, typer.Option(min=1.0, help="Wall seconds per request, the wait for the model included.")
    ] = 300.0,
    lane_caches: ServeLaneCaches = 8,
    piece_tokens: ServePieceTokens = 0,
    ctx: Annotated[
        int | None,
        typer.Option(
            min=256,
            help="Context per lane, in tokens, on the llamacpp engine (default 8192; at most what the model "
            "was trained on). An agent whose prompts outgrow it gets a 400 naming both sizes (mem0's "
            "extraction at infer=True sends about 8.7k tokens: --ctx 16384 on a 32k model).",
        ),
    ] = None,
    force: Force = False,
    repetition_guard: Annotated[
        bool,
        typer.Option(
            help="Stop decoding that repeats one short pattern (48+ tokens, period <= 24): greedy small "
            "models loop to the token cap otherwise. Logged as finish 'repetition'; clients see 'length'.",
        ),
    ] = True,
) -> None:
    """Serve the model an agent under test talks to: OpenAI's chat completions, completions and Responses
    API, Anthropic's Messages API (streamed or not; fields: docs/serve-fields.md), embeddings, /v1/models.
    Every request is logged; the harness pins decoding. Point OPENAI_BASE_URL at http://HOST:PORT/v1
    (ANTHROPIC_BASE_URL at http://HOST:PORT); run the agent as another user: it must not read the secret.

    Example:

    [bold]eu-audit serve --model smollm2-135m --port 8088 --log serve.jsonl[/]
    """
    from eu_audit.jsonl import check_output_path
    from eu_audit.serve import run_server
    from eu_audit.serve.api import Limits

    if pin not in ("greedy", "agent"):
        raise typer.BadParameter("--pin must be greedy or agent")
    if log is not None:
        check_output_path(log)
    from eu_audit.serve.control import check_not_where_agents_start, default_control_file

    control_file = control_file or default_control_file(port)
    check_output_path(control_file)
    check_not_where_agents_start(control_file)
    _check_upstream(upstream, upstream_api, ctx)
    limits = Limits(
        max_body_bytes=int(max_body_mb * (1 << 20)),
        max_tokens=max_tokens,
        request_timeout_s=request_timeout,
        repetition_guard=repetition_guard,
        lane_caches=lane_caches,
        piece_tokens=piece_tokens,
    )
    say(err, f"eu-audit serve: loading {upstream or model} ... (control secret: {control_file})")
    run_server(
        model=model,
        engine=engine,
        ctx=ctx,
        host=host,
        port=port,
        log_path=log,
        upstream=upstream,
        upstream_api=upstream_api,
        pin=pin,
        control_file=control_file,
        limits=limits,
        force=force,
    )
