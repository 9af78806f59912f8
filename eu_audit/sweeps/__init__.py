"""``eu-audit sweep``: the paper's exactness, efficiency and ablation sections as commands.

A sweep varies one knob over values; for each value it builds episodes (a suite builder under the
knobs), records them, applies the methods, and writes one row per (value, session, method): the ledger
(transitions, tokens reused / prefilled / decoded, wall time), artifact leakage (any) and CAD vs B5.
Rows go to ``<out>/rows.jsonl`` after every value (atomic rewrite), so an interrupted sweep resumes
where it stopped: values whose rows are all there are not run again.

| sweep | varies | methods | the paper's claim |
|---|---|---|---|
| tau | the target's transition, first to last (fixed T) | b5, b7 | B5 flat; B7 linear in T - tau + 1 |
| indep | fraction of post-target turns independent of z | b5p, b7 | B7 decode falls linearly, B5' flat |
| granularity | checkpoint policy (middle position) | b5, b7 | leakage and CAD flat; only reuse changes |
| position | early / middle / late injection | b5, b7 | leakage flat; cost B7/B5 falls |
| boundary | (none: one value) | excise, b4, b7, b5 | span-only leaks; B4 over-deletes (CAD) |
| depth | derivation depth 0..3 | b3, b7, b5 | B3 degrades with depth; B7 holds |

The three cost sweeps (tau, granularity, position) run without a compaction (depth <= 2); see
``NO_COMPACTION_DEPTH``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from eu_audit import __version__
from eu_audit.audits.leakage import artifact_leak
from eu_audit.audits.metrics import cad
from eu_audit.build_info import command_line, source_commit
from eu_audit.bundle.io import read_bundle
from eu_audit.defaults import ANSWER_MAX_TOKENS
from eu_audit.engines import AUTO, ENGINES, KVEngine, open_engine
from eu_audit.errors import BadInput
from eu_audit.jsonl import atomic_writer
from eu_audit.methods import METHODS
from eu_audit.models import FAST_MODEL, LoadedModel
from eu_audit.progress import Progress
from eu_audit.record import RecordOptions, record
from eu_audit.registry import Registry
from eu_audit.suites.build import build_suite, write_suite
from eu_audit.suites.compose import Knobs
from eu_audit.unlearn import check_engine, unlearn


class SweepRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: str
    value: str
    x: float  # the value on the plot's x axis
    session: str
    episode: str
    method: str
    T: int
    tau: int
    transitions: int
    reused: int | None  # None: the engine could not tell
    prefilled: int
    decoded: int
    recomputed: int
    wall_s: float | None
    leak_any: bool
    cad: float | None
    checkpoint_bytes: int


#: a sweep's plot: draw its rows on the axes, return the facts (fits, ratios) to print under it
PlotFn = Callable[[list["SweepRow"], Any], list[str]]


@dataclass(frozen=True)
class SweepSpec:
    """One sweep: the knob it varies, the methods it applies, the paper's claim and its own plot."""

    name: str
    values: list[str]
    methods: list[str]
    knobs: Callable[[str, Knobs], Knobs]  # value, base knobs -> knobs for that value
    x: Callable[[str], float]
    paper: str  # the paper's claim, quoted beside ours in the report
    plot: PlotFn
    checkpoint_policy: Callable[[str], str | None] = lambda v: None
    describe: str = ""


SWEEPS: Registry[SweepSpec] = Registry("sweeps", builtins=("eu_audit.sweeps.specs",))


@dataclass
class SweepOptions:
    name: str
    out: Path
    model: str = FAST_MODEL
    suite: str = "preference"  # a suite builder
    n: int = 2
    seed: int = 0
    turns_after: int = 6
    max_tokens: int = ANSWER_MAX_TOKENS
    values: list[str] | None = None  # a subset of the sweep's values
    engine: str = AUTO
    command: str = field(default_factory=command_line)


def rows_path(out: Path) -> Path:
    return out / "rows.jsonl"


def load_rows(out: Path) -> list[SweepRow]:
    path = rows_path(out)
    if not path.exists():
        return []
    from pydantic import TypeAdapter

    from eu_audit.jsonl import iter_jsonl

    return [r for _, r in iter_jsonl(path, TypeAdapter(SweepRow))]


def _write_rows(out: Path, rows: list[SweepRow]) -> None:
    with atomic_writer(rows_path(out), private=False) as f:
        for r in rows:
            f.write(r.model_dump_json() + "\n")


def _manifest(opts: SweepOptions, spec: SweepSpec, engine: KVEngine) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "sweep": spec.name,
        "describe": spec.describe,
        "command": opts.command,
        "model": engine.loaded.name,
        "engine": engine.name,
        "engine_facts": engine.facts(),
        "weight_digest": engine.loaded.weight_digest,
        "suite": opts.suite,
        "n": opts.n,
        "seed": opts.seed,
        "turns_after": opts.turns_after,
        "methods": spec.methods,
        "eu_audit": __version__,
        "commit": source_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def run_sweep(
    opts: SweepOptions,
    progress: Progress | None = None,
    loaded: LoadedModel | None = None,
    engine: KVEngine | None = None,
) -> list[SweepRow]:
    spec = SWEEPS.get(opts.name)
    values = opts.values or spec.values
    unknown = [v for v in values if v not in spec.values]
    if unknown:
        raise BadInput(
            f"sweep {spec.name} has no value {', '.join(unknown)} (values: {', '.join(spec.values)})"
        )
    if engine is None:
        name = opts.engine
        if name == AUTO and any(METHODS.get(m).needs for m in spec.methods):
            # a method of this sweep needs an ability (span-only excision: KV tensors): the first engine
            # that has them all
            able = (
                e
                for e, cls in ENGINES.items()
                if all(METHODS.get(m).runs_on(cls.abilities) for m in spec.methods)
            )
            name = next(able, name)
        engine = open_engine(name, opts.model, loaded=loaded)
    check_engine(spec.methods, engine.name)
    opts.out.mkdir(parents=True, exist_ok=True)
    manifest_path = opts.out / "sweep.json"
    manifest = _manifest(opts, spec, engine)
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        keys = ("sweep", "weight_digest", "engine", "suite", "n", "seed", "turns_after")
        same = {k: old.get(k, "hf" if k == "engine" else None) for k in keys}
        if same != {k: manifest[k] for k in same}:
            raise BadInput(
                f"{opts.out} holds a different sweep ({old.get('sweep')}, {old.get('model')}); "
                "choose another --out",
                path=str(manifest_path),
            )
    with atomic_writer(manifest_path, private=False) as f:
        f.write(json.dumps(manifest, indent=1) + "\n")
    rows = load_rows(opts.out)
    done = {r.value for r in rows}
    # half the post-target turns independent, as far as the contamination steps (default depth) leave room
    room = max(0, opts.turns_after - Knobs.model_fields["depth"].default)
    indep = min(0.5, room / opts.turns_after) if opts.turns_after else 0.0
    base = Knobs(seed=opts.seed, n=opts.n, turns_after=opts.turns_after, indep=indep)
    for i, value in enumerate(values):
        if progress:
            progress(f"{spec.name}={value}", i, len(values))
        if value in done:
            continue  # resumed: this value's rows are already written
        rows += _run_value(spec, value, base, opts, engine)
        _write_rows(opts.out, rows)
    if progress:
        progress(f"{spec.name} done", len(values), len(values))
    return rows


def _run_value(
    spec: SweepSpec, value: str, base: Knobs, opts: SweepOptions, engine: KVEngine
) -> list[SweepRow]:
    from eu_audit.checkpoints import CheckpointPolicy

    work = opts.out / f"{spec.name}-{value}"
    work.mkdir(parents=True, exist_ok=True)
    episodes = build_suite(opts.suite, spec.knobs(value, base))
    suite_file = write_suite(episodes, work / "episodes.jsonl", force=True)
    trace = work / "trace.jsonl"
    policy = spec.checkpoint_policy(value)
    record(
        RecordOptions(
            suite=str(suite_file),
            model=engine.loaded.name,
            engine=engine.name,
            seed=opts.seed,
            out=trace,
            force=True,
            max_tokens=opts.max_tokens,
            checkpoint_policy=CheckpointPolicy(policy) if policy else None,
        ),
        engine=engine,
    )
    states = unlearn(trace, spec.methods, work / "states.jsonl", force=True, engine=engine).bundle
    recorded = {s.session_id: s for s in read_bundle(trace).sessions}
    by = {(s.session.parent_session, s.session.method): s for s in states.sessions}
    rows = []
    for (sid, method), st in by.items():
        assert sid is not None and method is not None
        ep = st.session.episode
        ledger = st.ledgers[-1]
        ref = by.get((sid, "b5"))
        leak = artifact_leak(st, ep.tau)
        rows.append(
            SweepRow(
                sweep=spec.name,
                value=value,
                x=spec.x(value),
                session=sid,
                episode=ep.id,
                method=method,
                T=len(ep.steps),
                tau=ep.tau,
                transitions=ledger.transitions_replayed,
                reused=ledger.tokens_reused,
                prefilled=ledger.tokens_prefilled,
                decoded=ledger.tokens_decoded,
                recomputed=ledger.tokens_prefilled + ledger.tokens_decoded,
                wall_s=ledger.wall_s,
                leak_any=leak.any,
                cad=cad(st, ref, ep.tau) if ref is not None else None,
                checkpoint_bytes=sum(c.nbytes() for c in recorded[sid].checkpoints),
            )
        )
    return rows


@dataclass(frozen=True)
class Fit:
    slope: float
    intercept: float
    r2: float
    n: int


def fit_line(x: list[float], y: list[float]) -> Fit:
    """Least-squares line and R^2 (scipy.stats.linregress); R^2 = 1 for an exact line, 0 for a flat y."""
    from scipy.stats import linregress

    if len(x) < 2 or len(set(x)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    if len(set(y)) == 1:
        return Fit(0.0, y[0], 0.0, len(x))
    res = linregress(x, y)
    return Fit(float(res.slope), float(res.intercept), float(res.rvalue**2), len(x))
