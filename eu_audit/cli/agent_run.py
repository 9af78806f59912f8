"""What a black-box run of an agent is told, shared by ``eu-audit gate`` and the old spelling ``eu-audit
record --agent``: the options' types, the rounds and bounds made from them, and the run with its table
(one row per tenant: what its forget did, z in its prompts, store and files after it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from eu_audit.cli.app import err, out, progress_bar, say
from eu_audit.errors import BadInput
from eu_audit.trace.records import AGENT_METHOD

RecordSuite = Annotated[
    str,
    typer.Option(
        help="Suite name (see `eu-audit suites list`), an episodes JSONL file, or loader:PATH; "
        "a comma list records --n sessions from each."
    ),
]
RecordSeed = Annotated[int, typer.Option(help="Seed; the same seed gives a byte-identical bundle.")]
RecordStateDir = Annotated[
    Path | None, typer.Option(help="Memory store and tool outbox folder (default: <out>.state/).")
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
        help="The `eu-audit serve` the agent's model calls go through (pins the samples' "
        "seeds; its log shows what reached the model after the forget)."
    ),
]
RecordK = Annotated[int, typer.Option(min=1, help="Seeded samples of the task probe per state.")]
RecordServeControl = Annotated[
    Path | None,
    typer.Option(
        help="The file where serve wrote its control secret (its --control-file; "
        "default: where serve writes it for --serve's port, in a directory only you can enter). Only the "
        "harness reads it; the agent under test is never given it."
    ),
]
RecordAgentTimeout = Annotated[
    float | None,
    typer.Option(
        min=0.1,
        help="Wall seconds one agent call may take, whole (default: $EU_AUDIT_AGENT_TIMEOUT, else 300).",
    ),
]
RecordMaxResponseMb = Annotated[
    float,
    typer.Option(min=0.01, help="The largest answer one agent call may return (MiB)."),
]
RecordMaxBundleMb = Annotated[float, typer.Option(min=1.0, help="The largest bundle a run may write (MiB).")]
RecordKeepState = Annotated[bool, typer.Option(help="Keep <out>.state/ when the run fails (for inspection).")]
RecordHint = Annotated[
    bool,
    typer.Option(
        help="Send the flagged observation's sanitized text with the forget. It is what "
        "the reference tenant was fed, so an agent that replays with it matches it by construction; "
        "off by default (the source text alone is sent), and the bundle records which was sent.",
    ),
]

RecordPositiveControl = Annotated[
    bool,
    typer.Option(
        "--positive-control/--no-positive-control",
        help="Drive a third tenant per session like the agent's but never send it the forget "
        "(B0, the no-forget arm): what each channel, probe and sample holds without a forget, so a rule "
        "or channel reads held or erased only where this control showed z (else insensitive / never "
        "held). Costs one more tenant per session, about half again the run's time.",
    ),
]
RecordOwnFloor = Annotated[
    bool,
    typer.Option(
        "--own-floor/--no-own-floor",
        help="Drive a fourth tenant per session, eu-audit's own runtime (no forget) over "
        "the episode without the target on serve's model, and fail the gate where the agent's reference "
        "says the target more often than it (the floor the agent is held to is then the agent's doing). "
        "Needs --serve running a model eu-audit knows; costs one more tenant per session.",
    ),
]
RecordStorePath = Annotated[
    list[str] | None,
    typer.Option(
        "--store-path",
        help="A file or glob where the agent persists tenants (SQLite, vector stores, JSON), "
        "'{tenant}' standing for each tenant's name; repeatable. eu-audit reads them itself after each "
        "tenant's run (rows, orphans, raw bytes, stored vectors: channel disk.*, metric residue_disk), "
        "for an agent that does not name them through the contract's 'files'.",
    ),
]
RecordRecheck = Annotated[
    str | None,
    typer.Option(
        help="Events after the forget, in order, each followed by the checks again "
        "(prompts, answers, store dump), so a forget that comes back fails: restart (the agent's "
        "`restart`: it reloads the tenant from what it persisted), compact (its own compaction), reindex "
        "(its stack's re-index or re-sync), turns-N (N turns of unrelated conversation); at-once (the "
        "dump right after the forget, before the episode's later turns, which may evict a copy the forget "
        "left; always checked first). E.g. --recheck at-once,restart,compact,turns-3. An event the agent "
        "lacks is reported as not measured.",
    ),
]

RecordSameUserOk = Annotated[
    bool,
    typer.Option(
        help="Accept an agent on this machine that runs as your own user (it could read "
        "serve's control secret and log): a test rig, not a gate. Without it such an agent is refused.",
    ),
]
RecordUntilDecided = Annotated[
    bool,
    typer.Option(
        help="Record in rounds (1, 2, 4, ... up to --n sessions per suite), audit after each, "
        "and stop at the first failure more sessions cannot undo (z in a prompt or store, a lost "
        "bystander, tampering, a rate the betting test finds worse: valid under optional stopping). A "
        "forget that leaks usually stops after one session; one that works runs to --n, where the fixed-n "
        "tests decide the holds. Rules: --until-gate-set (default forget) and --until-gate, as audit's. "
        "White-box: each round's sessions are forgotten with --methods and audited, the audit written "
        "with --json and exited with as audit's.",
    ),
]
RecordUntilGateSet = Annotated[
    list[str] | None,
    typer.Option(help="With --until-decided: the gate sets each round is decided by (default: forget)."),
]
RecordUntilGate = Annotated[
    list[str] | None,
    typer.Option(help="With --until-decided: more rules each round is decided by (as audit --gate)."),
]


def rounds_of(until_decided: bool, gate_sets: list[str] | None, rules: list[str] | None) -> Any:
    """The rules each round of --until-decided is decided by (``eu_audit.rounds.Gate``); None without it."""
    if not until_decided:
        if gate_sets or rules:
            raise BadInput("--until-gate-set and --until-gate decide the rounds of --until-decided; add it")
        return None
    from eu_audit.rounds import Gate

    return Gate(tuple(gate_sets or ("forget",)), tuple(rules or ()))


def bounds_of(call_s: float | None, response_mb: float, bundle_mb: float) -> Any:
    from eu_audit.blackbox.adapter import Bounds

    return Bounds(
        call_s=call_s if call_s is not None else Bounds().call_s,
        response_bytes=int(response_mb * (1 << 20)),
        bundle_bytes=int(bundle_mb * (1 << 20)),
    )


def run_agent(opts: Any, rounds: Any = None, same_user_ok: bool = False) -> None:
    from eu_audit.blackbox.drive import record_agent
    from eu_audit.blackbox.same_user import check_agent_user

    check_agent_user(opts.agent, same_user_ok)  # before anything is driven
    from eu_audit.rounds import record_until_decided

    agent, serve = opts.agent, opts.serve
    stop = None
    with progress_bar() as report:
        if rounds is None:
            bundle, path = record_agent(opts, progress=report)
        else:
            bundle, path, stop = record_until_decided(opts, rounds, progress=report)
    table = Table(title=Text(f"{path}  (agent {agent})"))
    cols = ["session", "episode", "forget", "skipped steps", "z in prompts after", "z in store", "z in files"]
    rechecks = opts.recheck
    tampered = any(s.residues and s.residues[0].tamper for s in bundle.sessions)
    for col in [
        *cols,
        *(["z after rechecks"] if rechecks else []),
        *(["tamper attempts"] if tampered else []),
    ]:
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
        row = [
            Text(s.session_id),
            Text(s.session.episode_id),
            forget,
            Text(skipped),
            ctx,
            store,
            files_cell(r),
        ]
        if rechecks:
            row.append(Text(recheck_cell(s.residues[1:]) if s.session.method == AGENT_METHOD else "-"))
        if tampered:
            row.append(Text(", ".join(f"{k} {n}" for k, n in sorted(r.tamper.items())) if r else "-"))
        table.add_row(*row)
    out.print(table)
    if tampered:
        say(
            err,
            "the agent tried to get around the measurement (tamper attempts above): the audit's gate fails",
        )
    if not serve:
        say(
            out, "without --serve: Leak@k, choices and residue_context are not measurable (the audit says so)"
        )
    if stop is not None:
        say(out, stop.sentence())


def files_cell(r: Any) -> Text:
    """What eu-audit's own read of the tenant's files found: where z is (channel and first place), "0 of N
    files" when it read them and found none, or why it read none."""
    if r is None or r.disk is None:
        return Text("not read (no files named)")
    held = {k: n for k, n in r.disk.items() if n}
    undeclared = getattr(r, "disk_undeclared", [])
    also = f"; {len(undeclared)} it did not name" if undeclared else ""
    if held:
        first = next(iter(held))
        where = r.disk_examples.get(first, "")
        said = f"{sum(held.values())} ({', '.join(held)}" + (f": {where[:80]}" if where else "") + ")"
        return Text(said + also)
    unread = f"; {len(r.disk_unread)} unread" if r.disk_unread else ""
    return Text(f"0 of {r.disk_files or 0} file(s){unread}{also}")


def recheck_cell(records: list[Any]) -> str:
    """``restart: 0; compact: 2 (store)``: per event, the items holding z and where, or why it was skipped."""
    parts = []
    for r in records:
        if r.skipped:
            parts.append(f"{r.after}: not run ({r.skipped})")
            continue
        where = [w for w, n in (("prompts", r.context_calls_with_z), ("answers", r.replies_with_z),
                               ("store", r.store_items_with_z)) if n]  # fmt: skip
        held = sum(n or 0 for n in (r.context_calls_with_z, r.replies_with_z, r.store_items_with_z))
        parts.append(f"{r.after}: {held}" + (f" ({', '.join(where)})" if where else ""))
    return "; ".join(parts)
