"""``eu-audit record``: agent sessions on a local engine, or a black-box agent driven through the contract."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.cli.agent_run import (
    RecordAgent,
    RecordAgentTimeout,
    RecordHint,
    RecordK,
    RecordKeepState,
    RecordMaxBundleMb,
    RecordMaxResponseMb,
    RecordOwnFloor,
    RecordPositiveControl,
    RecordRecheck,
    RecordSameUserOk,
    RecordSeed,
    RecordServe,
    RecordServeControl,
    RecordStateDir,
    RecordStorePath,
    RecordSuite,
    RecordUntilDecided,
    RecordUntilGate,
    RecordUntilGateSet,
    rounds_of,
)
from eu_audit.cli.app import (
    Force,
    SessionsOption,
    ShardOption,
    app,
    err,
    out,
    progress_bar,
    say,
)
from eu_audit.cli.record_rounds import RecordJson, RecordMethods, run_white_rounds
from eu_audit.defaults import DTYPE, SAMPLES_K, TURN_MAX_TOKENS, TURN_TEMPERATURE
from eu_audit.errors import BadInput
from eu_audit.models import DEFAULT_MODEL
from eu_audit.shards import SessionSlice, Shard

if TYPE_CHECKING:
    from eu_audit.record import RecordResult

RecordN = Annotated[
    int | None,
    typer.Option("--n", help="Sessions per suite (cycles through it); default: each episode once."),
]
RecordModel = Annotated[
    str,
    typer.Option(help="Registered model (see `eu-audit models`), a local HF directory or a .gguf file."),
]
RecordOutPath = Annotated[Path, typer.Option("--out", "-o", help="Bundle to write (JSONL, mode 0600).")]
RecordCheckpoints = Annotated[
    CheckpointPolicy | None,
    typer.Option(
        help="Checkpoint policy (granularity only changes cost). Default: the episode's, else every_turn."
    ),
]
RecordTemperature = Annotated[
    float, typer.Option(min=0.0, help="0 = greedy; > 0 samples with per-turn seeds.")
]
RecordMaxTokens = Annotated[int, typer.Option(min=1, help="Default cap on tokens per model turn.")]
RecordDtype = Annotated[str, typer.Option(help="float32 or bfloat16.")]
RecordKvSidecar = Annotated[
    bool, typer.Option(help="Also write the final KV cache as a safetensors sidecar.")
]
RecordEngine = Annotated[
    str,
    typer.Option(
        help="KV engine: auto (llamacpp for models shipped as GGUF, else hf), llamacpp, hf "
        "(transformers; needed for --kv-sidecar and span-only excision) or openai (a served model: "
        "--server). Later commands follow the bundle's engine."
    ),
]
RecordServer = Annotated[
    str | None,
    typer.Option(help="The OpenAI-compatible server of --engine openai (or EU_AUDIT_SERVER)."),
]
RecordConcurrency = Annotated[
    int,
    typer.Option(
        min=1,
        help="Sessions in flight at once: on a served engine (its batching), or with --agent the tenants "
        "driven at the same time, each on its own lane of serve (the agent must take a model URL per "
        "tenant: capabilities.tenant_model_url).",
    ),
]
RecordCtx = Annotated[
    int | None,
    typer.Option(
        min=256,
        help="Context in tokens of the llamacpp engine (default 8192; at most what the model was trained "
        "on), and its micro-batch, half of it (at least 4096): each segment is one forward pass. A session "
        "that outgrows either stops the run naming the session, turn and tokens. Later commands (audit, "
        "unlearn) open the engine with the sizes the bundle was recorded with.",
    ),
]


def _agent_only(
    recheck: str | None,
    positive_control: bool,
    store_path: list[str] | None,
    same_user_ok: bool = False,
    own_floor: bool = True,
) -> dict[str, bool]:
    """The options that mean something only with --agent, and whether each was given."""
    return {
        "--recheck": recheck is not None,
        "--no-positive-control": not positive_control,
        "--no-own-floor": not own_floor,
        "--store-path": bool(store_path),
        "--same-user-ok": same_user_ok,
    }


#: record's options that mean the same on ``gate`` (the rest are named apart: ``_as_gate``)
_SAME_ON_GATE = (
    "serve", "suite", "n", "seed", "k", "serve_control", "agent_timeout", "max_response_mb", "max_bundle_mb",
    "keep_state", "hint", "recheck", "positive_control", "own_floor", "store_path", "same_user_ok",
    "state_dir", "shard", "sessions", "force",
)  # fmt: skip


def _as_gate(given: dict[str, Any]) -> dict[str, Any]:
    """``record --agent``'s options as ``gate``'s: the same names, the rounds and the tenants renamed."""
    return {
        **{name: given[name] for name in _SAME_ON_GATE},
        "out_path": given["out_path"],
        "until_decided": given["until_decided"],
        "gate_set": given["until_gate_set"],
        "gate": given["until_gate"],
        "tenants_in_flight": given["concurrency"],
    }


#: what ``record --agent`` says: the black-box run is ``eu-audit gate`` now (this spelling: one more release)
DEPRECATED_AGENT = (
    "note: `eu-audit record --agent` is now `eu-audit gate` (it records and decides in one command; "
    "`gate --record-only` records only, `gate --tenants-in-flight` is this --concurrency); this spelling "
    "works for one more release"
)


@app.command("record")
def record_command(
    suite: RecordSuite = "builtin",
    n: RecordN = None,
    model: RecordModel = DEFAULT_MODEL,
    seed: RecordSeed = 0,
    out_path: RecordOutPath = Path("trace.jsonl"),
    checkpoints: RecordCheckpoints = None,
    temperature: RecordTemperature = TURN_TEMPERATURE,
    max_tokens: RecordMaxTokens = TURN_MAX_TOKENS,
    dtype: RecordDtype = DTYPE,
    kv_sidecar: RecordKvSidecar = False,
    state_dir: RecordStateDir = None,
    engine: RecordEngine = "auto",
    server: RecordServer = None,
    concurrency: RecordConcurrency = 1,
    ctx: RecordCtx = None,
    agent: RecordAgent = None,
    serve: RecordServe = None,
    k: RecordK = SAMPLES_K,
    serve_control: RecordServeControl = None,
    agent_timeout: RecordAgentTimeout = None,
    max_response_mb: RecordMaxResponseMb = 4.0,
    max_bundle_mb: RecordMaxBundleMb = 512.0,
    keep_state: RecordKeepState = False,
    hint: RecordHint = False,
    recheck: RecordRecheck = None,
    positive_control: RecordPositiveControl = True,
    own_floor: RecordOwnFloor = True,
    store_path: RecordStorePath = None,
    same_user_ok: RecordSameUserOk = False,
    until_decided: RecordUntilDecided = False,
    until_gate_set: RecordUntilGateSet = None,
    until_gate: RecordUntilGate = None,
    methods: RecordMethods = None,
    json_path: RecordJson = None,
    force: Force = False,
    shard: ShardOption = None,
    sessions: SessionsOption = None,
) -> None:
    """Run episodes through the agent runtime and write a JSONL trace bundle.

    With --until-decided, record in rounds (1, 2, 4, ... up to --n sessions per suite), forget each
    round's sessions with --methods (and the floor B5, the no-forget control B0) and audit them, and stop
    once the gate set is decided; the audit of every round's sessions is gated, written (--json) and exited
    with, as `eu-audit audit` does.

    With --agent (now `eu-audit gate`, which also decides), drive an agent eu-audit did not build through
    the agent contract; `eu-audit audit` then gates the bundle, no model needed.

    Example:

    [bold]eu-audit record --suite builtin --n 2 --model qwen2.5-coder-0.5b --seed 0 -o trace.jsonl[/]
    [bold]eu-audit record --suite bfcl-memory --n 30 --until-decided --methods b7 --json audit.json[/]
    """
    from eu_audit.record import RecordOptions
    from eu_audit.record import record as run_record

    white_box_only = {
        "--model": model != DEFAULT_MODEL,
        "--checkpoints": checkpoints is not None,
        "--temperature": temperature != TURN_TEMPERATURE,
        "--max-tokens": max_tokens != TURN_MAX_TOKENS,
        "--dtype": dtype != DTYPE,
        "--kv-sidecar": kv_sidecar,
        "--engine": engine != "auto",
        "--server": server is not None,
        "--ctx": ctx is not None,
        "--methods": methods is not None,
        "--json": json_path is not None,
    }
    agent_only = _agent_only(recheck, positive_control, store_path, same_user_ok, own_floor)
    rounds = rounds_of(until_decided, until_gate_set, until_gate)  # --until-gate* alone: refused
    if not until_decided and (methods or json_path):
        raise BadInput(
            "--methods and --json are what each round of --until-decided audits and writes; add it"
        )
    _check_kind(agent, white_box_only, agent_only)
    if agent is not None:  # the old spelling of `eu-audit gate --record-only`
        say(err, DEPRECATED_AGENT)
        from eu_audit.cli.gate import gate_command

        gate_command(**_as_gate(locals()), agent=agent, record_only=True)
        return
    opts = RecordOptions(
        suite=suite,
        n=n,
        model=model,
        seed=seed,
        out=out_path,
        checkpoint_policy=checkpoints,
        temperature=temperature,
        max_tokens=max_tokens,
        dtype=dtype,
        state_dir=state_dir,
        kv_sidecar=kv_sidecar,
        engine=engine,
        server=server,
        concurrency=concurrency,
        ctx=ctx,
        force=force,
        shard=Shard.parse(shard) if shard else None,
        sessions=SessionSlice.parse(sessions, n) if sessions else None,
    )
    if rounds is not None:
        run_white_rounds(opts, rounds, methods, k, json_path)
        return
    with progress_bar() as report:
        _print_recorded(run_record(opts, progress=report))


def _print_recorded(res: RecordResult) -> None:
    """What a white-box recording wrote: the sessions, checkpoints, state folder and sidecar."""
    print_bundle_summary(res.bundle, res.path)
    cp = res.checkpoint_bytes
    if cp:
        out.print(
            f"checkpoints: {len(cp)} (metadata only), {sum(cp) / len(cp):.0f} bytes each on average, "
            f"{max(cp)} max"
        )
    say(out, f"memory store and outbox: {res.state_dir}")
    if res.sidecar:
        say(out, f"KV sidecar: {res.sidecar}")


def _check_kind(agent: str | None, white_box_only: dict[str, bool], agent_only: dict[str, bool]) -> None:
    """Options of the other kind of run are refused, not ignored (exit 2)."""
    if agent is not None:
        given = [name for name, on in white_box_only.items() if on]
        if given:
            raise BadInput(
                f"{', '.join(given)}: not used with --agent (the agent picks its own model; serve's "
                "--model and --engine choose what it talks to)"
            )
        return
    given = [name for name, on in agent_only.items() if on]
    if given:
        raise BadInput(
            f"{', '.join(given)}: only with --agent (they drive or read an agent under test; a white-box "
            "run's state is eu-audit's own, replayed)"
        )


def mean_text(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):.0f}" if known else "unknown"


def print_bundle_summary(bundle: object, path: Path) -> None:
    from eu_audit.bundle.io import Bundle

    assert isinstance(bundle, Bundle)
    h = bundle.header
    table = Table(title=Text(f"{path}  ({h.model.name} on {h.engine}, seed {h.seed})"))
    for col in ("session", "episode", "T", "tau", "blocks", "tool calls", "target seen in"):
        table.add_column(col)
    for s in bundle.sessions:
        tau = s.tau()
        hits = [f"{b.type.value}@t{b.turn}" for b in s.target_occurrences() if b.derived]
        table.add_row(
            Text(s.session_id),
            Text(s.session.episode_id),
            str(s.session.transitions),
            "-" if tau is None else str(tau),
            str(len(s.blocks)),
            str(len(s.tool_calls)),
            ", ".join(hits) or "(no derived artifact)",
        )
    out.print(table)
