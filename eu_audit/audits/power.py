"""How many sessions a decisive verdict needs, planned before the run.

A verdict's "n that would decide" (``verdict.n_to_hold`` / ``n_to_fail``) is the n at which the pilot's
differences, repeated at their observed shares, would decide: a point estimate. A fresh run of that
size draws its sessions anew and decides only about half the time (LangMem's any-leak, 4 of 10 sessions
worse: "n >= 12 would show it failed", and a fresh run of 12 shows it with probability ~0.56). This module
gives the other number a plan needs: the n at which a fresh run, its sessions drawn like the pilot's,
decides (held or failed, by the same rule: ``verdict.weigh``) with a stated chance, e.g. 0.8.

The sessions are drawn from the pilot's paired differences at their observed shares (exact over the
binomial when they take two values, as a 0/1 rule's do when the floor is never the worse; else seeded
runs, so the answer is reproducible) or, without a pilot, from a stated share of sessions where the method
is worse. A pilot that
saw no difference cannot see a rare one: at its rates every fresh run is like it, so its chance is the
certainty of the observed-rate n; say what worse share you want to rule out with ``--worse-share``.

Plan the n, then run it and gate once. Gating a run, adding sessions because it was inconclusive and gating
again is a second look at the data: each look spends the alpha again, and the chance of a wrong verdict
grows with the looks. A pilot's sessions are for planning; the decisive run is a fresh one.
"""

from __future__ import annotations

from collections.abc import Sequence

from eu_audit.audits.metric import Kind
from eu_audit.audits.model import AuditReport, GateResult
from eu_audit.audits.rules import RuleLike
from eu_audit.audits.verdict import gather, n_to_fail, n_to_hold, weigh, weighed_metric

#: seeded runs per n where a rule's differences take more than two values: the chance is then within
#: about +-0.02 of its value at 0.8 (two standard errors)
DRAWS = 2000
DEFAULT_CHANCE = 0.8
#: the largest n a plan searches; past it the answer is "none" (no practical run decides)
MAX_PLAN_N = 4096


def chance_to_decide(
    values: Sequence[float],
    shares: Sequence[float],
    m: int,
    *,
    kind: Kind,
    alpha: float,
    margin: float,
    draws: int = DRAWS,
    seed: int = 0,
) -> float:
    """The chance that a fresh run of ``m`` sessions, each session's difference drawn from ``values``
    with probabilities ``shares``, decides its rule (held or failed): exact over the binomial when there
    are two values, else the share of ``draws`` seeded runs."""
    import numpy as np

    p = np.asarray(shares, dtype=float) / sum(shares)
    outcome: dict[tuple[int, ...], bool] = {}  # a run is its counts of each value: weigh each once

    def decided(key: tuple[int, ...]) -> bool:
        if key not in outcome:
            ds = [v for v, c in zip(values, key, strict=True) for _ in range(c)]
            outcome[key] = weigh(ds, kind, alpha, margin).outcome != "inconclusive"
        return outcome[key]

    if len(values) == 2:
        from scipy.stats import binom

        pmf = binom.pmf(range(m + 1), m, p[1])
        return float(sum(q for k, q in enumerate(pmf) if q > 1e-12 and decided((m - k, k))))
    counts = np.random.default_rng(seed).multinomial(m, p, size=draws)
    return sum(decided(tuple(int(c) for c in row)) for row in counts) / draws


def n_for_chance(
    values: Sequence[float],
    shares: Sequence[float],
    *,
    kind: Kind,
    alpha: float,
    margin: float,
    chance: float = DEFAULT_CHANCE,
) -> int | None:
    """The smallest n (by doubling, then bisection: exact tests' power rises in small saw teeth, so it is
    the first n found at the chance, give or take a few) at which a fresh run decides with ``chance``;
    None when no n up to ``MAX_PLAN_N`` does."""

    def enough(m: int) -> bool:
        got = chance_to_decide(values, shares, m, kind=kind, alpha=alpha, margin=margin)
        return got >= chance

    lo, hi = 1, 2
    while not enough(hi):
        if hi >= MAX_PLAN_N:
            return None
        lo, hi = hi, min(hi * 2, MAX_PLAN_N)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if enough(mid):
            hi = mid
        else:
            lo = mid
    return hi


def plan_rule(
    report: AuditReport, rule: RuleLike, *, alpha: float, margin: float, chance: float = DEFAULT_CHANCE
) -> int | None:
    """For a rule weighed against the floor: the n at which a fresh run with the pilot's differences
    decides with ``chance``; None for facts and observations (one session decides them) and for a rule
    no n decides at the pilot's rates."""
    metric = weighed_metric(rule)
    if metric is None:
        return None
    ev = gather(report, rule)
    if isinstance(ev, GateResult):  # nothing to weigh: the verdict fails it closed
        return None
    ds, kind = ev.ds, metric.kind
    if n_to_hold(ds, kind, alpha, margin) is None and n_to_fail(ds, kind, alpha) is None:
        return None  # at these rates no n holds it within the margin nor shows it worse
    values = sorted(set(ds))
    shares = [ds.count(v) / len(ds) for v in values]
    return n_for_chance(values, shares, kind=kind, alpha=alpha, margin=margin, chance=chance)


def plan_share(
    worse_share: float, *, alpha: float, margin: float, chance: float = DEFAULT_CHANCE
) -> int | None:
    """Without a pilot: the n at which a 0/1 rule against the floor is decided with ``chance`` when each
    session is worse than the floor with probability ``worse_share`` (and never better)."""
    return n_for_chance(
        [0.0, 1.0], [1 - worse_share, worse_share], kind="binary", alpha=alpha, margin=margin, chance=chance
    )
