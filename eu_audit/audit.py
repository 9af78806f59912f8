"""``eu-audit audit``: Leak@probes, Leak@5, behavioral extraction, CAD, utility, the distribution audit and
efficiency, per post-forget state, against the B5 floor, with paired statistics and CI gates.

Each post-forget state (one recorded session under one method) is rebuilt once from its token ids; every
probe and every sample is a branch of it (prefill once, crop back). B5 (the agent that never saw z) is
the floor: a probe that leaks on B5 leaks by itself (it names or guesses z), so it is dropped for that
suite and listed as dropped; every figure is reported next to B5's.

A long audit keeps each finished state's results in ``<states>.audit-progress.jsonl`` as it goes; run the
same command again after an interruption and it resumes without redoing them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.metric import Side
from eu_audit.audits.metrics import (
    picked,
)
from eu_audit.audits.model import FLOOR, SERVING, AuditReport, ProbeOutcome, StateAudit
from eu_audit.audits.options import AuditOptions  # re-exported: the library's documented name
from eu_audit.audits.probes import Ask, Probe, ProbeRunner, load_probes, task_request
from eu_audit.audits.rules import CONTROL
from eu_audit.audits.scoring import StateEvidence, score
from eu_audit.audits.summary import summarise
from eu_audit.bundle.io import read_bundle
from eu_audit.engines import KVEngine, Sampling
from eu_audit.errors import BadInput, EuAuditError
from eu_audit.models import LoadedModel
from eu_audit.progress import Progress
from eu_audit.runtime.agent import derive_seed
from eu_audit.runtime.memory import memory_text
from eu_audit.trace.records import BLACK_BOX_ENGINE
from eu_audit.trace.session import Bundle, SessionTrace
from eu_audit.trace.state import StateBuilder
from eu_audit.unlearn import check_bundle_model, engine_for, parse_methods, unlearn

#: metrics that compare a state with B5's: not measured without the floor


@dataclass(frozen=True)
class AuditPlan:
    """What an audit will measure, known before any model runs: its methods (the floor included), the
    suites its sessions come from, and its side (a black-box agent's run, or states rebuilt white-box)."""

    methods: list[str]
    suites: list[str]
    side: Side
    #: metrics the recorded run can measure at all (a gate set's rule "where measured" is kept only then)
    measurable: frozenset[str] = frozenset()


def with_floor_and_control(names: list[str], floor: bool) -> list[str]:
    """The methods an audit runs: the ones asked for, and with the floor, B5 (the reference every rule
    compares with) and B0 (the positive control every rule on z needs: ``eu_audit.audits.sensitivity``)."""
    return [*names, *(m for m in (CONTROL, FLOOR) if floor and m not in names)]


def audit_plan(path: str | Path, opts: AuditOptions) -> AuditPlan:
    bundle = read_bundle(path)
    suites = list(dict.fromkeys(s.session.suite for s in bundle.sessions))
    side = bundle.header.side
    wanted = None if list(opts.methods) == ["all"] else set(parse_methods(list(opts.methods)))
    if any(s.session.method for s in bundle.sessions):
        present = list(dict.fromkeys(s.session.method or "recorded" for s in bundle.sessions))
        kept = (FLOOR, CONTROL) if opts.floor else ()
        planned = [m for m in present if wanted is None or m in wanted or m in kept]
        first = [r for s in bundle.sessions for r in s.residues[:1]]
        found = {"residue_disk": any(r.disk is not None for r in first)}
        found["bystander"] = any(r.bystander_lost is not None for r in first)
        measurable = frozenset(m for m, yes in found.items() if yes)
        return AuditPlan([*planned, SERVING] if opts.serving else planned, suites, side, measurable)
    names = with_floor_and_control(parse_methods(list(opts.methods), bundle.header.engine), opts.floor)
    return AuditPlan([*names, SERVING] if opts.serving else names, suites, side)


def ensure_post_forget(
    path: Path, opts: AuditOptions, engine: Callable[[Bundle], KVEngine], progress: Progress | None
) -> tuple[Bundle, Path | None]:
    """A bundle ``unlearn`` produced is used as is; a recorded one gets the methods applied first (written
    next to it, reused when it is already there for the same input and methods)."""
    bundle = read_bundle(path)
    if any(s.session.method for s in bundle.sessions):
        return bundle, None
    names = with_floor_and_control(parse_methods(list(opts.methods), bundle.header.engine), opts.floor)
    out = opts.unlearned_out or path.with_name(f"{path.stem}.audit-states{path.suffix or '.jsonl'}")
    if out.exists():
        try:
            done = read_bundle(out)
            have = {s.session.method for s in done.sessions}
            if done.header.parent_digest == bundle.digest and set(names) <= have:
                return done, out
        except EuAuditError:
            pass  # a stale or broken derived file is rebuilt
    res = unlearn(path, names, out, force=True, progress=progress, engine=engine(bundle))
    return res.bundle, out


def audit(
    path: str | Path,
    opts: AuditOptions | None = None,
    *,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
    engine: KVEngine | None = None,
) -> AuditReport:
    opts = opts or AuditOptions()
    path = Path(path)
    if opts.k < 1:
        raise BadInput("--k must be at least 1")
    t0 = time.perf_counter()
    held: list[KVEngine] = [engine] if engine is not None else []

    def the_engine(b: Bundle) -> KVEngine:  # loaded once, with the bundle's engine, model and dtype
        if not held:
            held.append(engine_for(b, loaded=loaded, server=opts.server))
        else:
            check_bundle_model(b, held[0])
        return held[0]

    bundle, unlearned = ensure_post_forget(path, opts, the_engine, progress)
    if bundle.header.side == "black":  # black-box: everything is in the bundle, no model runs
        return _audit_agent_run(bundle, path, opts, t0)
    wanted = None if list(opts.methods) == ["all"] else set(parse_methods(list(opts.methods)))
    sessions = [
        s
        for s in bundle.sessions
        if wanted is None
        or s.session.method in wanted
        or (opts.floor and s.session.method in (FLOOR, CONTROL))
    ]
    if opts.floor and not any(s.session.method == FLOOR for s in sessions):
        raise BadInput(
            "the floor needs B5 states: run unlearn with b5 as well, or audit the recorded bundle",
            path=str(path),
        )
    eng = the_engine(bundle)
    runner = ProbeRunner.for_engine(eng)
    probes = load_probes()
    # batched and one-by-one branches sample differently: results of one are never resumed by the other
    branches = "batched" if eng.abilities.batched_branches else "one by one"
    progress_file = _ProgressFile(Path(unlearned or path), bundle.digest or "", opts, branches)
    done = progress_file.load()
    states = _audit_states(sessions, runner, probes, opts, progress_file, done, progress)
    if opts.serving:
        # the recording holds the observation that carried z; states that kept it (B0, B1, B8) do too
        carriers = [*(read_bundle(path).sessions if unlearned is not None else []), *bundle.sessions]
        states += serving_states(eng, carriers, progress)
    if progress:
        progress("statistics", len(sessions), len(sessions))
    report = summarise(
        bundle, path, unlearned, eng.loaded.name, opts, [p.id for p in probes], states, sessions
    )
    report.engine = eng.name
    report.cost = _cost(states, eng.name, branches, len(done), time.perf_counter() - t0)
    return report


def _audit_agent_run(bundle: Bundle, path: Path, opts: AuditOptions, t0: float) -> AuditReport:
    """A black-box bundle: every figure from what the run recorded; the same summary as white-box."""
    from eu_audit.blackbox.audit import agent_states, tampering

    if opts.serving:
        raise BadInput("--serving audits a served engine's cache; a black-box bundle has no engine")
    agent, opts.k, opts.temperature = agent_states(bundle)
    probe_ids = [p.id for p in load_probes()]
    report = summarise(bundle, path, None, bundle.header.model.name, opts, probe_ids, agent, bundle.sessions)
    report.engine = BLACK_BOX_ENGINE
    report.tampering = tampering(bundle)
    report.cost = {"wall_s": round(time.perf_counter() - t0, 1), "engine": "agent (no model runs)"}
    return report


def _audit_states(
    sessions: Sequence[SessionTrace],
    runner: ProbeRunner,
    probes: Sequence[Probe],
    opts: AuditOptions,
    progress_file: _ProgressFile,
    done: dict[tuple[str, str], StateAudit],
    progress: Progress | None,
) -> list[StateAudit]:
    """Every state's audit, in the sessions' order; finished ones are resumed from the progress file."""
    builder = StateBuilder(runner.engine)
    # one session's states one after another: they share every segment before tau, which stays cached
    order = sorted(range(len(sessions)), key=lambda j: _session_key(sessions[j])[0])
    by_index: dict[int, StateAudit] = {}
    answered: dict[str, list[tuple[str, list[int]]]] = {}  # equal states are asked once (audit_state)
    for i, j in enumerate(order):
        trace = sessions[j]
        key = _session_key(trace)
        if progress:
            progress(f"audit {key[0]} {key[1]}", i, len(sessions))
        st = done.get(key)
        if st is None:
            started = time.perf_counter()
            st = audit_state(
                trace,
                runner,
                probes,
                opts,
                self_floor=trace.session.method == FLOOR,
                builder=builder,
                answered=answered,
            )
            st.audit_s = round(time.perf_counter() - started, 3)
            progress_file.append(st)
        by_index[j] = st
    return [by_index[j] for j in range(len(sessions))]


def _cost(
    states: Sequence[StateAudit], engine: str, branches: str, resumed: int, wall: float
) -> dict[str, Any]:
    """What the audit cost: the whole job, resumed parts included (each method's ledger, each audit)."""
    n_sessions = len({s.session_id for s in states}) or 1
    return {
        "wall_s": round(wall, 1),
        "engine": engine,
        "cores": os.cpu_count() or 0,
        "states": len(states),
        "resumed_states": resumed,
        "branches": branches,
        "methods_s": round(sum(st.values.get("wall_s") or 0.0 for st in states), 1),
        "audit_s": round(sum(st.audit_s or 0.0 for st in states), 1),
        "answers_reused": sum(bool(st.answers_reused) for st in states),
        "wall_s_per_session": round(wall / n_sessions, 1),
    }


class _ProgressFile:
    """Finished states' results, appended one line each, so an interrupted audit resumes. The first line
    says which states bundle and which options the results belong to; a mismatch starts afresh."""

    def __init__(self, states_bundle: Path, digest: str, opts: AuditOptions, branches: str) -> None:
        self.path = states_bundle.with_name(states_bundle.stem + ".audit-progress.jsonl")
        self.head = {"bundle_digest": digest, "options": opts.fingerprint(), "branches": branches}
        self._ours = False  # does the file on disk belong to this audit (same head)?

    def load(self) -> dict[tuple[str, str], StateAudit]:
        out: dict[tuple[str, str], StateAudit] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").split("\n")
            self._ours = json.loads(lines[0]) == self.head
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return out
        for line in lines[1:] if self._ours else []:
            try:
                st = StateAudit.model_validate_json(line)
            except ValidationError:
                continue  # an interrupted last line: that state is audited again
            if not st.error:
                out[(st.session_id, st.method)] = st
        return out

    def append(self, st: StateAudit) -> None:
        torn = self._ours and not self.path.read_bytes().endswith(b"\n")  # a line cut by an interruption
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self._ours else os.O_TRUNC)
        with os.fdopen(os.open(self.path, flags, 0o600), "w", encoding="utf-8") as f:
            if not self._ours:
                f.write(json.dumps(self.head) + "\n")
                self._ours = True
            f.write(("\n" if torn else "") + st.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())


def _session_key(trace: SessionTrace) -> tuple[str, str]:
    return (trace.session.parent_session or trace.session_id, trace.session.method or "recorded")


def _seeds(trace: SessionTrace, opts: AuditOptions, offset: int) -> list[int]:
    return [derive_seed(opts.seed, trace.session.parent_session, "audit", offset + i) for i in range(opts.k)]


def serving_states(
    engine: KVEngine, traces: Sequence[SessionTrace], progress: Progress | None
) -> list[StateAudit]:
    """Serving-layer residue per session, from a state that still holds the carrying observation (the
    recording, or the B0 / B1 / B8 state that keeps it), as the pseudo-method ``serving``."""
    from eu_audit.audits.serving import measure
    from eu_audit.engines.served import OpenAIEngine

    if not isinstance(engine, OpenAIEngine):
        raise BadInput(
            "--serving measures a served engine's prefix cache: "
            "the bundle must be recorded on --engine openai"
        )
    carriers: dict[str, SessionTrace] = {}
    for t in traces:
        sid = t.session.parent_session or t.session_id
        if sid not in carriers and t.graph().entry_blocks(t.session.source_id):
            carriers[sid] = t
    out = []
    for i, (sid, trace) in enumerate(sorted(carriers.items())):
        if progress:
            progress(f"serving residue {sid}", i, len(carriers))
        ep = trace.session.episode
        st = StateAudit(session_id=sid, episode_id=ep.id, suite=trace.session.suite, method=SERVING)
        r = measure(engine, trace)
        st.values = {"residual_cached_tokens": r.residual_cached_tokens, "reset_effective": r.reset_effective}
        if r.residual_cached_tokens is None:
            for m in st.values:
                st.unmeasured[m] = "not measurable: the server does not report cached tokens"
        out.append(st)
    return out


def audit_state(
    trace: SessionTrace,
    runner: ProbeRunner,
    probes: Sequence[Probe],
    opts: AuditOptions,
    *,
    self_floor: bool = False,
    builder: StateBuilder | None = None,
    answered: dict[str, list[tuple[str, list[int]]]] | None = None,
) -> StateAudit:
    """One state's audit: its probes, samples and choices answered by the engine from the rebuilt state,
    then every metric. ``answered`` (shared by the states of one audit): the answers of states already
    asked, by what decides them (``answers_key``); a state that is another's token for token, memory
    and questions included (B7, B5' and B9 are B5's), gets that state's answers instead of being rebuilt
    and asked again: the same tokens an exact engine would decode (``tests/test_audit.py``). The floor
    is always asked itself, as it also samples under seeds of its own from its state."""
    s = trace.session
    ep = s.episode
    st = StateAudit(
        session_id=s.parent_session or s.session_id,
        episode_id=ep.id,
        suite=s.suite,
        method=s.method or "recorded",
    )
    try:
        matcher = trace.matcher()
        art = artifact_leak(trace, ep.tau, matcher)
        st.state_digest = state_digest(trace)
        # every probe, sample and choice is a branch of the state, put in one call (batched where the
        # engine decodes branches together). The call is the same for every method's state of a session,
        # so equal states get equal answers (a batch's composition moves its rounding).
        st.sample_seeds = _seeds(trace, opts, 0)
        choice_step = next((x for x in ep.steps if x.choices), None)
        choices = (choice_step.choices or []) if choice_step is not None else []
        asks = [Ask(*p.render(ep), p.max_tokens) for p in probes]
        asks += [
            Ask(task_request(ep), None, opts.max_tokens, Sampling(opts.temperature, seed))
            for seed in st.sample_seeds
        ]
        if choice_step is not None and choices:
            asks += [
                Ask(choice_step.content, choice_step.cue, 16, Sampling(opts.temperature, seed))
                for seed in st.sample_seeds
            ]
        key = answers_key(trace, asks)
        got = answered.get(key) if answered is not None and not self_floor else None
        if got is None:
            builder = builder or StateBuilder(runner.engine)
            builder.rebuild(trace)
            memory_context(runner, trace, builder)
            got = runner.ask_all(asks)
            if answered is not None:
                answered[key] = got
        else:
            st.answers_reused = True
        answers = iter(got)
        for p in probes:
            text, _ = next(answers)
            st.probes.append(ProbeOutcome(probe=p.id, text=text, leaked=matcher.found_in(text)))
        for _ in st.sample_seeds:
            text, gen = next(answers)
            st.samples.append(text)
            st.sample_ids.append(gen)
        st.choices = [picked(text, choices) for text, _ in answers]
        if self_floor:  # B5 also samples under other seeds, in a call of its own: the sampling floor
            asks = [
                Ask(task_request(ep), None, opts.max_tokens, Sampling(opts.temperature, seed))
                for seed in _seeds(trace, opts, 10_000)
            ]
            for text, gen in runner.ask_all(asks):
                st.floor_samples.append(text)
                st.floor_sample_ids.append(gen)
        st.action_sinks = {k: len(v) for k, v in art.action.items()}
        score(st, StateEvidence("white", trace, matcher, art, st.probes, st.samples, st.choices))
    except EuAuditError:
        raise
    except Exception as exc:  # fail closed: recorded as an error, counted as a failure
        st.error = f"{type(exc).__name__}: {exc}"
    return st


def answers_key(trace: SessionTrace, asks: Sequence[Ask]) -> str:
    """What decides a state's answers: the token ids its cache holds, in order, the memory records the
    probes see (ids and texts, in the order they are shown), and every question with its decoding."""
    memory = [(m.id, m.text) for m in trace.session.memory_final]
    questions = [(a.prompt, a.cue, a.max_tokens, a.sampling.temperature, a.sampling.seed) for a in asks]
    return hashlib.sha256(json.dumps([_cache_ids(trace), memory, questions]).encode()).hexdigest()


def state_digest(trace: SessionTrace) -> str:
    """What the state is: the token ids its cache holds, in order, and its memory store's texts."""
    memory = sorted(m.text for m in trace.session.memory_final)
    return hashlib.sha256(json.dumps([_cache_ids(trace), memory]).encode()).hexdigest()


def _cache_ids(trace: SessionTrace) -> list[list[int]]:
    """The token ids the state's cache holds, block by block (the blocks are how it is prefilled)."""
    return [trace.block(bid).token_ids for bid in trace.session.final_manifest]


def memory_context(runner: ProbeRunner, trace: SessionTrace, builder: StateBuilder) -> None:
    """The post-forget state is the cache *and* the persistent store: the records the agent would
    retrieve next are surfaced once, as the agent surfaces memory, so every probe sees them (B1's delete
    shows here; so does a memory write-back that still holds z)."""
    records = trace.session.memory_final
    if records:
        text = memory_text([(m.id, m.text) for m in records])
        builder.extend(runner.encode(runner.chat.message("system", text)))
