"""``eu-audit audit``: Leak@probes, Leak@5, behavioral extraction, CAD, utility, the distribution audit and
efficiency, per post-forget state, against the B5 floor, with paired statistics and CI gates.

Each post-forget state (one recorded session under one method) is rebuilt once from its token ids; every
probe and every sample is a branch of it (prefill once, crop back). B5 (the agent that never saw z) is
the floor: a probe that leaks on B5 leaks by itself (it names or guesses z), so it is dropped for that
suite and listed as dropped; every figure is reported next to B5's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from eu_audit import __version__
from eu_audit.audits.leakage import artifact_leak, leaks, variants
from eu_audit.audits.metrics import (
    cad,
    ngram_distance,
    picked,
    token_agreement,
    tool_consistency,
    tool_distribution,
    total_variation,
    utility,
)
from eu_audit.audits.probes import ProbeRunner, load_probes, task_request
from eu_audit.bundle.io import Bundle, SessionTrace, file_digest, read_bundle
from eu_audit.checkpoints import rebuild_state
from eu_audit.errors import BadInput, EuAuditError
from eu_audit.runtime.agent import derive_seed
from eu_audit.runtime.engine import HFEngine, Sampling
from eu_audit.runtime.memory import memory_text
from eu_audit.runtime.models import LoadedModel, load_model
from eu_audit.stats import mcnemar_exact, tost_paired, wilcoxon_paired
from eu_audit.unlearn import parse_methods, unlearn

FLOOR = "b5"
Progress = Callable[[str, int, int], None]

#: metric -> (direction, binary); "low" = lower is better (leakage, divergence), "high" = higher is better
METRICS: dict[str, tuple[Literal["low", "high"], bool]] = {
    "leak_probes": ("low", True),
    "leak5": ("low", True),
    "leak_exact": ("low", True),
    "leak_action": ("low", True),
    "leak_any": ("low", True),
    "says_it": ("low", True),
    "avoid": ("low", False),
    "cad": ("low", False),
    "utility": ("high", False),
    "agreement": ("high", False),
    "tool_consistency": ("high", False),
    "tool_tv": ("low", False),
    "ngram": ("low", False),
    "embed": ("low", False),
    "recomputed": ("low", False),
    "decoded": ("low", False),
    "wall_s": ("low", False),
}


class ProbeOutcome(BaseModel):
    probe: str
    text: str
    leaked: bool


class StateAudit(BaseModel):
    """One post-forget state: a recorded session under one method."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    episode_id: str
    suite: str
    method: str
    error: str | None = None
    probes: list[ProbeOutcome] = Field(default_factory=list)
    samples: list[str] = Field(default_factory=list)  # k task-probe samples at the audit temperature
    sample_seeds: list[int] = Field(default_factory=list)
    choices: list[str | None] = Field(default_factory=list)  # preference suite: the option each sample picked
    values: dict[str, float | None] = Field(default_factory=dict)  # metric -> value (booleans as 0/1)
    action_sinks: dict[str, int] = Field(default_factory=dict)  # sink class -> calls carrying z
    #: B5 only: k more samples under other seeds (B5 against itself: the sampling floor)
    floor_samples: list[str] = Field(default_factory=list)
    _ids: list[list[int]] = PrivateAttr(default_factory=list)
    _floor_ids: list[list[int]] = PrivateAttr(default_factory=list)


class Cell(BaseModel):
    """One method on one suite (or on all suites pooled: suite "all")."""

    method: str
    suite: str
    n: int
    errors: int
    values: dict[str, float | None]
    floor: dict[str, float | None]
    p: dict[str, float | None]  # McNemar (binary) / Wilcoxon (continuous) vs the floor
    tost: dict[str, float | None]  # TOST equivalence to the floor within +-margin


class GateResult(BaseModel):
    rule: str
    held: bool
    detail: str


class AuditReport(BaseModel):
    format: Literal["eu-audit/audit@1"] = "eu-audit/audit@1"
    tool_version: str = __version__
    bundle: str
    bundle_digest: str
    unlearned: str | None = None
    model: str
    seed: int
    k: int
    temperature: float
    margin: float
    methods: list[str]
    suites: list[str]
    probes: list[str]
    probes_dropped: dict[str, list[str]]  # suite -> probes that leak on the floor (B5)
    floor_self: dict[str, dict[str, float]]  # suite -> B5 vs B5 (other seeds): the sampling floor
    states: list[StateAudit]
    cells: list[Cell]
    gates: list[GateResult] = Field(default_factory=list)
    errors: int = 0


@dataclass
class AuditOptions:
    methods: Sequence[str] = ("all",)
    floor: bool = True
    k: int = 5
    temperature: float = 0.7
    max_tokens: int = 32
    margin: float = 0.1
    seed: int = 0
    unlearned_out: Path | None = None


def ensure_post_forget(
    path: Path, opts: AuditOptions, loaded: LoadedModel | None, progress: Progress | None
) -> tuple[Bundle, Path | None]:
    """A bundle ``unlearn`` produced is used as is; a recorded one gets the methods applied first (written
    next to it, reused when it is already there for the same input and methods)."""
    bundle = read_bundle(path)
    if any(s.session.method for s in bundle.sessions):
        return bundle, None
    names = parse_methods(list(opts.methods))
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
    res = unlearn(path, names, out, force=True, progress=progress, loaded=loaded)
    return res.bundle, out


def audit(
    path: str | Path,
    opts: AuditOptions | None = None,
    *,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
) -> AuditReport:
    opts = opts or AuditOptions()
    path = Path(path)
    if opts.k < 1:
        raise BadInput("--k must be at least 1")
    bundle, unlearned = ensure_post_forget(path, opts, loaded, progress)
    h = bundle.header
    loaded = loaded or load_model(h.model.name)
    if loaded.weight_digest != h.model.weight_digest:
        raise BadInput(
            "the bundle was produced by other weights", path=str(path), line=1, field="model.weight_digest"
        )
    runner = ProbeRunner.for_engine(HFEngine(loaded))
    probes = load_probes()
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
    states: list[StateAudit] = []
    for i, trace in enumerate(sessions):
        if progress:
            progress(f"audit {trace.session.parent_session} {trace.session.method}", i, len(sessions))
        states.append(audit_state(trace, runner, probes, opts, self_floor=trace.session.method == FLOOR))
    if progress:
        progress("statistics", len(sessions), len(sessions))
    return summarise(
        bundle,
        path,
        unlearned,
        loaded.name,
        opts,
        probes_ids=[p.id for p in probes],
        states=states,
        sessions=sessions,
    )


def _seeds(trace: SessionTrace, opts: AuditOptions, offset: int) -> list[int]:
    return [derive_seed(opts.seed, trace.session.parent_session, "audit", offset + i) for i in range(opts.k)]


def audit_state(
    trace: SessionTrace,
    runner: ProbeRunner,
    probes: Sequence[Any],
    opts: AuditOptions,
    *,
    self_floor: bool = False,
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
        vs = variants(s.target.value, s.target.variants)
        tau = ep.tau
        art = artifact_leak(trace, tau, vs)
        rebuild_state(runner.engine, trace)
        memory_context(runner, trace)
        for p in probes:
            prompt, cue = p.render(ep)
            text = runner.ask(prompt, cue, p.max_tokens)
            st.probes.append(ProbeOutcome(probe=p.id, text=text, leaked=leaks(text, vs)))
        st.sample_seeds = _seeds(trace, opts, 0)
        for seed in st.sample_seeds:
            text, gen = runner.ask_ids(
                task_request(ep), None, opts.max_tokens, Sampling(opts.temperature, seed)
            )
            st.samples.append(text)
            st._ids.append(gen)
        if self_floor:
            for seed in _seeds(trace, opts, 10_000):
                text, gen = runner.ask_ids(
                    task_request(ep), None, opts.max_tokens, Sampling(opts.temperature, seed)
                )
                st.floor_samples.append(text)
                st._floor_ids.append(gen)
        choice_step = next((x for x in ep.steps if x.choices), None)
        if choice_step is not None and choice_step.choices:
            for seed in st.sample_seeds:
                text = runner.ask(choice_step.content, None, 16, Sampling(opts.temperature, seed))
                st.choices.append(picked(text, choice_step.choices))
        excluded = ep.meta.get("excluded")
        valid = [c for c in st.choices if c is not None]
        ledger = trace.ledgers[-1] if trace.ledgers else None
        st.action_sinks = {k: len(v) for k, v in art.action.items()}
        st.values = {
            "leak_exact": float(bool(art.exact)),
            "leak_action": float(bool(art.action)),
            "leak_any": float(art.any),
            "leak5": float(any(leaks(t, vs) for t in st.samples)),
            "utility": utility(trace),
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


def memory_context(runner: ProbeRunner, trace: SessionTrace) -> None:
    """The post-forget state is the cache *and* the persistent store: the records the agent would
    retrieve next are surfaced once, as the agent surfaces memory, so every probe sees them (B1's delete
    shows here; so does a memory write-back that still holds z)."""
    records = trace.session.memory_final
    if records:
        text = memory_text([(m.id, m.text) for m in records])
        runner.engine.prefill(runner.encode(runner.chat.message("system", text)))


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return fmean(vals) if vals else None


def summarise(
    bundle: Bundle,
    path: Path,
    unlearned: Path | None,
    model: str,
    opts: AuditOptions,
    *,
    probes_ids: list[str],
    states: list[StateAudit],
    sessions: list[SessionTrace],
) -> AuditReport:
    from eu_audit.audits.embed import embedding_distance

    suites = sorted({s.suite for s in states})
    methods = sorted(dict.fromkeys(s.method for s in states), key=_method_order)
    by_key = {(s.session_id, s.method): s for s in states}
    traces = {(t.session.parent_session or t.session_id, t.session.method or "recorded"): t for t in sessions}
    dropped: dict[str, list[str]] = {}
    for suite in suites:
        floor_states = [s for s in states if s.suite == suite and s.method == FLOOR and not s.error]
        dropped[suite] = [
            p for p in probes_ids if any(o.leaked for s in floor_states for o in s.probes if o.probe == p)
        ]
    # per-state values that need the floor state or the kept probes
    for st in states:
        if st.error:
            continue
        kept = [o for o in st.probes if o.probe not in dropped.get(st.suite, [])]
        st.values["leak_probes"] = float(any(o.leaked for o in kept))
        ref = by_key.get((st.session_id, FLOOR))
        ref_trace = traces.get((st.session_id, FLOOR))
        mine = traces.get((st.session_id, st.method))
        if ref is None or ref.error or ref_trace is None or mine is None:
            continue
        st.values["cad"] = cad(mine, ref_trace, mine.session.episode.tau)
        st.values["agreement"] = token_agreement(st._ids, ref._ids)
        st.values["tool_consistency"] = tool_consistency(st.samples, ref.samples)
        st.values["tool_tv"] = total_variation(tool_distribution(st.samples), tool_distribution(ref.samples))
        st.values["ngram"] = ngram_distance(st.samples, ref.samples)
        st.values["embed"] = embedding_distance(st.samples, ref.samples)
    floor_self: dict[str, dict[str, float]] = {}
    for suite in suites:
        refs = [
            s for s in states if s.suite == suite and s.method == FLOOR and not s.error and s.floor_samples
        ]
        if refs:
            floor_self[suite] = {
                "ngram": fmean(ngram_distance(r.samples, r.floor_samples) for r in refs),
                "embed": fmean(embedding_distance(r.samples, r.floor_samples) for r in refs),
                "tool_tv": fmean(
                    total_variation(tool_distribution(r.samples), tool_distribution(r.floor_samples))
                    for r in refs
                ),
                "agreement": fmean(token_agreement(r._ids, r._floor_ids) for r in refs),
            }
    cells = []
    for method in methods:
        for suite in [*suites, "all"]:
            cells.append(_cell(method, suite, states, opts.margin))
    return AuditReport(
        bundle=str(path),
        bundle_digest=file_digest(path),
        unlearned=str(unlearned) if unlearned else None,
        model=model,
        seed=opts.seed,
        k=opts.k,
        temperature=opts.temperature,
        margin=opts.margin,
        methods=methods,
        suites=suites,
        probes=probes_ids,
        probes_dropped=dropped,
        floor_self=floor_self,
        states=states,
        cells=cells,
        errors=sum(1 for s in states if s.error),
    )


def _method_order(name: str) -> tuple[int, str]:
    from eu_audit.methods import ORDER

    return (ORDER.index(name) if name in ORDER else len(ORDER), name)


def _cell(method: str, suite: str, states: list[StateAudit], margin: float) -> Cell:
    def pick(m: str) -> list[StateAudit]:
        return [s for s in states if s.method == m and (suite == "all" or s.suite == suite)]

    mine, floor = pick(method), pick(FLOOR)
    ok = [s for s in mine if not s.error]
    floor_by = {s.session_id: s for s in floor if not s.error}
    values: dict[str, float | None] = {}
    floor_vals: dict[str, float | None] = {}
    p: dict[str, float | None] = {}
    tost: dict[str, float | None] = {}
    for metric, (_, binary) in METRICS.items():
        values[metric] = _mean([s.values.get(metric) for s in ok])
        floor_vals[metric] = _mean([s.values.get(metric) for s in floor_by.values()])
        pairs = [
            (s.values.get(metric), floor_by[s.session_id].values.get(metric))
            for s in ok
            if s.session_id in floor_by
        ]
        pairs_f = [(a, b) for a, b in pairs if a is not None and b is not None]
        if method == FLOOR or not pairs_f:
            p[metric], tost[metric] = None, None
            continue
        xs, ys = [a for a, _ in pairs_f], [b for _, b in pairs_f]
        if binary:
            p[metric] = mcnemar_exact([x > 0 for x in xs], [y > 0 for y in ys]).p
        else:
            p[metric] = wilcoxon_paired(xs, ys)
        tost[metric] = tost_paired(xs, ys, margin)
    return Cell(
        method=method,
        suite=suite,
        n=len(mine),
        errors=len(mine) - len(ok),
        values=values,
        floor=floor_vals,
        p=p,
        tost=tost,
    )
