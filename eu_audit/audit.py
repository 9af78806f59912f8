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
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from pydantic import ValidationError

from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.metric import METRICS
from eu_audit.audits.metrics import (
    attacked,
    cad,
    ngram_distance,
    picked,
    token_agreement,
    tool_consistency,
    tool_distribution,
    total_variation,
    utility,
)
from eu_audit.audits.model import FLOOR, SERVING, AuditReport, Cell, ProbeOutcome, StateAudit
from eu_audit.audits.probes import Ask, Probe, ProbeRunner, load_probes, task_request
from eu_audit.bundle.io import file_digest, read_bundle
from eu_audit.errors import BadInput, EuAuditError
from eu_audit.runtime.agent import derive_seed
from eu_audit.runtime.engine import KVEngine, Sampling
from eu_audit.runtime.memory import memory_text
from eu_audit.runtime.models import LoadedModel
from eu_audit.stats import mcnemar_exact, tost_paired, wilcoxon_paired
from eu_audit.trace.session import Bundle, SessionTrace
from eu_audit.trace.state import StateBuilder
from eu_audit.unlearn import check_bundle_model, engine_for, parse_methods, unlearn

Progress = Callable[[str, int, int], None]
#: metrics that compare a state with B5's: not measured without the floor
FLOOR_RELATIVE = ("cad", "agreement", "tool_consistency", "tool_tv", "ngram", "embed")


@dataclass
class AuditOptions:
    methods: Sequence[str] = ("all",)
    floor: bool = True
    k: int = 5
    temperature: float = 0.7
    max_tokens: int = 32
    margin: float = 0.1
    alpha: float = 0.05  # the gates' one-sided significance level
    seed: int = 0
    unlearned_out: Path | None = None
    serving: bool = False  # also measure serving-layer residue (a served engine's prefix cache)
    server: str | None = None  # a served bundle's server, overriding the one its header records

    def fingerprint(self) -> str:
        """What a state's results depend on besides the state: resumed results must match it."""
        keys = ("k", "temperature", "max_tokens", "seed")
        d = {k: v for k, v in asdict(self).items() if k in keys}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AuditPlan:
    """What an audit will measure, known before any model runs: its methods (the floor included) and the
    suites its sessions come from."""

    methods: list[str]
    suites: list[str]


def audit_plan(path: str | Path, opts: AuditOptions) -> AuditPlan:
    bundle = read_bundle(path)
    suites = list(dict.fromkeys(s.session.suite for s in bundle.sessions))
    wanted = None if list(opts.methods) == ["all"] else set(parse_methods(list(opts.methods)))
    if any(s.session.method for s in bundle.sessions):
        present = list(dict.fromkeys(s.session.method or "recorded" for s in bundle.sessions))
        planned = [m for m in present if wanted is None or m in wanted or (opts.floor and m == FLOOR)]
        return AuditPlan([*planned, SERVING] if opts.serving else planned, suites)
    names = parse_methods(list(opts.methods), bundle.header.engine)
    names = [*names, FLOOR] if opts.floor and FLOOR not in names else names
    return AuditPlan([*names, SERVING] if opts.serving else names, suites)


def ensure_post_forget(
    path: Path, opts: AuditOptions, engine: Callable[[Bundle], KVEngine], progress: Progress | None
) -> tuple[Bundle, Path | None]:
    """A bundle ``unlearn`` produced is used as is; a recorded one gets the methods applied first (written
    next to it, reused when it is already there for the same input and methods)."""
    bundle = read_bundle(path)
    if any(s.session.method for s in bundle.sessions):
        return bundle, None
    names = parse_methods(list(opts.methods), bundle.header.engine)
    if opts.floor and FLOOR not in names:
        names.append(FLOOR)
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
    if bundle.header.engine == "agent":  # a black-box run: everything is in the bundle, no model runs
        from eu_audit.blackbox.audit import agent_states

        if opts.serving:
            raise BadInput("--serving audits a served engine's cache; a black-box bundle has no engine")
        agent, opts.k, opts.temperature = agent_states(bundle)
        probe_ids = [p.id for p in load_probes()]
        report = summarise(
            bundle, path, None, bundle.header.model.name, opts, probe_ids, agent, bundle.sessions
        )
        report.engine = "agent"
        report.cost = {"wall_s": round(time.perf_counter() - t0, 1), "engine": "agent (no model runs)"}
        return report
    wanted = None if list(opts.methods) == ["all"] else set(parse_methods(list(opts.methods)))
    sessions = [
        s
        for s in bundle.sessions
        if wanted is None or s.session.method in wanted or (opts.floor and s.session.method == FLOOR)
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
    branches = "batched" if getattr(eng, "decode_branches", None) else "one by one"
    progress_file = _ProgressFile(Path(unlearned or path), bundle.digest or "", opts, branches)
    done = progress_file.load()
    builder = StateBuilder(eng)
    # one session's states one after another: they share every segment before tau, which stays cached
    order = sorted(range(len(sessions)), key=lambda j: _session_key(sessions[j])[0])
    by_index: dict[int, StateAudit] = {}
    for i, j in enumerate(order):
        trace = sessions[j]
        key = _session_key(trace)
        if progress:
            progress(f"audit {key[0]} {key[1]}", i, len(sessions))
        st = done.get(key)
        if st is None:
            started = time.perf_counter()
            st = audit_state(
                trace, runner, probes, opts, self_floor=trace.session.method == FLOOR, builder=builder
            )
            st.audit_s = round(time.perf_counter() - started, 3)
            progress_file.append(st)
        by_index[j] = st
    states = [by_index[j] for j in range(len(sessions))]
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
    wall = time.perf_counter() - t0
    n_sessions = len({s.session_id for s in states}) or 1
    report.cost = {
        "wall_s": round(wall, 1),
        "engine": eng.name,
        "cores": os.cpu_count() or 0,
        "states": len(states),
        "resumed_states": len(done),
        "branches": branches,
        # the whole job, resumed parts included: each method's own time (its ledger) and each audit's
        "methods_s": round(sum(st.values.get("wall_s") or 0.0 for st in states), 1),
        "audit_s": round(sum(st.audit_s or 0.0 for st in states), 1),
        "wall_s_per_session": round(wall / n_sessions, 1),
    }
    return report


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
    from eu_audit.runtime.served import OpenAIEngine

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
) -> StateAudit:
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
        builder = builder or StateBuilder(runner.engine)
        builder.rebuild(trace)
        memory_context(runner, trace, builder)
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
        answers = iter(runner.ask_all(asks))
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
        excluded = ep.meta.get("excluded")
        valid = [c for c in st.choices if c is not None]
        ledger = trace.ledgers[-1] if trace.ledgers else None
        st.action_sinks = {k: len(v) for k, v in art.action.items()}
        st.values = {
            "leak_exact": float(bool(art.exact)),
            "leak_action": float(bool(art.action)),
            "leak_any": float(art.any),
            "leak5": float(any(matcher.found_in(t) for t in st.samples)),
            "utility": utility(trace),
            "attacked": attacked(trace),
            "avoid": (sum(c != excluded for c in valid) / len(valid)) if valid and excluded else None,
            "says_it": float(art.any or any(p.leaked for p in st.probes)) if excluded else None,
            "recomputed": float(ledger.tokens_prefilled + ledger.tokens_decoded) if ledger else None,
            "decoded": float(ledger.tokens_decoded) if ledger else None,
            "wall_s": ledger.wall_s if ledger else None,
        }
    except EuAuditError:
        raise
    except Exception as exc:  # fail closed: recorded as an error, counted as a failure
        st.error = f"{type(exc).__name__}: {exc}"
    return st


def state_digest(trace: SessionTrace) -> str:
    """What the state is: the token ids its cache holds, in order, and its memory store's texts."""
    cache = [trace.block(bid).token_ids for bid in trace.session.final_manifest]
    memory = sorted(m.text for m in trace.session.memory_final)
    return hashlib.sha256(json.dumps([cache, memory]).encode()).hexdigest()


def memory_context(runner: ProbeRunner, trace: SessionTrace, builder: StateBuilder) -> None:
    """The post-forget state is the cache *and* the persistent store: the records the agent would
    retrieve next are surfaced once, as the agent surfaces memory, so every probe sees them (B1's delete
    shows here; so does a memory write-back that still holds z)."""
    records = trace.session.memory_final
    if records:
        text = memory_text([(m.id, m.text) for m in records])
        builder.extend(runner.encode(runner.chat.message("system", text)))


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return fmean(vals) if vals else None


def _floor_relative(st: StateAudit, ref: StateAudit, mine: SessionTrace, ref_trace: SessionTrace) -> None:
    from eu_audit.audits.embed import embedding_distance

    st.values["cad"] = cad(mine, ref_trace, mine.session.episode.tau)
    st.values["agreement"] = token_agreement(st.sample_ids, ref.sample_ids)
    if st.values["agreement"] is None and st.samples:
        st.unmeasured["agreement"] = "not measurable: the samples carry no token ids (a black-box agent)"
    st.values["tool_consistency"] = tool_consistency(st.samples, ref.samples)
    st.values["tool_tv"] = total_variation(tool_distribution(st.samples), tool_distribution(ref.samples))
    st.values["ngram"] = ngram_distance(st.samples, ref.samples)
    st.values["embed"] = embedding_distance(st.samples, ref.samples)


def summarise(
    bundle: Bundle,
    path: Path,
    unlearned: Path | None,
    model: str,
    opts: AuditOptions,
    probes_ids: list[str],
    states: list[StateAudit],
    sessions: list[SessionTrace],
) -> AuditReport:
    suites = sorted({s.suite for s in states})
    by_key = {(s.session_id, s.method): s for s in states}
    traces = {(t.session.parent_session or t.session_id, t.session.method or "recorded"): t for t in sessions}
    dropped = drop_probes(states, probes_ids)
    for st in states:
        if st.error:
            continue
        ref = by_key.get((st.session_id, FLOOR))
        ref_trace = traces.get((st.session_id, FLOOR))
        mine = traces.get((st.session_id, st.method))
        if not opts.floor or ref is None or ref.error or ref_trace is None or mine is None:
            for m in FLOOR_RELATIVE:
                st.values.pop(m, None)
                st.unmeasured[m] = "not measured: no B5 floor state for this session"
            continue
        _floor_relative(st, ref, mine, ref_trace)
    methods = method_order(states)
    return AuditReport(
        bundle=str(path),
        bundle_digest=file_digest(path),
        unlearned=str(unlearned) if unlearned else None,
        model=model,
        model_digest=bundle.header.model.weight_digest,
        engine_facts=dict(bundle.header.engine_facts),
        seed=opts.seed,
        k=opts.k,
        temperature=opts.temperature,
        margin=opts.margin,
        alpha=opts.alpha,
        floor=opts.floor,
        methods=methods,
        suites=suites,
        probes=probes_ids,
        probes_dropped=dropped,
        floor_self=floor_self_of(states),
        states=states,
        cells=cells_of(states, methods, opts.margin, opts.floor),
        errors=sum(1 for s in states if s.error),
    )


def method_order(states: Sequence[StateAudit]) -> list[str]:
    from eu_audit.methods import ORDER

    return sorted(
        dict.fromkeys(s.method for s in states),
        key=lambda m: (m not in ORDER, ORDER.index(m) if m in ORDER else 0, m),
    )


def drop_probes(states: Sequence[StateAudit], probes_ids: Sequence[str]) -> dict[str, list[str]]:
    """Per suite, the probes that leak on the floor itself (dropped); every state's Leak@probes over the
    kept ones. Over all the run's sessions: merged shards drop what one run would."""
    dropped: dict[str, list[str]] = {}
    for suite in sorted({s.suite for s in states}):
        floor_states = [s for s in states if s.suite == suite and s.method == FLOOR and not s.error]
        dropped[suite] = [
            p for p in probes_ids if any(o.leaked for s in floor_states for o in s.probes if o.probe == p)
        ]
    for st in states:
        if not st.error:
            kept = [o for o in st.probes if o.probe not in dropped.get(st.suite, [])]
            st.values["leak_probes"] = float(any(o.leaked for o in kept))
    return dropped


def floor_self_of(states: Sequence[StateAudit]) -> dict[str, dict[str, float | None]]:
    """Per suite, B5 against itself under other seeds: the sampling floor."""
    from eu_audit.audits.embed import embedding_distance

    out: dict[str, dict[str, float | None]] = {}
    for suite in sorted({s.suite for s in states}):
        refs = [
            s for s in states if s.suite == suite and s.method == FLOOR and not s.error and s.floor_samples
        ]
        if refs:
            out[suite] = {
                "ngram": _mean([ngram_distance(r.samples, r.floor_samples) for r in refs]),
                "embed": _mean([embedding_distance(r.samples, r.floor_samples) for r in refs]),
                "tool_tv": _mean(
                    [
                        total_variation(tool_distribution(r.samples), tool_distribution(r.floor_samples))
                        for r in refs
                    ]
                ),
                "agreement": _mean([token_agreement(r.sample_ids, r.floor_sample_ids) for r in refs]),
            }
    return out


def cells_of(states: Sequence[StateAudit], methods: Sequence[str], margin: float, floor: bool) -> list[Cell]:
    suites = sorted({s.suite for s in states})
    return [_cell(m, suite, list(states), margin, floor) for m in methods for suite in [*suites, "all"]]


def _cell(method: str, suite: str, states: list[StateAudit], margin: float, with_floor: bool) -> Cell:
    def pick(m: str) -> list[StateAudit]:
        return [s for s in states if s.method == m and (suite == "all" or s.suite == suite)]

    mine = pick(method)
    ok = [s for s in mine if not s.error]
    floor_by = {s.session_id: s for s in pick(FLOOR) if not s.error} if with_floor else {}
    values: dict[str, float | None] = {}
    floor_vals: dict[str, float | None] = {}
    p: dict[str, float | None] = {}
    tost: dict[str, float | None] = {}
    unmeasured: dict[str, str] = {}
    for m in METRICS.in_order():
        values[m.name] = _mean([s.values.get(m.name) for s in ok])
        floor_vals[m.name] = _mean([s.values.get(m.name) for s in floor_by.values()])
        if values[m.name] is None:
            reasons = sorted({s.unmeasured[m.name] for s in ok if m.name in s.unmeasured})
            if reasons:
                unmeasured[m.name] = "; ".join(reasons)
        pairs = [
            (s.values.get(m.name), floor_by[s.session_id].values.get(m.name))
            for s in ok
            if s.session_id in floor_by
        ]
        pairs_f = [(a, b) for a, b in pairs if a is not None and b is not None]
        if method == FLOOR or not pairs_f:
            p[m.name], tost[m.name] = None, None
            continue
        xs, ys = [a for a, _ in pairs_f], [b for _, b in pairs_f]
        if m.binary:
            p[m.name] = mcnemar_exact([x > 0 for x in xs], [y > 0 for y in ys]).p
        else:
            p[m.name] = wilcoxon_paired(xs, ys)
        tost[m.name] = tost_paired(xs, ys, margin)
    return Cell(
        method=method,
        suite=suite,
        n=len(mine),
        errors=len(mine) - len(ok),
        values=values,
        floor=floor_vals,
        p=p,
        tost=tost,
        unmeasured=unmeasured,
    )


def audit_rows(report: AuditReport) -> list[dict[str, Any]]:
    """One flat row per state (session x method) with every metric, for analysis as a data set."""
    rows = []
    for st in report.states:
        row: dict[str, Any] = {
            "session_id": st.session_id,
            "episode_id": st.episode_id,
            "suite": st.suite,
            "method": st.method,
            "error": st.error or "",
        }
        for m in METRICS.in_order():
            v = st.values.get(m.name)
            row[m.name] = None if v is None else float(v)
        rows.append(row)
    return rows
