"""``eu-audit gate``: gate an agent's forget black-box in one command. Its tenants are driven through the
agent contract in rounds until every rule of the gate set decides (``rounds``), then the bundle is
audited against those rules and the verdict is the exit code. ``record`` is the white-box run; the old
spelling ``record --agent`` still works, with a line saying what replaced it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from eu_audit.build_info import command_line
from eu_audit.cli.agent_run import (
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
    bounds_of,
    run_agent,
)
from eu_audit.cli.app import Force, SessionsOption, ShardOption, SigningKey, app, progress_bar
from eu_audit.cli.audit import (
    AuditAttest,
    AuditGate,
    AuditJsonPath,
    AuditJunitPath,
    AuditOnInconclusive,
    AuditOnInsensitive,
    AuditSarif,
    AuditSummaryMd,
    CiOutputs,
    apply_gates,
    check_acceptance,
    check_attest,
)
from eu_audit.defaults import SAMPLES_K
from eu_audit.errors import BadInput
from eu_audit.shards import SessionSlice, Shard

#: the rounds' default ceiling: the n at which a forget that works holds at margin 0.1 (n >= 29)
GATE_N = 30

GateAgent = Annotated[
    str,
    typer.Option(
        help="The agent under test: http://host:port (the agent contract, `eu-audit schema agent-api`) or "
        "module:factory. Its own forget is called; run it as another user (README)."
    ),
]
GateN = Annotated[
    int | None,
    typer.Option(min=1, help="The most sessions per suite (the rounds stop earlier when decided)."),
]
GateOut = Annotated[
    Path, typer.Option("--out", "-o", help="The bundle to write (JSONL, mode 0600: it holds the targets).")
]
GateRounds = Annotated[
    bool,
    typer.Option(
        "--until-decided/--fixed-n",
        help="Record in rounds (1, 2, 4, ... --n sessions per suite), decide the gate set after each, and "
        "stop at the first failure more sessions cannot undo (the default: a forget that leaks stops "
        "after one session; one that works runs to --n). --fixed-n records --n sessions whatever they show.",
    ),
]
GateSets = Annotated[
    list[str] | None,
    typer.Option("--gate-set", help="The rule lists the forget is held to (default: forget; audit --help)."),
]
GateTenants = Annotated[
    int,
    typer.Option(
        min=1,
        help="Tenants driven at the same time, each on its own lane of serve (the agent must take a model "
        "URL per tenant: capabilities.tenant_model_url). `record --concurrency` is sessions in flight.",
    ),
]
GateRecordOnly = Annotated[
    bool, typer.Option(help="Record the bundle and stop: no audit, exit 0 when the run succeeded.")
]


def check_parts(record_only: bool, **parts: str | None) -> None:
    """A part of a run (``--shard``, ``--sessions``) is recorded only: its verdict is the union's."""
    for name, part in parts.items():
        if part and not record_only:  # in rounds, the rounds' own check says why a part cannot
            raise BadInput(
                f"--{name} records part of a fixed run: add --fixed-n --record-only, then gate the parts' "
                "union with `eu-audit merge` and `eu-audit audit` (examples/ci)"
            )


@app.command("gate")
def gate_command(
    agent: GateAgent,
    serve: RecordServe = None,
    suite: RecordSuite = "builtin",
    n: GateN = GATE_N,
    seed: RecordSeed = 0,
    out_path: GateOut = Path("bb.jsonl"),
    k: RecordK = SAMPLES_K,
    until_decided: GateRounds = True,
    gate_set: GateSets = None,
    gate: AuditGate = None,
    json_path: AuditJsonPath = None,
    junit_path: AuditJunitPath = None,
    sarif_path: AuditSarif = None,
    summary_md: AuditSummaryMd = None,
    on_inconclusive: AuditOnInconclusive = "fail",
    on_insensitive: AuditOnInsensitive = "fail",
    attest: AuditAttest = None,
    signing_key: SigningKey = None,
    record_only: GateRecordOnly = False,
    serve_control: RecordServeControl = None,
    positive_control: RecordPositiveControl = True,
    own_floor: RecordOwnFloor = True,
    store_path: RecordStorePath = None,
    recheck: RecordRecheck = None,
    hint: RecordHint = False,
    tenants_in_flight: GateTenants = 1,
    agent_timeout: RecordAgentTimeout = None,
    max_response_mb: RecordMaxResponseMb = 4.0,
    max_bundle_mb: RecordMaxBundleMb = 512.0,
    same_user_ok: RecordSameUserOk = False,
    keep_state: RecordKeepState = False,
    state_dir: RecordStateDir = None,
    shard: ShardOption = None,
    sessions: SessionsOption = None,
    force: Force = False,
) -> None:
    """Gate an agent's forget: drive it black-box (its forget, a reference never given the target, a
    no-forget control, eu-audit's own floor) in rounds until the gate set decides, audit the bundle, and
    exit with the verdict: 0 held, 1 failed, 2 bad input, 3 the run failed, 4 inconclusive or
    insensitive. Every rule and output is checked before the agent is driven.

    Example:

    [bold]eu-audit gate --agent http://127.0.0.1:9000 --serve http://127.0.0.1:8088 --json audit.json[/]
    """
    from eu_audit.audit import AuditOptions, audit_plan
    from eu_audit.audit import audit as run_audit
    from eu_audit.audits.evidence import mask_for
    from eu_audit.audits.gate import check_rules, expand_gate_sets, parse_rule
    from eu_audit.blackbox.drive import AgentRecordOptions
    from eu_audit.blackbox.recheck import parse_rechecks
    from eu_audit.jsonl import check_output_path
    from eu_audit.rounds import Gate

    check_acceptance(on_inconclusive, on_insensitive)
    check_parts(record_only, shard=shard, sessions=sessions)
    for path in (json_path, junit_path, sarif_path, summary_md):
        if path is not None:
            check_output_path(path, force=force)  # refused now, not after the run
    if attest is not None:
        check_attest(attest, json_path, signing_key, [], force)
    sets, extra = list(gate_set or ["forget"]), list(gate or [])
    for rule in extra:
        parse_rule(rule)  # a misspelt rule is bad input before the agent is driven
    rounds = Gate(tuple(sets), tuple(extra)) if until_decided else None
    opts = AgentRecordOptions(
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
        recheck=parse_rechecks(recheck),
        positive_control=positive_control,
        own_floor=own_floor,
        store_paths=tuple(store_path or ()),
        concurrency=tenants_in_flight,
        shard=Shard.parse(shard) if shard else None,
        sessions=SessionSlice.parse(sessions, n) if sessions else None,
        bounds=bounds_of(agent_timeout, max_response_mb, max_bundle_mb),
    )
    run_agent(opts, rounds, same_user_ok)
    if record_only:
        return
    audit_opts = AuditOptions(command=command_line())
    plan = audit_plan(out_path, audit_opts)
    rules = [*expand_gate_sets(sets, plan.methods, plan.side, plan.measurable), *extra]
    check_rules(rules, plan.methods, plan.suites)
    with progress_bar() as report:
        rep = run_audit(out_path, audit_opts, progress=report)
    mask = mask_for(out_path)
    receipt = None
    if attest is not None:
        assert json_path is not None and signing_key is not None
        receipt = (attest, signing_key, [out_path], mask.variant_digests())
    apply_gates(
        mask.report(rep),
        rules,
        (json_path, junit_path, None),
        on_inconclusive,
        on_insensitive=on_insensitive,
        receipt=receipt,
        ci=CiOutputs(sarif_path, summary_md, str(out_path)),
    )
