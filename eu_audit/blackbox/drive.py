"""``eu-audit gate``: drive suite episodes through an agent eu-audit did not build.

Per episode, three tenants, under opaque names, driven in an order no one can predict (nothing the agent
sees tells the reference apart):

1. **agent** (tenant A): the factual stream up to the end of the contamination phase (user turns as
   messages; the agent's tool calls answered from the suite's toolset on eu-audit's environment,
   consequential ones written once to the real outbox; memory steps through the agent's memory
   capability, else skipped with the reason), then **the agent's own forget**, then the episode's
   future turns, then the elicitations: the six probes, k seeded samples of the task probe and, for the
   preference suite, k choices (each on a fork of the session, or a fresh session of the same tenant when
   the agent cannot fork), then its store dump.
2. **b5** (tenant B, fresh): the counterfactual stream (the same script without z), no forget, the same
   future turns, elicitations and dump. This is the floor every figure is compared with.
3. **b0** (tenant C, ``--positive-control``, on by default): driven like the agent, never sent the forget:
   what each measurement shows without a forget (``eu_audit.audits.sensitivity``).

After the run, serve's log is read for what no honest agent does (``eu_audit.blackbox.tamper``): control
calls the harness never made, routes serve does not have, calls outside a tenant's run, z in the
reference's calls, calls quoting turns their tenant was not yet sent. Each is kept with its tenant.

Everything the audits need is kept in the bundle (messages, replies, actions, the forget receipt as the
agent returned it, the elicitations, and what the serve log and the store dump still hold of z), under
the methods ``agent`` and ``b5``, so ``eu-audit audit`` needs neither the agent nor a model, and gates
read ``agent.leak_probes<=floor``.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eu_audit import __version__
from eu_audit.blackbox.adapter import AgentFailed, Bounds, guarded, open_agent
from eu_audit.blackbox.contract import (
    Capabilities,
)
from eu_audit.blackbox.facts import AgentRunFacts
from eu_audit.blackbox.forensics import DiskReport, attach_disks
from eu_audit.blackbox.options import CONTROL_TENANT, OWN_FLOOR_TENANT, RECORDED_METHODS, AgentRecordOptions
from eu_audit.blackbox.own_floor import OwnFloor
from eu_audit.blackbox.residue import context_residue
from eu_audit.blackbox.serve_control import ServeControl
from eu_audit.blackbox.tamper import TamperEvidence, Tenant, find_tampering
from eu_audit.blackbox.tenant_run import Driven, Seat, TenantJob, TenantRun
from eu_audit.blackbox.undeclared import UndeclaredFiles
from eu_audit.bundle.io import write_bundle
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.errors import BadInput, RunFailed
from eu_audit.parallel import in_job_order
from eu_audit.plan import RunPlan
from eu_audit.progress import Progress, ProgressCounter
from eu_audit.runtime.memory import Outbox
from eu_audit.runtime.world import World
from eu_audit.serve.api import MODEL_ENDPOINTS, LogEntry
from eu_audit.trace.records import (
    AGENT_METHOD,
    BLACK_BOX_ENGINE,
    Decoding,
    Header,
    ModelInfo,
    session_id_of,
)
from eu_audit.trace.session import Bundle, SessionTrace

__all__ = ["CONTROL_TENANT", "RECORDED_METHODS", "AgentRecordOptions", "Bounds", "record_agent"]


def hint_sent(opts: AgentRecordOptions) -> str:
    return "source text and its sanitized text (--hint)" if opts.hint else "source text only"


def _drive_all(
    jobs: list[TenantJob],
    drive_one: Callable[[TenantJob], SessionTrace],
    opts: AgentRecordOptions,
) -> list[SessionTrace]:
    """Every tenant's trace, in the jobs' order: one after another, or ``opts.concurrency`` at a time (the
    first failure cancels the tenants not yet started and is raised as it is)."""
    size = 0

    def kept(trace: SessionTrace) -> SessionTrace:
        nonlocal size
        size += sum(len(r.model_dump_json()) + 1 for r in trace.records())
        if size > opts.bounds.bundle_bytes:
            raise AgentFailed(
                f"{trace.session_id}: the bundle would be over {opts.bounds.bundle_bytes >> 20} MiB "
                "(--max-bundle-mb); the agent's answers are too large to keep"
            )
        return trace

    return [kept(t) for t in in_job_order(jobs, drive_one, opts.concurrency, name="eu-audit-tenant")]


def _check_concurrency(opts: AgentRecordOptions, serve: ServeControl, caps: Capabilities) -> None:
    """Tenants at the same time are told apart by serve's lanes: that needs serve and an agent that
    sends each tenant's model calls where it is told (refused before any tenant runs)."""
    if opts.concurrency < 1:
        raise BadInput("--concurrency must be at least 1")
    if opts.concurrency == 1:
        return
    if serve.url is None:
        raise BadInput("--concurrency needs --serve: serve's lanes are what tell tenants' model calls apart")
    if not caps.tenant_model_url:
        raise BadInput(
            f"--concurrency {opts.concurrency}: agent {opts.agent} does not take a model URL per tenant "
            "(capabilities.tenant_model_url is false), so its tenants' model calls could not be told "
            "apart; drive it one tenant at a time (--concurrency 1) or shard the run (--shard I/N)"
        )


def _unattributed(entries: list[LogEntry], tenants: set[str]) -> int:
    """Model calls on serve's root URL that no tenant of this run owns: in a concurrent run only a lane's
    calls carry this run's marks, so these arrived somewhere else."""
    return sum(
        1
        for e in entries
        if e.endpoint in MODEL_ENDPOINTS and not e.lane and (e.mark.tenant if e.mark else "") not in tenants
    )


def _refuse_root_calls(
    entries: list[LogEntry], tenants: set[str], opts: AgentRecordOptions, serve: ServeControl
) -> None:
    """Tenants driven at the same time are told apart by their lanes only: a call on the root fails."""
    stray = _unattributed(entries, tenants) if opts.concurrency > 1 else 0
    if stray:
        raise AgentFailed(
            f"the agent sent {stray} model call(s) to serve's root URL ({serve.url}/v1/...) while "
            "tenants ran at the same time: no tenant can be held to them. It must send each "
            "tenant's calls to the model_base_url it was started with"
        )


def _in_random_order(jobs: list[TenantJob]) -> list[TenantJob]:
    """Each session's tenants in an order no one can predict (the agent, the reference and the control
    look alike from outside: opaque names, and no fixed place in the run), sessions in their order."""
    rng = secrets.SystemRandom()
    out: list[TenantJob] = []
    for i in dict.fromkeys(j.index for j in jobs):
        mine = [j for j in jobs if j.index == i]
        rng.shuffle(mine)
        out += mine
    return out


def _tamper_findings(
    serve: ServeControl,
    entries: list[LogEntry],
    tenants: dict[str, Tenant],
    lanes: dict[str, tuple[str, str]],
    first: tuple[str, str],
) -> TamperEvidence:
    """What the agent did to get around the measurement, from serve's log (where there is one), and z in
    the reference's answers that its model never wrote (read without serve too: then no call explains z)."""
    found = TamperEvidence()
    if serve.url is not None:
        found = find_tampering(
            entries, key=serve.key, sent=serve.numbers.sent, tenants=tenants, lanes=lanes, first=first
        )
    return found


def _header(
    opts: AgentRecordOptions, info: dict[str, Any], caps: Capabilities, digest: str, key: str
) -> Header:
    """A black-box bundle's header: the model serve ran, and the run's typed facts (``AgentRunFacts``)."""
    return Header(
        tool_version=__version__,
        model=ModelInfo(
            name=str(info.get("model", "unknown")),
            weight_digest=str(info.get("weight_digest", "")),
            chat_template_digest="",
            chat_format="",
            dtype=str(info.get("engine", "unknown")),
        ),
        engine=BLACK_BOX_ENGINE,
        engine_facts=AgentRunFacts(
            agent=opts.agent,
            capabilities=caps,
            serve=opts.serve,
            serve_info=info,
            serve_log_digest=digest,
            serve_control_key=key,
            forget_hint=hint_sent(opts),
            shard=str(opts.shard) if opts.shard else None,
            sessions=str(opts.sessions) if opts.sessions else None,
            k=opts.k,
            temperature=opts.temperature,
            concurrency=opts.concurrency,
        ).engine_facts(),
        decoding=Decoding(temperature=0.0, max_tokens=0),
        seed=opts.seed,
        suite=opts.suite,
        checkpoint_policy=CheckpointPolicy.every_turn,
    )


def _roles(
    opts: AgentRecordOptions, serve: ServeControl, info: dict[str, Any]
) -> tuple[list[tuple[str, World]], OwnFloor | None]:
    """The tenants of each session, and eu-audit's own floor's agent where it is driven (made before any
    tenant runs, so a model eu-audit cannot load is refused before the run costs anything)."""
    roles = [*RECORDED_METHODS, CONTROL_TENANT] if opts.positive_control else list(RECORDED_METHODS)
    own = OwnFloor.open(serve, info, opts) if opts.own_floor and serve.url is not None else None
    return roles + ([OWN_FLOOR_TENANT] if own is not None else []), own


def _named(
    canonical: list[TenantJob],
) -> tuple[dict[tuple[int, str], str], dict[str, Tenant]]:
    """Each tenant's opaque name (nothing the agent is told says which tenant is the reference), and what
    the harness knows of it under that name."""
    names = {(j.index, j.method): secrets.token_hex(8) for j in canonical}
    tenants = {
        names[(j.index, j.method)]: Tenant(session_id_of(j.index), j.method, j.episode.target.matcher())
        for j in canonical
    }
    return names, tenants


def _plan(opts: AgentRecordOptions) -> RunPlan:
    return RunPlan.of(opts)


def record_agent(opts: AgentRecordOptions, progress: Progress | None = None) -> tuple[Bundle, Path]:
    plan = _plan(opts)
    out, state_dir = plan.out, plan.state_dir
    serve = ServeControl.open(opts.serve, opts.serve_control)
    info = serve.info()
    agent = open_agent(opts.agent, opts.bounds)
    caps = guarded(f"agent {opts.agent}, capabilities", agent.capabilities)
    _check_concurrency(opts, serve, caps)
    start_seq = serve.position()  # this run's entries of serve's log start here
    # a lane per tenant whenever the agent takes a model URL per tenant, one tenant at a time too; there
    # the root URL is marked as well, so a call the agent sends to it (a shared embedder) still counts.
    # Tenants at the same time are told apart only by their lanes: a call on the root fails that run
    per_tenant = serve.url is not None and (opts.concurrency > 1 or caps.tenant_model_url)
    made_state = not state_dir.exists()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    outbox = Outbox(state_dir / "outbox.sqlite")
    roles, own = _roles(opts, serve, info)
    canonical = [TenantJob(p.index, p.episode, m, world) for p in plan.sessions for m, world in roles]
    under_test = Driven(agent, caps, opts)
    names, tenants = _named(canonical)
    lanes: dict[str, tuple[str, str]] = {}
    disks: dict[str, DiskReport] = {}  # tenant -> what eu-audit read in its files
    counter = ProgressCounter(len(canonical), progress)
    # files the agent writes and does not name: looked for where the OS tells whose they are (the bundle
    # and its state are the harness's own)
    undeclared = UndeclaredFiles.of(opts.agent, exclude=(str(out), str(state_dir)))

    finished: list[SessionTrace] = []  # every tenant run that ended, kept if the run is interrupted

    def drive_one(job: TenantJob) -> SessionTrace:
        floor = own if job.method == OWN_FLOOR_TENANT[0] else None  # eu-audit's runtime: always on a lane
        lane = serve.for_tenant(mirror=opts.concurrency == 1) if per_tenant or floor else serve
        if lane.lane:
            lanes[lane.lane] = (session_id_of(job.index), job.method)
        name = names[(job.index, job.method)]
        fed, turns = tenants[name].fed, tenants[name].turns
        if floor is not None:  # it names no files: nothing of it to read or to look for
            run = TenantRun(Seat(floor, job, lane, outbox, name, fed, turns))
        else:
            seat = Seat(under_test, job, lane, outbox, name, fed, turns)
            run = TenantRun(seat, disks=disks, undeclared=undeclared)
        trace = run.run()
        counter.tick(f"{trace.session.parent_session} {job.method} {job.episode.id}")
        finished.append(trace)
        return trace

    interrupted = ""
    try:
        try:
            driven = _drive_all(_in_random_order(canonical), drive_one, opts)
        except KeyboardInterrupt:  # ^C or SIGTERM: the sessions whose every tenant finished are kept
            driven, interrupted = _whole_sessions(finished, len(roles), len(plan.sessions))
            kept = {t.session_id for t in driven}
            canonical = [c for c in canonical if f"{session_id_of(c.index)}/{c.method}" in kept]
        entries, digest = serve.log(start_seq)
        _refuse_root_calls(entries, set(tenants), opts, serve)
    except BaseException:
        outbox.close()
        if made_state and not opts.keep_state:
            shutil.rmtree(state_dir, ignore_errors=True)
        raise
    outbox.close()
    by_id = {t.session_id: t for t in driven}
    sessions = [by_id[f"{session_id_of(j.index)}/{j.method}"] for j in canonical]
    first = (session_id_of(canonical[0].index), AGENT_METHOD)
    _attach_evidence(sessions, (entries, digest), serve, tenants, lanes, disks, first)
    if progress:
        progress("written", len(canonical), len(canonical))
    header = _header(opts, info, caps, digest, serve.key)
    if interrupted:
        header.engine_facts["interrupted"] = interrupted
    bundle = Bundle(header=header, sessions=sessions, path=out)
    write_bundle(out, bundle.records())
    if interrupted:
        raise Interrupted(
            f"interrupted {interrupted}: those are in {out}, its header marked interrupted (an audit of it "
            "says so); record again with --force for the whole run",
            out,
        )
    return bundle, out


def _attach_evidence(
    sessions: list[SessionTrace],
    log: tuple[list[LogEntry], str],
    serve: ServeControl,
    tenants: dict[str, Tenant],
    lanes: dict[str, tuple[str, str]],
    disks: dict[str, DiskReport],
    first: tuple[str, str],
) -> None:
    """What the run's serve log and eu-audit's read of the files say of each tenant, kept on its trace: z
    in its prompts (``residue``), in its files (``forensics``), and its tamper attempts (``tamper``)."""
    entries, digest = log
    for trace in sessions:
        name = str(trace.session.tenant)
        trace.residues = [
            context_residue(r, entries, trace, digest, serve.url is not None, serve.key, name)
            for r in trace.residues
        ]
    attach_disks(sessions, disks, {(t.session, t.method): name for name, t in tenants.items()})
    _tamper_findings(serve, entries, tenants, lanes, first).attach_to(sessions)


class Interrupted(RunFailed):
    """A run stopped by ^C or SIGTERM after it kept its finished sessions in ``out`` (None: none had
    finished, nothing was written) (exit 3)."""

    def __init__(self, message: str, out: Path | None) -> None:
        super().__init__(message)
        self.out = out


def _whole_sessions(
    finished: list[SessionTrace], tenants: int, planned: int
) -> tuple[list[SessionTrace], str]:
    """The tenant runs of the sessions every tenant of which finished, and what the header says of them; a
    run interrupted before one session finished keeps nothing (exit 3, saying so)."""
    by: dict[str, list[SessionTrace]] = {}
    for t in finished:
        by.setdefault(str(t.session.parent_session), []).append(t)
    whole = [t for runs in by.values() if len(runs) == tenants for t in runs]
    done = len(whole) // tenants
    if not done:
        raise Interrupted("interrupted before the first session was recorded; nothing was written", None)
    return whole, f"after {done} of {planned} session(s)"
