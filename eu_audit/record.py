"""``record``: run a suite's episodes through the agent runtime and write a trace bundle."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from eu_audit import __version__
from eu_audit.bundle.io import write_bundle
from eu_audit.checkpoints import CheckpointPolicy
from eu_audit.defaults import DTYPE, TURN_MAX_TOKENS, TURN_TEMPERATURE
from eu_audit.engines import AUTO, KVEngine, open_engine, resolve_engine
from eu_audit.engines.base import factory_of
from eu_audit.engines.served import OpenAIEngine
from eu_audit.episodes import Episode
from eu_audit.errors import BadInput, RunFailed
from eu_audit.jsonl import temp_beside
from eu_audit.models import DEFAULT_MODEL, LoadedModel
from eu_audit.parallel import in_job_order
from eu_audit.plan import PlannedSession, RunPlan
from eu_audit.progress import Progress, ProgressCounter
from eu_audit.runtime.agent import Agent, AgentSettings, derive_seed
from eu_audit.runtime.chat import detect_chat_format
from eu_audit.runtime.memory import MemoryStore, Outbox
from eu_audit.shards import SessionSlice, Shard
from eu_audit.trace.records import Decoding, Header, ModelInfo, check_decoding
from eu_audit.trace.session import Bundle, SessionTrace


@dataclass
class RecordOptions:
    suite: str = "builtin"
    n: int | None = None  # per suite; None: every episode of the suite once
    model: str = DEFAULT_MODEL
    seed: int = 0
    out: Path = Path("trace.jsonl")
    #: None: each episode's own policy (its suite knob), else every_turn
    checkpoint_policy: CheckpointPolicy | None = None
    temperature: float = TURN_TEMPERATURE
    max_tokens: int = TURN_MAX_TOKENS
    dtype: str = DTYPE
    engine: str = AUTO  # llamacpp for models shipped as GGUF, hf otherwise (engines.resolve_engine)
    server: str | None = None  # the openai engine's server
    concurrency: int = 1  # sessions in flight at once (served engines only)
    ctx: int | None = None  # the llamacpp engine's context in tokens (None: the engine's default)
    state_dir: Path | None = None  # memory store + outbox; default: <out>.state/
    kv_sidecar: bool = False
    force: bool = False
    shard: Shard | None = None  # run only this shard's sessions (ids and seeds stay run-wide)
    sessions: SessionSlice | None = None  # run only each suite's sessions FROM to TO - 1 (--sessions)
    #: run only the sessions with these run-wide indices (a round of ``whitebox_rounds``)
    only: frozenset[int] | None = None


@dataclass
class RecordResult:
    bundle: Bundle
    path: Path
    state_dir: Path
    sidecar: Path | None = None
    checkpoint_bytes: list[int] = field(default_factory=list)


STATE_FILES = ("memory.sqlite", "outbox.sqlite")  # what a recording keeps in its state folder


def _open_state(state_dir: Path, force: bool) -> tuple[MemoryStore, Outbox]:
    """The memory store and outbox in ``state_dir`` (``RunPlan`` checked it is no file)."""
    ours = [state_dir / f"{name}{ext}" for name in STATE_FILES for ext in ("", "-journal", "-wal", "-shm")]
    if any(p.exists() for p in ours):
        if not force:
            raise BadInput(
                f"{state_dir} holds an earlier run's memory store and outbox; pass --force to replace them"
            )
        for p in ours:  # only eu-audit's own files: --force never empties a folder it did not make
            p.unlink(missing_ok=True)
    state_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    return MemoryStore(state_dir / "memory.sqlite"), Outbox(state_dir / "outbox.sqlite")


def policy_for(ep: Episode, opts: RecordOptions) -> CheckpointPolicy:
    if opts.checkpoint_policy is not None:
        return opts.checkpoint_policy
    return CheckpointPolicy(ep.checkpoint_policy or CheckpointPolicy.every_turn.value)


def make_header(engine: KVEngine, chat_name: str, opts: RecordOptions, policy: CheckpointPolicy) -> Header:
    loaded = engine.loaded
    return Header(
        tool_version=__version__,
        model=ModelInfo(
            name=loaded.name,
            weight_digest=loaded.weight_digest,
            chat_template_digest=loaded.chat_template_digest,
            chat_format=chat_name,
            dtype=loaded.dtype,
        ),
        engine=engine.name,
        engine_facts=engine.facts(),
        decoding=Decoding(temperature=opts.temperature, max_tokens=opts.max_tokens),
        seed=opts.seed,
        suite=opts.suite,
        checkpoint_policy=policy,
        kv_sidecar=f"{opts.out.name}.kv.safetensors" if opts.kv_sidecar else None,
    )


def _concurrently(
    sessions: Sequence[PlannedSession],
    engine: KVEngine,
    concurrency: int,
    run_one: Callable[[PlannedSession, KVEngine], SessionTrace],
) -> list[SessionTrace]:
    """Sessions in parallel threads, each on its own client-side state; the server batches them. On a
    llama.cpp server each session in flight owns one slot (its --parallel), since the canonical served
    schedule needs to know what its slot holds."""
    pinned = isinstance(engine, OpenAIEngine) and engine.schedule == "canonical"
    workers = min(concurrency, engine.slots) if isinstance(engine, OpenAIEngine) and pinned else concurrency
    free: queue.Queue[int | None] = queue.Queue()
    for slot in range(workers):
        free.put(slot if pinned else None)

    def task(planned: PlannedSession) -> SessionTrace:
        slot = free.get()
        try:
            return run_one(planned, engine.sibling(id_slot=slot))
        finally:
            free.put(slot)

    return in_job_order(sessions, task, workers, name="eu-audit-session")


class _Interrupted(Exception):
    def __init__(self, done: list[SessionTrace]) -> None:
        self.done = done


def _one_by_one(
    sessions: Sequence[PlannedSession],
    engine: KVEngine,
    run_one: Callable[[PlannedSession, KVEngine], SessionTrace],
) -> list[SessionTrace]:
    """Sessions one after another; an interruption (^C, SIGTERM) is raised with the ones done."""
    done: list[SessionTrace] = []
    try:
        for planned in sessions:
            done.append(run_one(planned, engine))
    except KeyboardInterrupt as exc:
        raise _Interrupted(done) from exc
    return done


def _keep_partial(done: list[SessionTrace], planned: int, header: Header, out: Path) -> NoReturn:
    """An interrupted run's finished sessions written as a bundle whose header says it was interrupted
    (``engine_facts.interrupted``, which the audit summary repeats), then the run fails (exit 3)."""
    if not done:
        raise RunFailed("interrupted before the first session was recorded; nothing was written")
    header.engine_facts["interrupted"] = f"after {len(done)} of {planned} session(s)"
    write_bundle(out, Bundle(header=header, sessions=done, path=out).records())
    raise RunFailed(
        f"interrupted after {len(done)} of {planned} session(s): those are in {out}, its header marked "
        "interrupted (an audit of it says so); record again with --force for the whole run"
    )


def record(
    opts: RecordOptions,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
    engine: KVEngine | None = None,
) -> RecordResult:
    check_decoding(opts.temperature, opts.max_tokens)
    plan = RunPlan.of(opts)
    out, state_dir = plan.out, plan.state_dir
    if opts.concurrency < 1:
        raise BadInput("--concurrency must be at least 1")
    options: dict[str, object] = {"server": opts.server} if opts.server else {}
    if opts.ctx is not None:
        options.update(factory_of(resolve_engine(opts.engine, opts.model)).context_options(opts.ctx))
    engine = engine or open_engine(opts.engine, opts.model, dtype=opts.dtype, loaded=loaded, **options)
    if opts.kv_sidecar and not engine.abilities.kv_tensors:
        raise BadInput(f"--kv-sidecar needs KV tensors; engine '{engine.name}' holds none (use --engine hf)")
    if opts.concurrency > 1 and not engine.abilities.concurrent_sessions:
        raise BadInput(
            f"--concurrency needs a served engine (--engine openai); '{engine.name}' runs one session"
        )
    chat = detect_chat_format(engine.tokenizer)
    memory, outbox = _open_state(state_dir, opts.force)
    kv: dict[str, object] = {}
    total = sum(len(p.episode.steps) for p in plan.sessions)
    counter = ProgressCounter(total, progress)

    def run_one(planned: PlannedSession, eng: KVEngine) -> SessionTrace:
        ep, sid = planned.episode, planned.session_id
        settings = AgentSettings(
            max_tokens=opts.max_tokens,
            temperature=opts.temperature,
            seed=derive_seed(opts.seed, planned.index),
            checkpoint_policy=policy_for(ep, opts),
        )
        agent = Agent(eng, chat, ep, sid, settings, memory, outbox)
        agent.start()
        for t, step in enumerate(ep.steps):
            try:
                agent.step(step)
            except RunFailed as exc:  # which session and turn, so the user can find the episode
                raise RunFailed(f"session {sid} ({ep.id}), turn {t}: {exc}") from exc
            counter.tick(f"{sid} {ep.id}")
        if opts.kv_sidecar:
            kv.update({f"{sid}.{k}": v for k, v in eng.kv_tensors().items()})
        trace = agent.trace()
        trace.session.index = planned.index
        return trace

    def header_now() -> Header:  # after the sessions ran (a served engine's facts are read then)
        header = make_header(engine, chat.name, opts, policy_for(plan.episodes[0], opts))
        if opts.shard:
            header.engine_facts["shard"] = str(opts.shard)
        if opts.sessions:
            header.engine_facts["sessions"] = str(opts.sessions)
        return header

    try:
        if opts.concurrency > 1:
            sessions = _concurrently(plan.sessions, engine, opts.concurrency, run_one)
        else:
            sessions = _one_by_one(plan.sessions, engine, run_one)
    except _Interrupted as exc:  # ^C or SIGTERM: the sessions recorded so far are kept, marked so
        _keep_partial(exc.done, len(plan.sessions), header_now(), out)
    finally:
        memory.close()
        outbox.close()
    header = header_now()
    bundle = Bundle(header=header, sessions=sessions, path=out)
    write_bundle(out, bundle.records())
    sidecar = None
    if opts.kv_sidecar:
        sidecar = out.with_name(header.kv_sidecar or "")
        _write_sidecar(sidecar, kv)
    cp_bytes = [c.nbytes() for s in sessions for c in s.checkpoints]
    return RecordResult(
        bundle=bundle, path=out, state_dir=state_dir, sidecar=sidecar, checkpoint_bytes=cp_bytes
    )


def _write_sidecar(path: Path, tensors: dict[str, object]) -> None:
    """KV tensors as safetensors (never pickle), written atomically with mode 0600."""
    from safetensors.torch import save_file

    fd, tmp = temp_beside(path)
    os.close(fd)
    try:
        save_file(tensors, tmp)  # type: ignore[arg-type]
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
