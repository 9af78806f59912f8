"""The six sweeps of the paper's ablations, each with its knobs, its claim and its plot.

The cost sweeps (tau, granularity, position) stop at depth 2 (answer and plan, no compaction). A
compaction after the target rebuilds the cache without the clean prefix, so every method, B7 included,
must re-prefill that prefix from recorded ids whatever tau, the checkpoint policy or the position: the
knob being swept would no longer be what moves the cost. The depth sweep is where compaction is studied.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any

from eu_audit.suites.compose import Knobs
from eu_audit.sweeps import SWEEPS, SweepRow, SweepSpec, fit_line

NO_COMPACTION_DEPTH = 2
TOTAL_T = 8  # the tau sweep's fixed session length (the target moves from transition 1 to T)
POLICIES = ["every_turn", "semantic", "session_start"]
POSITIONS = ["early", "middle", "late"]


def _without_compaction(base: Knobs, **update: Any) -> Knobs:
    knobs = base.model_copy(update=update)
    return knobs.model_copy(update={"depth": min(knobs.depth, NO_COMPACTION_DEPTH, knobs.turns_after)})


def _tau_knobs(v: str, base: Knobs) -> Knobs:
    tau = int(v)
    return _without_compaction(base, setup=tau - 1, turns_after=TOTAL_T - tau, indep=0.0)


def _methods(rows: list[SweepRow]) -> list[str]:
    return list(dict.fromkeys(r.method for r in rows))


def _mean_by(rows: list[SweepRow], key: str, method: str) -> dict[float, float]:
    acc: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        if r.method == method:
            acc[r.x].append(float(getattr(r, key)))
    return {x: fmean(v) for x, v in sorted(acc.items())}


def _bars(rows: list[SweepRow], ax: Any, metric: str, ylabel: str) -> list[str]:
    labels = list(dict.fromkeys(r.value for r in rows))
    methods = _methods(rows)
    width = 0.8 / max(1, len(methods))
    for k, m in enumerate(methods):
        ys = [
            fmean(float(getattr(r, metric) or 0) for r in rows if r.value == v and r.method == m)
            for v in labels
        ]
        ax.bar([i + k * width for i in range(len(labels))], ys, width=width, label=m)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_ylabel(ylabel)
    if metric == "leak_any":
        ax.set_ylim(0, 1.05)  # a rate: an all-zero sweep reads as zero, not as an empty axis
    return []


def plot_tau(rows: list[SweepRow], ax: Any) -> list[str]:
    facts = []
    for m in _methods(rows):
        pts = [(float(r.T - r.tau + 1), float(r.recomputed)) for r in rows if r.method == m]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.scatter(xs, ys, label=m, s=14)
        fit = fit_line(xs, ys)
        facts.append(
            f"{m}: recomputed = {fit.slope:.1f} x (T - tau + 1) + {fit.intercept:.0f}, "
            f"R^2 = {fit.r2:.3f} (n = {fit.n})"
        )
        trans = [(float(r.T - r.tau + 1), float(r.transitions)) for r in rows if r.method == m]
        tf = fit_line([t[0] for t in trans], [t[1] for t in trans])
        facts.append(
            f"{m}: transitions replayed = {tf.slope:.2f} x (T - tau + 1) + {tf.intercept:.2f}, "
            f"R^2 = {tf.r2:.3f}"
        )
    ax.set_xlabel("T - tau + 1")
    ax.set_ylabel("recomputed tokens")
    return facts


def plot_indep(rows: list[SweepRow], ax: Any) -> list[str]:
    facts = []
    for m in _methods(rows):
        series = _mean_by(rows, "decoded", m)
        ax.plot(list(series), list(series.values()), marker="o", label=m)
        if len(series) > 1:
            fit = fit_line(list(series), list(series.values()))
            facts.append(f"{m}: decoded = {fit.slope:.0f} x indep + {fit.intercept:.0f}, R^2 = {fit.r2:.3f}")
    ax.set_xlabel("indep (fraction of post-target turns independent of z)")
    ax.set_ylabel("decoded tokens (mean)")
    return facts


def plot_granularity(rows: list[SweepRow], ax: Any) -> list[str]:
    _bars(rows, ax, "reused", "reused tokens (mean)")
    facts = []
    first = _methods(rows)[0]
    for v in dict.fromkeys(r.value for r in rows):
        cb = fmean(r.checkpoint_bytes for r in rows if r.value == v and r.method == first)
        kept = fmean(r.reused or 0 for r in rows if r.value == v and r.method == "b7")
        facts.append(f"{v}: checkpoint metadata {cb:.0f} bytes per session; B7 reuses {kept:.0f} tokens")
    return facts


def plot_position(rows: list[SweepRow], ax: Any) -> list[str]:
    _bars(rows, ax, "recomputed", "recomputed tokens (mean)")
    facts = []
    for v in dict.fromkeys(r.value for r in rows):

        def mean(key: str, method: str, v: str = v) -> float:
            return fmean(float(getattr(r, key)) for r in rows if r.value == v and r.method == method)

        b5, b7 = mean("recomputed", "b5"), mean("recomputed", "b7")
        d5, d7 = mean("decoded", "b5"), mean("decoded", "b7")
        facts.append(f"{v}: cost ratio B7/B5 = {b7 / b5:.2f} recomputed, {d7 / d5:.2f} decoded")
    return facts


def plot_leak_bars(rows: list[SweepRow], ax: Any) -> list[str]:
    return _bars(rows, ax, "leak_any", "any-leak rate")


SWEEPS.add(
    "tau",
    SweepSpec(
        "tau",
        [str(t) for t in range(1, TOTAL_T + 1)],
        ["b5", "b7"],
        _tau_knobs,
        float,
        paper="R^2 = 1.000 for B7's recompute against T - tau + 1; B5 flat",
        plot=plot_tau,
        describe=f"the target enters at transition tau = 1..{TOTAL_T} of a {TOTAL_T}-transition session",
    ),
)
SWEEPS.add(
    "indep",
    SweepSpec(
        "indep",
        ["0", "0.25", "0.5", "0.75", "1"],
        ["b5", "b5p", "b7"],
        lambda v, b: b.model_copy(update={"indep": float(v), "depth": 0, "turns_after": b.turns_after}),
        float,
        paper="B7's decode falls linearly with indep; B5' flat; equal at indep = 0",
        plot=plot_indep,
        describe="fraction of the post-target turns that are independent of the target (depth 0)",
    ),
)
SWEEPS.add(
    "granularity",
    SweepSpec(
        "granularity",
        POLICIES,
        ["b5", "b7"],
        # Middle position: a target in the first turns leaves little clean prefix for a policy to keep.
        lambda v, b: _without_compaction(b, checkpoint_policy=v, position="middle"),
        lambda v: POLICIES.index(v),
        paper="any-leak and CAD flat across policies; only reused prefill changes",
        plot=plot_granularity,
        checkpoint_policy=lambda v: v,
        describe=f"checkpoint policy, finest to coarsest (middle position, depth {NO_COMPACTION_DEPTH}: "
        "no compaction)",
    ),
)
SWEEPS.add(
    "position",
    SweepSpec(
        "position",
        POSITIONS,
        ["b5", "b7"],
        lambda v, b: _without_compaction(b, position=v),
        lambda v: POSITIONS.index(v),
        paper="leakage position-invariant; cost ratio B7/B5 from 0.91 (early) to 0.14 (late)",
        plot=plot_position,
        describe=f"where the target enters: 10% / 50% / 80% in (depth {NO_COMPACTION_DEPTH}: no compaction)",
    ),
)
SWEEPS.add(
    "boundary",
    SweepSpec(
        "boundary",
        ["all"],
        ["excise", "b4", "b7", "b5"],
        lambda v, b: b,
        lambda v: 0.0,
        paper="span-only excision leaks up to 93% and has CAD worse than no forgetting (Table 4)",
        plot=plot_leak_bars,
        describe="span-only excision vs descendant closure (B4) vs replay (B7)",
    ),
)
SWEEPS.add(
    "depth",
    SweepSpec(
        "depth",
        ["0", "1", "2", "3"],
        ["b3", "b7", "b5"],
        lambda v, b: b.model_copy(update={"depth": int(v)}),
        float,
        paper="B3 degrades as derivation depth grows; B7 holds",
        plot=plot_leak_bars,
        describe="derivation depth: answer, plan, summary stacked",
    ),
)
