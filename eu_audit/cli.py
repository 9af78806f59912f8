"""The ``eu-audit`` command line: thin wrappers over the library, one exit-code contract.

0 ran and every gate held; 1 ran and a gate failed; 2 bad input or usage; 3 the run itself failed;
4 ran, no gate failed, but one is inconclusive at this n (more sessions would decide).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from eu_audit import __version__
from eu_audit.blackbox.serve_api import DEFAULT_CONTROL_FILE
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.errors import BadInput, EuAuditError
from eu_audit.jsonl import interrupt_on_sigterm
from eu_audit.runtime.models import DEFAULT_MODEL, FAST_MODEL
from eu_audit.shards import Shard

app = typer.Typer(
    name="eu-audit",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    help="Prove whether an LLM agent really forgets: record agent sessions on a local KV engine, apply "
    "forget methods, audit what is left.\n\nExit codes: 0 ok, 1 a gate failed, 2 bad input, 3 run failed, "
    "4 a gate is inconclusive at this n.",
)
suites_app = typer.Typer(help="List, show and build episode suites.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")
out = Console()
err = Console(stderr=True)
#: 0 held, 1 a gate failed, 2 bad input, 3 the run failed, 4 a gate is inconclusive at this n
EXIT_CODES = (0, 1, 2, 3, 4)
DEBUG_ENV = "EU_AUDIT_DEBUG"  # set to 1 (or pass --debug) to see the traceback of a failed run


def _say(console: Console, *parts: str | Text) -> None:
    """Print text that may hold user-controlled strings (paths, ids, rules): never parsed as markup."""
    console.print(Text.assemble(*parts), highlight=False)


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """A Rich progress bar on stderr; yields the ``progress(what, done, total)`` callback."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as prog:
        task = prog.add_task("loading model", total=None)

        def report(what: str, done: int, total: int) -> None:
            # the description is rendered as markup: escape user-controlled ids
            from rich.markup import escape

            prog.update(task, description=escape(what), completed=done, total=total)

        yield report


def _version(value: bool) -> None:
    if value:
        out.print(f"eu-audit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help=f"Print the traceback when a run fails (or set {DEBUG_ENV}=1).")
    ] = False,
) -> None:
    if debug:
        os.environ[DEBUG_ENV] = "1"


# record's options, one alias each (the command's signature stays readable)
RecordSuite = Annotated[
    str,
    typer.Option(
        help="Suite name (see `eu-audit suites list`), an episodes JSONL file, or loader:PATH; "
        "a comma list records --n sessions from each."
    ),
]
RecordN = Annotated[
    int | None,
    typer.Option("--n", help="Sessions per suite (cycles through it); default: each episode once."),
]
RecordModel = Annotated[
    str,
    typer.Option(help="Registered model (see `eu-audit models`), a local HF directory or a .gguf file."),
]
RecordSeed = Annotated[int, typer.Option(help="Seed; the same seed gives a byte-identical bundle.")]
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
RecordStateDir = Annotated[
    Path | None, typer.Option(help="Memory store and tool outbox folder (default: <out>.state/).")
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
    int, typer.Option(min=1, help="Sessions in flight at once on a served engine (its batching).")
]
RecordAgent = Annotated[
    str | None,
    typer.Option(
        help="Drive an agent eu-audit did not build instead (black box): http://host:port (the agent "
        "contract, see `eu-audit schema agent-api`) or module:factory. Its own forget is called."
    ),
]
RecordServe = Annotated[
    str | None,
    typer.Option(
        help="With --agent: the `eu-audit serve` the agent's model calls go through (pins the samples' "
        "seeds; its log shows what reached the model after the forget)."
    ),
]
RecordK = Annotated[
    int, typer.Option(min=1, help="With --agent: seeded samples of the task probe per state.")
]
RecordServeControl = Annotated[
    Path,
    typer.Option(
        help="With --agent --serve: the file where serve wrote its control secret (its --control-file). "
        "Only the harness reads it; the agent under test is never given it."
    ),
]
RecordAgentTimeout = Annotated[
    float | None,
    typer.Option(
        min=0.1,
        help="With --agent: wall seconds one agent call may take, whole (default: "
        "$EU_AUDIT_AGENT_TIMEOUT, else 300).",
    ),
]
RecordMaxResponseMb = Annotated[
    float,
    typer.Option(min=0.01, help="With --agent: the largest answer one agent call may return (MiB)."),
]
RecordMaxBundleMb = Annotated[
    float, typer.Option(min=1.0, help="With --agent: the largest bundle a run may write (MiB).")
]
RecordKeepState = Annotated[
    bool, typer.Option(help="With --agent: keep <out>.state/ when the run fails (for inspection).")
]
RecordHint = Annotated[
    bool,
    typer.Option(
        help="With --agent: send the flagged observation's sanitized text with the forget. It is what "
        "the reference tenant was fed, so an agent that replays with it matches it by construction; "
        "off by default (the source text alone is sent), and the bundle records which was sent.",
    ),
]
RecordForce = Annotated[bool, typer.Option(help="Replace an existing output bundle and state folder.")]
#: shared by record and audit: a deterministic split of the sessions (see eu_audit/shards.py)
ShardOption = Annotated[
    str | None,
    typer.Option(
        help="Run only shard I of N (session i when i mod N = I-1; ids and seeds stay run-wide); join the "
        "shards with `eu-audit merge`.",
        metavar="I/N",
    ),
]


@app.command()
def record(
    suite: RecordSuite = "builtin",
    n: RecordN = None,
    model: RecordModel = DEFAULT_MODEL,
    seed: RecordSeed = 0,
    out_path: RecordOutPath = Path("trace.jsonl"),
    checkpoints: RecordCheckpoints = None,
    temperature: RecordTemperature = 0.0,
    max_tokens: RecordMaxTokens = 48,
    dtype: RecordDtype = "float32",
    kv_sidecar: RecordKvSidecar = False,
    state_dir: RecordStateDir = None,
    engine: RecordEngine = "auto",
    server: RecordServer = None,
    concurrency: RecordConcurrency = 1,
    agent: RecordAgent = None,
    serve: RecordServe = None,
    k: RecordK = 5,
    serve_control: RecordServeControl = Path(DEFAULT_CONTROL_FILE),
    agent_timeout: RecordAgentTimeout = None,
    max_response_mb: RecordMaxResponseMb = 4.0,
    max_bundle_mb: RecordMaxBundleMb = 512.0,
    keep_state: RecordKeepState = False,
    hint: RecordHint = False,
    force: RecordForce = False,
    shard: ShardOption = None,
) -> None:
    """Run episodes through the agent runtime and write a JSONL trace bundle.

    With --agent, drive your own agent instead: the factual stream on one tenant, then the agent's own
    forget, the future turns and the probes; the same on a fresh tenant fed the stream without the target
    (the B5 reference). `eu-audit audit` then gates it, no model needed.

    Example:

    [bold]eu-audit record --suite builtin --n 2 --model qwen2.5-coder-0.5b --seed 0 -o trace.jsonl[/]
    """
    from eu_audit.record import RecordOptions
    from eu_audit.record import record as run_record

    if agent is not None:
        ignored = {
            "--model": model != DEFAULT_MODEL,
            "--checkpoints": checkpoints is not None,
            "--temperature": temperature != 0.0,
            "--max-tokens": max_tokens != 48,
            "--dtype": dtype != "float32",
            "--kv-sidecar": kv_sidecar,
            "--engine": engine != "auto",
            "--server": server is not None,
            "--concurrency": concurrency != 1,
        }
        given = [name for name, on in ignored.items() if on]
        if given:
            raise BadInput(
                f"{', '.join(given)}: not used with --agent (the agent picks its own model; serve's "
                "--model and --engine choose what it talks to)"
            )
        from eu_audit.blackbox.drive import AgentRecordOptions, Bounds

        opts_bb = AgentRecordOptions(
            agent=agent,
            serve=serve,
            serve_control=serve_control,
            suite=suite,
            n=n,
            seed=seed,
            out=out_path,
            k=k,
            state_dir=state_dir,
            force=force,
            keep_state=keep_state,
            hint=hint,
            shard=Shard.parse(shard) if shard else None,
            bounds=Bounds(
                call_s=agent_timeout if agent_timeout is not None else Bounds().call_s,
                response_bytes=int(max_response_mb * (1 << 20)),
                bundle_bytes=int(max_bundle_mb * (1 << 20)),
            ),
        )
        _record_agent(opts_bb)
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
        force=force,
        shard=Shard.parse(shard) if shard else None,
    )
    with _progress() as report:
        res = run_record(opts, progress=report)
    _print_summary(res.bundle, res.path)
    cp = res.checkpoint_bytes
    if cp:
        out.print(
            f"checkpoints: {len(cp)} (metadata only), {sum(cp) / len(cp):.0f} bytes each on average, "
            f"{max(cp)} max"
        )
    _say(out, f"memory store and outbox: {res.state_dir}")
    if res.sidecar:
        _say(out, f"KV sidecar: {res.sidecar}")


def _record_agent(opts: Any) -> None:
    from eu_audit.blackbox.drive import record_agent

    agent, serve = opts.agent, opts.serve
    with _progress() as report:
        bundle, path = record_agent(opts, progress=report)
    table = Table(title=Text(f"{path}  (agent {agent})"))
    for col in ("session", "episode", "forget", "skipped steps", "z in prompts after", "z in store"):
        table.add_column(col)
    for s in bundle.sessions:
        r = s.residues[0] if s.residues else None
        ctx = (
            "no serve log"
            if r is None or r.context_calls is None
            else f"{r.context_calls_with_z}/{r.context_calls}"
        )
        store = "no dump" if r is None or r.store_items is None else f"{r.store_items_with_z}/{r.store_items}"
        forget = s.agent_forgets[0].status if s.agent_forgets else "-"
        skipped = "; ".join(f"t{x.t} {x.kind}: {x.reason}" for x in s.session.skipped) or "-"
        table.add_row(Text(s.session_id), Text(s.session.episode_id), forget, Text(skipped), ctx, store)
    out.print(table)
    if not serve:
        _say(
            out, "without --serve: Leak@k, choices and residue_context are not measurable (the audit says so)"
        )


def _mean_text(values: list[int | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):.0f}" if known else "unknown"


def _print_summary(bundle: object, path: Path) -> None:
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


@app.command()
def unlearn(
    bundle_path: Annotated[Path, typer.Argument(help="A recorded trace bundle (JSONL); never modified.")],
    method: Annotated[
        list[str],
        typer.Option(
            "--method", "-m", help="Method(s): b0..b9, b5p, excise; comma-separated, repeated, or 'all'."
        ),
    ] = ["b7"],  # noqa: B006 - typer reads the default
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output bundle (default: <input>.<method>.jsonl).")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(help="The target z to forget (default: each session's recorded forget request)."),
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="The flagged source s, if known (a source or block id).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model to replay with (default: the bundle's; weights must match).")
    ] = None,
    outbox: Annotated[
        Path | None,
        typer.Option(
            help="The real tool outbox (default: <input>.state/outbox.sqlite): a call id it holds has "
            "happened, so replay never fires it again, and its calls that carried the target are listed "
            "on every receipt."
        ),
    ] = None,
    server: Annotated[
        str | None, typer.Option(help="For a bundle recorded on --engine openai: the server (overrides).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing output bundle.")] = False,
    attest: Annotated[
        Path | None,
        typer.Option(
            help="A folder for signed per-session forget receipts (in-toto test-result Statements in DSSE "
            "envelopes; subjects the input and output bundles). Needs --signing-key.",
        ),
    ] = None,
    signing_key: AuditSigningKey = None,
) -> None:
    """Apply forget methods to every session of a bundle and write the post-forget bundle.

    Each method branches from the same contaminated state. The output holds, per session and method,
    the post-forget state, a recompute ledger (transitions replayed, tokens reused / prefilled /
    decoded, wall time) and a forget receipt (where the target is left). Example:

    [bold]eu-audit unlearn --method b7 trace.jsonl[/]
    """
    from eu_audit.unlearn import unlearn as run_unlearn

    if attest is not None:
        from eu_audit.evidence import load_signer

        if signing_key is None:
            raise BadInput("--attest needs --signing-key (an ed25519 private key, PEM)")
        load_signer(signing_key)
        if attest.exists() and not attest.is_dir():
            raise BadInput("--attest names a folder for the receipts; this is a file", path=str(attest))
    with _progress() as report:
        res = run_unlearn(
            bundle_path,
            method,
            out_path,
            target=target,
            source=source,
            model=model,
            outbox=outbox,
            server=server,
            force=force,
            progress=report,
        )
    table = Table(title=Text(f"{res.path}  (from {bundle_path})"))
    for col in (
        "session",
        "method",
        "tau",
        "replayed",
        "reused",
        "prefilled",
        "decoded",
        "wall s",
        "left behind",
    ):
        table.add_column(col, justify="right" if col not in ("session", "method", "left behind") else "left")
    for sid, name, led, rec in res.rows:
        left = ", ".join(f"{o.where}:{o.kind}" for o in rec.occurrences if o.where != "committed_tool_call")
        table.add_row(
            Text(sid),
            Text(name),
            str(led.tau),
            str(led.transitions_replayed),
            "unknown" if led.tokens_reused is None else str(led.tokens_reused),
            str(led.tokens_prefilled),
            str(led.tokens_decoded),
            f"{led.wall_s:.2f}",
            Text("clean", style="green") if rec.clean else Text(left, style="red"),
        )
    out.print(table)
    committed = {
        o.id for _, _, _, rec in res.rows for o in rec.occurrences if o.where == "committed_tool_call"
    }
    if committed:
        out.print(
            f"[yellow]note:[/] {len(committed)} committed tool call(s) carried the target before the forget "
            "(real side effects, outside any replay: assumption A3); listed in the receipts."
        )
    if attest is not None and signing_key is not None:
        _attest_unlearn(res, bundle_path, attest, signing_key, force)


def _attest_unlearn(res: Any, bundle_path: Path, folder: Path, key: Path, force: bool) -> None:
    from eu_audit.evidence import forget_statement, mask_for, sha256_file, sign
    from eu_audit.jsonl import atomic_writer, check_output_path

    folder.mkdir(parents=True, exist_ok=True)
    subjects = [(bundle_path.name, sha256_file(bundle_path)), (res.path.name, sha256_file(res.path))]
    mask = mask_for(bundle_path)
    for sid, name, led, rec in res.rows:
        path = folder / f"{sid}.{name}.receipt.json"
        check_output_path(path, force=force)
        with atomic_writer(path, private=False) as f:  # digests only: no target
            f.write(json.dumps(sign(forget_statement(sid, name, led, rec, subjects, mask), key), indent=1))
    _say(out, f"{len(res.rows)} signed forget receipt(s) in {folder}")


@app.command()
def inspect(
    bundle_path: Annotated[Path, typer.Argument(help="A trace bundle (JSONL).")],
    session: Annotated[str | None, typer.Option(help="Show one session's blocks in full.")] = None,
) -> None:
    """Validate a bundle and show its sessions, or one session's blocks with provenance."""
    from eu_audit.bundle.io import read_bundle

    bundle = read_bundle(bundle_path)
    if session is None:
        _print_summary(bundle, bundle_path)
        return
    s = bundle.session(session)
    tgt = s.session.target
    matcher = s.matcher()
    closure = s.closure()
    _say(
        out,
        Text(f"{bundle_path} session {session}", style="bold"),
        f": episode {s.session.episode_id}, target {tgt.value!r}, T={s.session.transitions}",
    )
    for b in s.blocks:
        span = f"{b.token_span[0]}-{b.token_span[1]}" if b.token_span else "not in cache"
        marks: list[str | Text] = []
        if b.id in closure:
            marks.append(Text(" tainted", style="yellow"))
        if matcher.found_in(b.text):
            marks.append(Text(" holds target", style="red"))
        _say(out, Text(b.id, style="bold"), f" t={b.turn} {b.type.value} ({span})", *marks)
        _say(out, f"    {b.text[:300]}")


@app.command()
def models(
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Hash every cached file against the digests written at conversion; exit 1 if one is broken.",
        ),
    ] = False,
) -> None:
    """List the models eu-audit knows, whether their files are installed, which engine `auto` picks, and
    whether their local cache is there and verifies."""
    from eu_audit.runtime.engine import resolve_engine
    from eu_audit.runtime.model_cache import verify as verify_folder
    from eu_audit.runtime.models import MODELS, cache_folders

    table = Table(title="models")
    for col in ("name", "role", "engine (auto)", "installed", "cache", "description"):
        table.add_column(col)
    broken = []
    for name, spec in MODELS.items():
        states = []
        for part, folder in cache_folders(spec):
            if not folder.is_dir():
                continue
            verdict = verify_folder(folder, force=verify)
            states.append(f"{part}: {'ok' if verdict else 'BROKEN'}")
            if not verdict:
                broken.append(verdict.problem)
        table.add_row(
            Text(name),
            spec.role,
            resolve_engine("auto", name),
            "yes" if spec.installed() else "no",
            ", ".join(states) or "not yet",
            Text(spec.description),
        )
    out.print(table)
    _say(
        out,
        "Also accepted by --model: a local Hugging Face directory or a .gguf file. "
        "Cache: $EU_AUDIT_CACHE or ~/.cache/eu-audit/models (a broken entry is rebuilt on next use).",
    )
    for problem in broken:
        _say(err, Text("broken cache: ", style="yellow"), problem)
    if broken:
        _say(err, "a broken entry is made again from its verified source the next time it is used")
        raise typer.Exit(1)


@app.command()
def schema(
    kind: Annotated[
        str,
        typer.Argument(
            help="trace (a bundle line), episode (a suite line), audit (the --json report), agent-api "
            "(the contract an agent under test serves) or serve-log (a line of serve's request log)."
        ),
    ] = "trace",
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the schema here instead of stdout.")
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
) -> None:
    """Print a JSON Schema: a trace-bundle line (eu-audit/trace@1), an episode (eu-audit/episode@1) or the
    audit report (eu-audit/audit@1)."""
    from eu_audit.bundle.records import json_schema
    from eu_audit.jsonl import atomic_writer, check_output_path

    if out_path is not None:
        check_output_path(out_path, force=force)
    if kind == "trace":
        doc = json_schema()
    elif kind == "episode":
        from eu_audit.episodes import Episode

        doc = {"$id": "eu-audit/episode@1", **Episode.model_json_schema()}
    elif kind == "audit":
        from eu_audit.audits.model import AuditReport

        doc = {"$id": "eu-audit/audit@1", **AuditReport.model_json_schema()}
    elif kind == "agent-api":
        from eu_audit.blackbox.contract import json_schema as agent_api

        doc = agent_api()
    elif kind == "serve-log":
        from eu_audit.blackbox.serve_api import LogEntry

        doc = {"$id": "eu-audit/serve-log@1", **LogEntry.model_json_schema()}
    else:
        raise typer.BadParameter(f"unknown schema '{kind}' (trace, episode, audit, agent-api, serve-log)")
    text = json.dumps(doc, indent=2)
    if out_path is None:
        sys.stdout.write(text + "\n")
    else:
        with atomic_writer(out_path, private=False) as f:
            f.write(text + "\n")
        _say(out, f"wrote {out_path}")


# audit's options, one alias each (the command's signature stays readable)
AuditBundlePath = Annotated[
    Path, typer.Argument(help="A recorded bundle (methods are applied first) or one unlearn produced.")
]
AuditMethod = Annotated[
    list[str], typer.Option("--method", "-m", help="Methods to audit (comma list, repeated, or 'all').")
]
AuditFloor = Annotated[
    bool,
    typer.Option("--floor/--no-floor", help="Measure against the B5 floor (B5 is added if missing)."),
]
AuditK = Annotated[int, typer.Option(min=1, help="Samples per state for Leak@k and the distribution audit.")]
AuditTemperature = Annotated[float, typer.Option(min=0.0, help="Sampling temperature of those samples.")]
AuditMaxTokens = Annotated[int, typer.Option(min=1, help="Tokens per probe answer / sample.")]
AuditMargin = Annotated[
    float,
    typer.Option(
        min=0.0, help="How close to the floor a method must be shown to be (a floor rule's upper bound)."
    ),
]
AuditAlpha = Annotated[
    float,
    typer.Option(
        min=0.0001, max=0.5, help="One-sided significance of the gates' tests and confidence bounds."
    ),
]
AuditOnInconclusive = Annotated[
    str,
    typer.Option(
        help="fail (exit 4, the default: add sessions to decide) or pass (accept an undecided rule, "
        "explicitly)."
    ),
]
AuditSeed = Annotated[int, typer.Option(help="Seed the sample seeds derive from (recorded in the report).")]
AuditGate = Annotated[
    list[str] | None,
    typer.Option(help="Rule METHOD[.SUITE].METRIC OP VALUE|floor, e.g. 'b7.leak_probes<=floor'; repeatable."),
]
AuditJsonPath = Annotated[Path | None, typer.Option("--json", help="Write the report (eu-audit/audit@1).")]
AuditJunitPath = Annotated[
    Path | None, typer.Option("--junit", help="Write JUnit XML (method x suite x audit).")
]
AuditStatesOut = Annotated[
    Path | None,
    typer.Option(help="Where the post-forget states go (default: <input>.audit-states.jsonl)."),
]
AuditRowsPath = Annotated[
    Path | None,
    typer.Option(
        "--rows", help="Write one row per session x method with every metric, as Parquet (a data set)."
    ),
]
AuditServing = Annotated[
    bool,
    typer.Option(
        "--serving",
        help="Also measure serving-layer residue on a served engine: serving.residual_cached_tokens "
        "(the prefix that carried z, still cached) and serving.reset_effective (after the "
        "server's own reset).",
    ),
]
AuditServer = Annotated[
    str | None, typer.Option(help="For a bundle recorded on --engine openai: the server (overrides).")
]
AuditForce = Annotated[bool, typer.Option(help="Replace existing --json, --junit and --rows files.")]
AuditRevealTarget = Annotated[
    bool,
    typer.Option(
        help="Keep the target's text in what the audit prints and writes, for a local investigation (files "
        "0600). By default every place z stayed is shown masked: [z:DIGEST], a salted digest of the span.",
    ),
]
AuditAttest = Annotated[
    Path | None,
    typer.Option(
        help="Write a signed forget receipt here: an in-toto Statement (test-result predicate) in a DSSE "
        "envelope, subjects the bundle, the --json audit, the weights and each --subject. Needs --json and "
        "--signing-key.",
    ),
]
AuditSigningKey = Annotated[Path | None, typer.Option(help="The receipt's ed25519 private key (PEM).")]
AuditSubject = Annotated[
    list[Path] | None,
    typer.Option(help="More subjects of the receipt: the agent build, a container digest file."),
]


@app.command()
def audit(
    bundle_path: AuditBundlePath,
    method: AuditMethod = ["all"],  # noqa: B006 - typer reads the default
    floor: AuditFloor = True,
    k: AuditK = 5,
    temperature: AuditTemperature = 0.7,
    max_tokens: AuditMaxTokens = 32,
    margin: AuditMargin = 0.1,
    alpha: AuditAlpha = 0.05,
    on_inconclusive: AuditOnInconclusive = "fail",
    seed: AuditSeed = 0,
    gate: AuditGate = None,
    json_path: AuditJsonPath = None,
    junit_path: AuditJunitPath = None,
    states_out: AuditStatesOut = None,
    rows_path: AuditRowsPath = None,
    serving: AuditServing = False,
    server: AuditServer = None,
    force: AuditForce = False,
    shard: ShardOption = None,
    reveal_target: AuditRevealTarget = False,
    attest: AuditAttest = None,
    signing_key: AuditSigningKey = None,
    subject: AuditSubject = None,
) -> None:
    """Audit forgetting: Leak@probes, Leak@k, behavioral extraction, CAD, utility and the distribution
    under sampling, each next to the B5 floor, with paired statistics; exit 1 when a --gate fails.

    The levers on cost: [bold]--n[/] and [bold]--suite[/] at record time (sessions), [bold]-m[/] (methods)
    and [bold]--k[/] (samples per state). A long audit keeps each finished state in
    <states>.audit-progress.jsonl: run the same command again after an interruption and it resumes.

    Each --gate is held, failed or inconclusive: against the floor, failed when the method is
    significantly worse (one-sided exact McNemar / Wilcoxon at --alpha), held when the upper confidence
    bound of its difference is within --margin, inconclusive otherwise (with the n that would decide);
    X==0 on a residue or leak is a fact: one session with z fails it. `eu-audit power` sizes a run.

    Exit codes: 0 every gate held, 1 a gate failed or a state errored, 2 bad input, 3 the run failed,
    4 no gate failed but one is inconclusive (add sessions; --on-inconclusive pass accepts it).

    Example:

    [bold]eu-audit audit trace.jsonl --floor --gate 'b7.leak_probes<=floor' --gate 'b7.cad==0'[/]
    """
    from eu_audit.audit import AuditOptions, audit_plan
    from eu_audit.audit import audit as run_audit
    from eu_audit.gate import check_rules
    from eu_audit.jsonl import check_output_path

    if on_inconclusive not in ("fail", "pass"):
        raise BadInput(f"--on-inconclusive must be fail or pass, not {on_inconclusive!r}")
    for path in (json_path, junit_path, rows_path):
        if path is not None:
            check_output_path(path, force=force)  # refused now, not after hours of compute
    if states_out is not None:
        check_output_path(states_out)  # the states resume: an existing file is this audit's own
    opts = AuditOptions(
        methods=method,
        floor=floor,
        k=k,
        temperature=temperature,
        max_tokens=max_tokens,
        margin=margin,
        alpha=alpha,
        seed=seed,
        unlearned_out=states_out,
        serving=serving,
        server=server,
    )
    if attest is not None:
        _check_attest(attest, json_path, signing_key, subject or [], force)
    if shard:
        from eu_audit.shards import shard_bundle

        bundle_path = shard_bundle(bundle_path, Shard.parse(shard))
    # a bad rule, or one naming a method this audit will not measure, is bad input before any model runs
    plan = audit_plan(bundle_path, opts)
    check_rules(gate or [], plan.methods, plan.suites)
    with _progress() as report:
        rep = run_audit(bundle_path, opts, progress=report)
    from eu_audit.evidence import mask_for

    mask = mask_for(bundle_path)  # the bundle's targets and salt, read once
    if not reveal_target:
        rep = mask.report(rep)
    receipt = None
    if attest is not None:
        assert json_path is not None and signing_key is not None
        receipt = (attest, signing_key, [bundle_path, *(subject or [])], mask.variant_digests())
    _gate(
        rep,
        gate or [],
        (json_path, junit_path, rows_path),
        on_inconclusive,
        private=reveal_target,
        receipt=receipt,
    )


def _check_attest(
    attest: Path, json_path: Path | None, key: Path | None, subjects: list[Path], force: bool
) -> None:
    """Everything a receipt needs, checked before any model runs."""
    from eu_audit.evidence import load_signer
    from eu_audit.jsonl import check_output_path

    if json_path is None:
        raise BadInput("--attest needs --json: the receipt's verdict is recomputed from that audit's rows")
    if key is None:
        raise BadInput("--attest needs --signing-key (an ed25519 private key, PEM)")
    load_signer(key)
    for s in subjects:
        if not s.is_file():
            raise BadInput("the --subject does not exist (or is not a file)", path=str(s))
    check_output_path(attest, force=force)


def _gate(
    rep: Any,
    rules: list[str],
    outputs: tuple[Path | None, ...],
    on_inconclusive: str,
    *,
    private: bool = False,
    receipt: tuple[Path, Path, list[Path], list[str]] | None = None,
) -> None:
    """Decide the rules, print and write the report (and its receipt), exit with the verdict's code: one
    source for the summary, the files and the exit code."""
    from eu_audit.gate import evaluate, exit_code

    rep.gates = evaluate(rep, rules)
    _print_audit(rep)
    _write_audit(rep, *outputs, private=private)
    if receipt is not None and outputs[0] is not None:
        _write_receipt(rep, outputs[0], *receipt)
    code = exit_code(rep.gates, inconclusive_passes=on_inconclusive == "pass")
    if code == 4:
        _say(err, "no rule failed, but some are inconclusive at this n: add sessions (exit 4), see above")
    if code:
        raise typer.Exit(code)


@app.command()
def merge(
    files: Annotated[list[Path], typer.Argument(help="Shard bundles, or shard audits (--json reports).")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The merged bundle or audit JSON.")],
    gate: Annotated[list[str] | None, typer.Option(help="With audits: rules to decide on the union.")] = None,
    junit_path: Annotated[Path | None, typer.Option("--junit", help="With audits: JUnit XML.")] = None,
    on_inconclusive: Annotated[str, typer.Option(help="With audits: fail (exit 4) or pass.")] = "fail",
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Join the shards of one run: bundles into one bundle (then audit it), or shard audits into one
    audit whose statistics are recomputed over every session, as a single run's would be. Shards of
    different models, engines, suites or seeds, or that share a session, are refused (exit 2).

    Examples:

    [bold]eu-audit merge bb.1.jsonl bb.2.jsonl -o bb.jsonl[/]
    [bold]eu-audit merge a1.json a2.json -o audit.json --gate 'agent.leak_probes<=floor'[/]
    """
    from eu_audit.jsonl import check_output_path
    from eu_audit.shards import merge_bundles, merge_reports

    if on_inconclusive not in ("fail", "pass"):
        raise BadInput(f"--on-inconclusive must be fail or pass, not {on_inconclusive!r}")
    check_output_path(out_path, force=force)
    try:
        head = files[0].read_bytes()[:200].lstrip() if files else b""
    except OSError as exc:
        raise BadInput(f"cannot read: {exc.strerror}", path=str(files[0])) from None
    if head.startswith(b'{"type":"header"') or head.startswith(b'{"type": "header"'):
        merged = merge_bundles(files, out_path, force=force)
        _say(out, f"wrote {merged} ({len(files)} shards); audit it with: eu-audit audit {merged}")
        return
    if junit_path is not None:
        check_output_path(junit_path, force=force)
    from eu_audit.gate import check_rules

    rep = merge_reports(files)
    check_rules(gate or [], rep.methods, rep.suites)
    _gate(rep, gate or [], (out_path, junit_path, None), on_inconclusive)


@app.command()
def verify(
    receipt: Annotated[Path, typer.Argument(help="A forget receipt (audit --attest): a DSSE envelope.")],
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="The receipt's subjects to check: the audit JSON (required), the bundle, the build."
        ),
    ] = None,
    key: Annotated[Path, typer.Option(help="The signer's ed25519 public key (PEM).")] = Path("key.pub.pem"),
) -> None:
    """Check a forget receipt: its signature, that the files given are its subjects, and that its verdict
    follows from the audit rows it names (recomputed). Prints what it proves and what it does not.

    Exit codes: 0 valid, 1 the verdict does not follow from the rows, 2 bad input or signature.

    Example:

    [bold]eu-audit verify receipt.json audit.json bb.jsonl --key signer.pub.pem[/]
    """
    from eu_audit.evidence import verify_receipt

    result = verify_receipt(receipt, key, files or [])
    for line in result.lines:
        _say(out, Text(line))
    if not result.follows:
        raise typer.Exit(1)


@app.command()
def power(
    pilot: Annotated[
        Path | None, typer.Argument(help="A pilot audit's --json report (its per-session rows are used).")
    ] = None,
    gate: Annotated[
        list[str] | None,
        typer.Option(help="Rules to size (default: the pilot's gates, else every method's floor rules)."),
    ] = None,
    worse_share: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Without a pilot: the share of sessions where the method is worse than the floor (0 for a "
            "forget as good as the reference); prints the n a 0/1 floor rule needs to hold.",
        ),
    ] = None,
    margin: Annotated[float, typer.Option(min=0.0, help="The gate's margin.")] = 0.1,
    alpha: Annotated[float, typer.Option(min=0.0001, max=0.5, help="The gate's one-sided alpha.")] = 0.05,
) -> None:
    """How many sessions a decisive verdict needs: for each rule, its outcome on the pilot and the n at
    which, at the pilot's observed rates, it would be held (or shown failed). Size a CI job before it runs.

    Examples:

    [bold]eu-audit power pilot.json[/]   [bold]eu-audit power --worse-share 0 --margin 0.1[/]
    """
    from eu_audit.verdict import n_for_share

    if pilot is None:
        if worse_share is None:
            raise BadInput("give a pilot audit JSON, or --worse-share")
        need = n_for_share(worse_share, margin, alpha)
        _say(
            out,
            f"a 0/1 rule against the floor, the method worse in {worse_share:.0%} of sessions: "
            + (f"n >= {need} sessions to hold within margin {margin} at alpha {alpha}" if need else
               f"no n holds it: {worse_share:.0%} is not within the margin {margin}"),
        )  # fmt: skip
        return
    from eu_audit.audits.model import read_report
    from eu_audit.gate import check_rules, default_rules, evaluate

    rep = read_report(pilot)
    rules = gate or [g.rule for g in rep.gates if g.rule != "no errored states"] or default_rules(rep)
    check_rules(rules, rep.methods, rep.suites)
    table = Table(title=Text(f"sessions needed (pilot {pilot}, margin {margin}, alpha {alpha})"))
    for col in ("rule", "now", "n now", "n that would decide", "test"):
        table.add_column(col)
    for g in evaluate(rep, rules, alpha=alpha, margin=margin):
        decide = "-" if g.outcome != "inconclusive" else (str(g.n_needed) if g.n_needed else "none")
        table.add_row(Text(g.rule), g.outcome, str(g.n), decide, Text(g.test))
    out.print(table)


def _print_audit(rep: object) -> None:
    from eu_audit.audits.model import AuditReport
    from eu_audit.audits.output import summary_lines, tables

    assert isinstance(rep, AuditReport)
    for t in tables(rep):
        out.print(t)
    for line in summary_lines(rep):
        _say(out, line)
    styles = {
        "held": ("held", "green"),
        "failed": ("FAILED", "bold red"),
        "inconclusive": ("INCONCLUSIVE", "yellow"),
    }
    for g in rep.gates:
        word, style = styles[g.outcome]
        _say(out, Text(f"gate {g.rule}: "), Text(word, style=style), Text(f"  ({g.detail}; {g.test})"))


def _write_receipt(
    rep: Any, audit_json: Path, out_path: Path, key: Path, files: list[Path], digests: list[str]
) -> None:
    from eu_audit.evidence import sha256_file, sign, statement
    from eu_audit.jsonl import atomic_writer

    subjects = [(files[0].name, sha256_file(files[0])), (audit_json.name, sha256_file(audit_json))]
    if rep.model_digest:
        subjects.append((f"model-weights:{rep.model}", rep.model_digest))
    subjects += [(f.name, sha256_file(f)) for f in files[1:]]
    envelope = sign(statement(rep, subjects, audit_json.name, digests), key)
    with atomic_writer(out_path, private=False) as f:  # holds no target: digests only
        f.write(json.dumps(envelope, indent=1))
    _say(
        out,
        f"signed forget receipt: {out_path} (check it with: eu-audit verify {out_path} --key PUBLIC.pem ...)",
    )


def _write_audit(
    rep: object,
    json_path: Path | None,
    junit_path: Path | None,
    rows_path: Path | None,
    *,
    private: bool = True,
) -> None:
    from eu_audit.audit import audit_rows
    from eu_audit.audits.model import AuditReport
    from eu_audit.audits.output import junit_xml
    from eu_audit.jsonl import atomic_writer, write_parquet

    assert isinstance(rep, AuditReport)
    if json_path:  # 0600 always: masked by default, but it describes where z stayed
        with atomic_writer(json_path, private=True) as f:
            f.write(rep.model_dump_json(indent=1))
    if junit_path:  # a CI artifact: 0644 when masked, 0600 when it holds the target
        with atomic_writer(junit_path, private=private) as f:
            f.write(junit_xml(rep))
    if rows_path:
        write_parquet(rows_path, audit_rows(rep))


@app.command()
def sweep(
    name: Annotated[str, typer.Argument(help="tau, indep, granularity, position, boundary or depth.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Folder for rows.jsonl, sweep.json, states.")],
    model: Annotated[str, typer.Option(help="Model to run.")] = FAST_MODEL,
    suite: Annotated[str, typer.Option(help="Suite builder the episodes come from.")] = "preference",
    n: Annotated[int, typer.Option(min=1, help="Episodes per value.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed for episodes and decoding.")] = 0,
    turns_after: Annotated[int, typer.Option(min=0, help="Transitions after the target (base knob).")] = 6,
    max_tokens: Annotated[int, typer.Option(min=1, help="Cap on tokens per model turn.")] = 32,
    value: Annotated[list[str] | None, typer.Option(help="Run only these values (repeatable).")] = None,
    engine: Annotated[
        str, typer.Option(help="KV engine: auto, llamacpp or hf (the boundary sweep's excision runs on hf).")
    ] = "auto",
) -> None:
    """Vary one knob, record, apply the sweep's methods, and write one row per value, session and method.

    Rows are written after every value; run the same command again to resume after an interruption.

    Example:

    [bold]eu-audit sweep tau --model smollm2-135m --n 2 -o sweeps/tau[/]
    """
    from eu_audit.sweeps import SweepOptions, run_sweep

    opts = SweepOptions(
        name=name,
        out=out_path,
        model=model,
        suite=suite,
        n=n,
        seed=seed,
        turns_after=turns_after,
        max_tokens=max_tokens,
        values=value,
        engine=engine,
    )
    with _progress() as report:
        rows = run_sweep(opts, progress=report)
    table = Table(title=Text(f"sweep {name}: {out_path / 'rows.jsonl'}"))
    for col in ("value", "method", "sessions", "any-leak", "recomputed", "decoded", "reused"):
        table.add_column(col, justify="right")
    from statistics import fmean

    for v in dict.fromkeys(r.value for r in rows):
        for m in dict.fromkeys(r.method for r in rows):
            rs = [r for r in rows if r.value == v and r.method == m]
            if rs:
                table.add_row(
                    Text(v),
                    Text(m),
                    str(len(rs)),
                    f"{fmean(r.leak_any for r in rs):.2f}",
                    f"{fmean(r.recomputed for r in rs):.0f}",
                    f"{fmean(r.decoded for r in rs):.0f}",
                    _mean_text([r.reused for r in rs]),
                )
    out.print(table)


@app.command()
def report(
    out_path: Annotated[Path, typer.Option("--out", "-o", help="Report folder (report.md and PNGs).")],
    sweep_dir: Annotated[
        list[Path] | None, typer.Option("--sweep", help="A sweep folder (repeatable).")
    ] = None,
    audit_json: Annotated[
        list[Path] | None, typer.Option("--audit", help="An audit --json report (repeatable).")
    ] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "eu-audit report",
    notes: Annotated[Path | None, typer.Option(help="Markdown placed under the title.")] = None,
) -> None:
    """Write a Markdown report with PNG plots from sweeps and audits, each with its command and versions.

    Example:

    [bold]eu-audit report --sweep sweeps/tau --sweep sweeps/indep --audit audit.json -o reports/smollm2[/]
    """
    from eu_audit.report import write_report

    if not sweep_dir and not audit_json:
        raise typer.BadParameter("give at least one --sweep or --audit")
    path = write_report(sweep_dir or [], audit_json or [], out_path, title, notes)
    _say(out, f"wrote {path}")


@app.command()
def serve(
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
    upstream: Annotated[
        str | None,
        typer.Option(
            help="Proxy mode: forward to this OpenAI-compatible base URL (still logging and pinning)."
        ),
    ] = None,
    pin: Annotated[
        str,
        typer.Option(help="Decoding until the harness says otherwise: greedy, or agent (its own settings)."),
    ] = "greedy",
    control_file: Annotated[
        Path,
        typer.Option(
            help="Where to write this run's control secret (0600, new each start): the harness "
            "(record --agent --serve-control) needs it to mark phases, pin decoding and read the log."
        ),
    ] = Path(DEFAULT_CONTROL_FILE),
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body (MiB).")] = 4.0,
    max_tokens: Annotated[
        int, typer.Option(min=1, help="Most completion tokens per request (the context bounds it too).")
    ] = 1024,
    request_timeout: Annotated[
        float, typer.Option(min=1.0, help="Wall seconds per request, the wait for the model included.")
    ] = 300.0,
    force: Annotated[bool, typer.Option(help="Replace an existing --log file.")] = False,
    repetition_guard: Annotated[
        bool,
        typer.Option(
            help="Stop decoding that repeats one short pattern (48+ tokens, period <= 24): greedy small "
            "models loop to the token cap otherwise. Logged as finish 'repetition'; clients see 'length'.",
        ),
    ] = True,
) -> None:
    """Serve the model the agent under test talks to: OpenAI-compatible /v1/chat/completions (with tools),
    /v1/completions, /v1/embeddings (MiniLM), /v1/models; /health and /eu-audit/v1/progress. Every request
    is logged; the harness pins decoding. Point the agent's OPENAI_BASE_URL at http://HOST:PORT/v1.

    Example:

    [bold]eu-audit serve --model smollm2-135m --port 8088 --log serve.jsonl[/]
    """
    from eu_audit.blackbox.serve import run_server
    from eu_audit.blackbox.serve_api import Limits
    from eu_audit.jsonl import check_output_path

    if pin not in ("greedy", "agent"):
        raise typer.BadParameter("--pin must be greedy or agent")
    if log is not None:
        check_output_path(log)
    check_output_path(control_file)
    limits = Limits(
        max_body_bytes=int(max_body_mb * (1 << 20)),
        max_tokens=max_tokens,
        request_timeout_s=request_timeout,
        repetition_guard=repetition_guard,
    )
    _say(err, f"eu-audit serve: loading {upstream or model} ... (control secret: {control_file})")
    run_server(
        model=model,
        engine=engine,
        host=host,
        port=port,
        log_path=log,
        upstream=upstream,
        pin=pin,
        control_file=control_file,
        limits=limits,
        force=force,
    )


@app.command("agent")
def agent_cmd(
    serve_url: Annotated[str, typer.Option("--serve", help="The eu-audit serve its model calls go through.")],
    forget: Annotated[
        str, typer.Option(help="Its forget: b7 (selective replay) or b1 (memory delete).")
    ] = "b7",
    model: Annotated[str, typer.Option(help="The model serve runs (for its tokenizer).")] = FAST_MODEL,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 9000,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    max_tokens: Annotated[int, typer.Option(min=1, help="Cap on tokens per model turn.")] = 48,
) -> None:
    """Run eu-audit's own runtime as an agent under test, over the agent contract: the passing control
    of a black-box gate (--forget b7) or the failing one (--forget b1).

    Example:

    [bold]eu-audit agent --serve http://127.0.0.1:8088 --forget b7 --port 9000[/]
    """
    from eu_audit.blackbox.agent_server import run_agent_server
    from eu_audit.blackbox.reference import ReferenceAgent
    from eu_audit.runtime.engine import open_engine

    if forget not in ("b7", "b1"):
        raise typer.BadParameter("--forget must be b7 or b1")
    engine = open_engine("openai", model, server=serve_url)
    ref = ReferenceAgent(engine, forget=forget, max_tokens=max_tokens)  # type: ignore[arg-type]
    _say(err, f"eu-audit agent (forget = {forget}) on http://{host}:{port}, model via {serve_url}")
    run_agent_server(ref, host=host, port=port)


@suites_app.command("list")
def suites_list() -> None:
    """Every registered suite with its episode count."""
    from eu_audit.suites import SUITES

    table = Table(title="suites")
    table.add_column("suite")
    table.add_column("episodes", justify="right")
    table.add_column("channels")
    for name, loader in SUITES.items():
        eps = loader()
        kinds = sorted({ep.steps[ep.tau - 1].kind.value for ep in eps})
        table.add_row(Text(name), str(len(eps)), ", ".join(kinds))
    out.print(table)


@suites_app.command("show")
def suites_show(
    suite: Annotated[str, typer.Argument(help="Suite name or episodes JSONL file.")],
    episode: Annotated[str | None, typer.Option(help="Episode id to print in full (JSON).")] = None,
) -> None:
    """Show a suite's episodes (or one episode as JSON)."""
    from eu_audit.suites import load_suite

    eps = load_suite(suite)
    if episode:
        match = [e for e in eps if e.id == episode]
        if not match:
            raise typer.BadParameter(f"no episode '{episode}' in {suite}")
        sys.stdout.write(match[0].model_dump_json(indent=2) + "\n")
        return
    table = Table(title=Text(suite))
    for col in ("episode", "T", "tau", "target kind", "description"):
        table.add_column(col, overflow="fold")
    for e in eps:
        table.add_row(Text(e.id), str(len(e.steps)), str(e.tau), Text(e.target.kind), Text(e.description))
    out.print(table)


@suites_app.command("build")
def suites_build(
    suite: Annotated[str, typer.Argument(help="Builder: agentdojo, bfcl-memory, bfcl-tools, preference.")],
    out_path: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Episodes JSONL to write (default: suites/<name>.jsonl)."),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed for every random choice (pairs, Faker records, order).")
    ] = 0,
    n: Annotated[int | None, typer.Option(min=1, help="Keep the first N episodes.")] = None,
    turns_after: Annotated[int, typer.Option(min=0, help="Transitions after the target enters.")] = 12,
    indep: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of those turns independent of the target.")
    ] = 0.5,
    position: Annotated[
        str, typer.Option(help="Where the target enters: early, middle or late (10% / 50% / 80% in).")
    ] = "early",
    depth: Annotated[
        int, typer.Option(min=0, max=3, help="Derivation depth: 1 answer, 2 + plan, 3 + summary.")
    ] = 3,
    checkpoints: Annotated[
        CheckpointPolicy, typer.Option(help="Checkpoint policy stamped on each episode.")
    ] = CheckpointPolicy.every_turn,
    force: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
) -> None:
    """Build a suite's episodes from its data set, reproducibly (same knobs + seed, same bytes).

    Example:

    [bold]eu-audit suites build agentdojo --seed 0 --turns-after 12 --indep 0.5 -o suites/agentdojo.jsonl[/]
    """
    from pydantic import ValidationError

    from eu_audit.suites.build import Skips, build_suite, write_suite
    from eu_audit.suites.compose import Knobs

    try:
        knobs = Knobs(
            seed=seed,
            n=n,
            turns_after=turns_after,
            indep=indep,
            position=position,  # type: ignore[arg-type]
            depth=depth,
            checkpoint_policy=checkpoints.value,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc.errors()[0]["msg"])) from None
    with _progress() as report:
        report(f"building {suite}", 0, 1)
        skips = Skips()
        episodes = build_suite(suite, knobs, skips)
        report(f"building {suite}", 1, 1)
    path = write_suite(episodes, out_path or Path("suites") / f"{suite}.jsonl", force=force)
    _say(out, f"{len(episodes)} episodes -> {path}")
    for line in skips.lines():
        _say(out, line)


@suites_app.command("calibrate")
def suites_calibrate(
    out_path: Annotated[
        Path, typer.Option("--out", "-o", help="Calibrated preference suite to write (JSONL, 0600).")
    ],
    model: Annotated[str, typer.Option(help="The model the suite will audit.")] = DEFAULT_MODEL,
    engine: Annotated[str, typer.Option(help="KV engine: auto, llamacpp or hf.")] = "auto",
    candidates: Annotated[
        int, typer.Option(min=1, help="Candidate pairs to measure (the first 30 are the shipped suite's).")
    ] = 30,
    samples: Annotated[int, typer.Option(min=1, help="Choice samples per order (the audit's --k).")] = 10,
    low: Annotated[float, typer.Option(min=0.0, max=1.0, help="Lowest floor avoid rate kept.")] = 0.2,
    high: Annotated[float, typer.Option(min=0.0, max=1.0, help="Highest floor avoid rate kept.")] = 0.8,
    seed: Annotated[int, typer.Option(help="Suite seed (provider names, turn order).")] = 0,
    table: Annotated[
        Path | None, typer.Option(help="Also write the calibration table (Markdown) here.")
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the table as JSON.")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing outputs.")] = False,
) -> None:
    """Keep the preference pairs whose B5 floor leaves room for behavioral residue on MODEL.

    Runs the real floor (record, B5 full reset, the audit's choice asks) for each candidate pair in both
    orders and keeps pairs whose floor avoid rate lies in [--low, --high]: where the agent that was never
    told already avoids the excluded provider every time, or names neither, no method can show residue.

    Example:

    [bold]eu-audit suites calibrate --candidates 30 --samples 10 -o pref-qwen.jsonl --table calibration.md[/]
    """
    from eu_audit.datasets.preference.calibrate import calibrate
    from eu_audit.jsonl import atomic_writer, check_output_path
    from eu_audit.suites.build import write_suite
    from eu_audit.suites.compose import Knobs

    for path in (out_path, table, json_path):
        if path is not None:
            check_output_path(path)  # refused now, not after the floor is measured
            if path.exists() and not force:
                raise BadInput(f"{path} exists; pass --force to replace it")
    with _progress() as report:
        cal, kept = calibrate(
            candidates,
            model=model,
            engine=engine,
            samples=samples,
            band=(low, high),
            knobs=Knobs(seed=seed),
            progress=report,
        )
    md = cal.markdown()
    sys.stdout.write(md)  # a Markdown table: unwrapped, whatever the terminal width
    if table is not None:
        with atomic_writer(table, private=False) as f:
            f.write(md)
    if json_path is not None:
        with atomic_writer(json_path, private=True) as f:  # names the excluded providers
            f.write(cal.model_dump_json(indent=2) + "\n")
    if not kept:
        _say(
            out,
            "no pair kept: behavioral residue cannot show on this model (see the table); nothing written to ",
            str(out_path),
        )
        return
    write_suite(kept, out_path, force=force)
    _say(out, f"{len(cal.kept)} pairs ({len(kept)} episodes) -> ", str(out_path))


def _fail(exc: BaseException, message: str, code: int) -> None:
    _say(err, Text("error: ", style="bold red"), message)
    if os.environ.get(DEBUG_ENV):
        err.print("".join(traceback.format_exception(exc)), markup=False, highlight=False)
    sys.exit(code)


def main() -> None:
    """Run the CLI under the one exit-code contract: 0 ok, 1 a gate failed, 2 bad input, 3 run failed,
    4 a gate is inconclusive.
    Nothing else leaves this function: an unexpected error is a failed run (3), one line, and its
    traceback with --debug or EU_AUDIT_DEBUG=1."""
    interrupt_on_sigterm()  # a kill unwinds like ^C, so no temporary file is left behind
    try:
        rc = app(standalone_mode=False)
    except EuAuditError as exc:
        _fail(exc, str(exc), exc.exit_code)
    except (KeyboardInterrupt, typer.Abort) as exc:
        _fail(exc, "interrupted; outputs are written atomically, so nothing half-written was left", 3)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 3
        sys.exit(code if code in EXIT_CODES else 3)
    except Exception as exc:
        # Usage errors (typer vendors click: match by shape, not by class path).
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(2)
        _fail(exc, f"the run failed: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 3)
    sys.exit(rc if isinstance(rc, int) and rc in EXIT_CODES else 0)


if __name__ == "__main__":
    main()
