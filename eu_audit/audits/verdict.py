"""A gate rule's verdict, decided by the evidence: held, failed or inconclusive, with the n that would decide.

A rule reads one metric of one method on one suite (``gate.Rule``), paired by session with the B5 floor
(``<=floor``) or compared with a number. Three kinds:

- **facts**, any rule against a number (``residue_store==0``, ``cad==0``, ``agreement>=0.99``): a
  requirement on every session. One session that breaks it is a failure at any n (a history row holding
  z is an observation, not a statistic); the rule holds when every session was observed and met it.
- **observations against the floor** (``residue_context<=floor``, ``residue_store<=floor``: z in a prompt
  after the forget, in a store row): a session where the method holds more of it than the floor's state
  is a failure at any n, like a fact; held when every session was observed and none does.
- **against the floor**: the paired differences d = method - floor, oriented so that positive is worse.
  *Failed* when the method is significantly worse than the floor at ``alpha`` (one-sided, by the metric:
  exact McNemar, i.e. a binomial test on the discordant pairs, for a 0/1 metric; a betting test on the
  mean, valid for any distribution, for a rate in [0, 1]; Wilcoxon signed-rank only for an unbounded
  metric).
  *Held* when, failing that, the one-sided upper confidence bound of the mean difference is within the
  ``margin``. The bound is chosen by the metric, never by the data (``upper_bound``): Clopper-Pearson on
  the share of sessions where the method is worse for a 0/1 metric (exact: d <= 1), Hoeffding's bound on
  the mean of the worse part max(d, 0) for a rate in [0, 1] (valid for any distribution there), the
  one-sided t bound only for an unbounded metric (counts, seconds). Equal in all n sessions is never a p
  of 0, and at n = 2 no bound is within the margin: with no worse session both bounded kinds are
  1 - alpha^(1/n), which needs n = 29 at alpha 0.05 and margin 0.1.

Deterministic states hold on equality itself: on an exact engine (llama.cpp, hf), a state that is the
floor's (the same cache token ids and memory, by digest, and the same answer to every probe and
matched-seed sample) in every session is B5's state (B7 == B5), and the verdict says so. Otherwise
*inconclusive*, with what would decide it: the n at which, at the observed rates, the bound would be
within the margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eu_audit.audits.channel_kinds import channel_unmeasured, channel_value
from eu_audit.audits.channels import unknown_store
from eu_audit.audits.metric import METRICS, Kind, Metric
from eu_audit.audits.model import FLOOR, AuditReport, GateResult, StateAudit
from eu_audit.audits.rules import EQUALITY, OPS, RuleLike, other_method, value_of
from eu_audit.engines.base import is_exact  # engines whose replays are exact: equal states are a fact

MAX_N = 100_000


@dataclass(frozen=True)
class Bound:
    """A one-sided upper confidence bound of the mean worse-difference, and how it was computed."""

    value: float
    test: str


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper bound of a proportion (statsmodels, exact beta)."""
    from statsmodels.stats.proportion import proportion_confint

    return float(proportion_confint(k, n, alpha=2 * alpha, method="beta")[1])


def t_at(ds: Sequence[float], m: int, alpha: float) -> float | None:
    """The one-sided t bound of the mean at ``m`` sessions with the observed mean and spread; None with
    fewer than 2 sessions or no spread (no t bound exists then)."""
    from scipy.stats import t

    n = len(ds)
    if n < 2 or m < 2:
        return None
    mean = sum(ds) / n
    var = sum((d - mean) ** 2 for d in ds) / (n - 1)
    if var == 0:
        return None
    return float(mean + t.ppf(1 - alpha, m - 1) * math.sqrt(var / m))


def t_upper(ds: Sequence[float], alpha: float) -> float | None:
    return t_at(ds, len(ds), alpha)


def kl_upper(mean: float, n: int, alpha: float) -> float:
    """One-sided upper bound of the mean of n independent values in [0, 1] (Hoeffding 1963, Theorem 1:
    P(mean <= x) <= exp(-n KL(x || mu))): the largest mu with n KL(mean || mu) <= ln(1/alpha). Valid for
    any distribution on [0, 1]; at mean 0 it is Clopper-Pearson's exactly, 1 - alpha^(1/n)."""
    from scipy.optimize import brentq

    x = min(max(mean, 0.0), 1.0)
    if x >= 1.0:
        return 1.0
    target = math.log(1 / alpha) / n

    def kl(mu: float) -> float:
        head = x * math.log(x / mu) if x > 0 else 0.0
        return head + (1 - x) * math.log((1 - x) / (1 - mu)) - target

    hi = 1 - 1e-15
    return 1.0 if kl(hi) < 0 else float(brentq(kl, x, hi, xtol=1e-12))


#: the bets of ``betting_p``, fixed before any data: half the stake all in (the most a rate's d >= -1
#: allows; the best bet when the method is never better than the floor, as for CAD, where the floor's is
#: 0), half at half of it (what survives sessions where the method is better). A finer grid spreads the
#: stake thinner: with 32 fractions 6 of 8 sessions worse by the whole range no longer fail at n = 8.
BETS = (0.5, 1.0)


def betting_p(ds: Sequence[float]) -> float:
    """One-sided p that the mean difference is above 0, for differences in [-1, 1] (rates: each side in
    [0, 1]), valid for any distribution there and the same in any session order.

    A bet against "not worse on average" (Waudby-Smith and Ramdas, "Estimating means of bounded random
    variables by betting", JRSS-B 2024): staking a fraction lambda of the wealth on each session's d turns
    1 into W = prod(1 + lambda d); when every session's mean difference is <= 0 the sessions' independence
    gives E[W] <= 1, so by Markov's inequality P(W >= 1 / alpha) <= alpha. The wealth is averaged over the
    fixed fractions ``BETS`` (an average of such W is one too) and p = min(1, 1 / W). Wilcoxon's
    signed-rank test, used before, assumes differences symmetric about their centre: on a rate worse in
    most sessions by a little and better in a few by a lot (mean 0) it said "significantly worse"."""
    from collections import Counter

    counts = Counter(min(max(d, -1.0), 1.0) for d in ds)
    if sum(d * c for d, c in counts.items()) <= 0:
        return 1.0
    logs = []
    for lam in BETS:
        terms = [c * math.log1p(lam * d) if lam * d > -1 else -math.inf for d, c in counts.items()]
        logs.append(sum(terms))
    top = max(logs)
    if top == -math.inf:
        return 1.0
    log_wealth = top + math.log(sum(math.exp(x - top) for x in logs) / len(BETS))
    return 1.0 if log_wealth <= 0 else math.exp(-log_wealth)


def mcnemar_p(ds: Sequence[float]) -> float:
    """Exact McNemar on the discordant pairs of 0/1 outcomes: one-sided p that worse sessions outnumber
    better ones."""
    from scipy.stats import binomtest

    pos, neg = sum(d > 0 for d in ds), sum(d < 0 for d in ds)
    return float(binomtest(pos, pos + neg, 0.5, alternative="greater").pvalue)


def wilcoxon_p(ds: Sequence[float]) -> float:
    """Wilcoxon's signed-rank test, one-sided; it assumes differences symmetric about their centre."""
    from scipy.stats import wilcoxon

    return float(wilcoxon([d for d in ds if d != 0], alternative="greater").pvalue)


def worse_share(ds: Sequence[float]) -> float:
    return sum(d > 0 for d in ds) / len(ds)


def worse_part(ds: Sequence[float]) -> float:
    return sum(max(d, 0.0) for d in ds) / len(ds)


@dataclass(frozen=True)
class Tests:
    """A verdict's two tests for one kind of metric (``Metric.kind``), chosen by the metric and never by
    the data: the fail side's one-sided test that the method is worse, and the hold side's one-sided upper
    bound of the mean worse-difference."""

    worse: str  # the fail side's test, as a verdict states it
    worse_p: Callable[[Sequence[float]], float]  # one-sided p that the method is worse, given some d > 0
    bound: str  # the hold side's bound, as a verdict states it
    #: the bound at m sessions with the observed rates (at m = n: the bound of the data); None: no bound
    bound_at: Callable[[Sequence[float], int, float], float | None]


#: each kind's tests. 0/1 outcomes: exact McNemar, and Clopper-Pearson on the share of sessions where the
#: method is worse (the mean is at most that share: d <= 1), exact. Rates in [0, 1]: the betting test, and
#: Hoeffding's bound on the mean of the worse part max(d, 0), both valid for any distribution there.
#: Unbounded values (counts, seconds, distances: no test free of assumptions exists): Wilcoxon, and the
#: one-sided t bound, asymptotic. A t bound on skewed 0/1 data is not valid (at a worse share of exactly
#: the margin 0.1, "held" came out in up to 17% of runs at n = 31, alpha 0.05), so no bounded kind uses it.
TESTS: dict[Kind, Tests] = {
    "binary": Tests(
        "exact McNemar (one-sided)",
        mcnemar_p,
        "Clopper-Pearson on sessions worse",
        lambda ds, m, alpha: clopper_pearson_upper(round(worse_share(ds) * m), m, alpha),
    ),
    "rate": Tests(
        "betting test (one-sided)",
        betting_p,
        "Hoeffding on the worse part",
        lambda ds, m, alpha: kl_upper(worse_part(ds), m, alpha),
    ),
    "unbounded": Tests("Wilcoxon signed-rank (one-sided)", wilcoxon_p, "one-sided t", t_at),
}


def upper_bound(ds: Sequence[float], kind: Kind, alpha: float) -> Bound | None:
    """The one-sided upper bound of the mean worse-difference for this kind of metric (``TESTS``); None
    with no sessions, or for an unbounded metric below n = 2 or with differences all equal."""
    if not ds:
        return None
    tests = TESTS[kind]
    value = tests.bound_at(ds, len(ds), alpha)
    return None if value is None else Bound(value, tests.bound)


def worse_p(ds: Sequence[float], kind: Kind) -> float:
    """One-sided p that the method is worse (d > 0), by its kind's test (``TESTS``); 1.0 when no
    difference is positive."""
    if not any(d > 0 for d in ds):
        return 1.0
    return TESTS[kind].worse_p(ds)


def n_to_hold(ds: Sequence[float], kind: Kind, alpha: float, margin: float) -> int | None:
    """The smallest n at which, at the observed rates (the same share of worse sessions, mean of the worse
    part, mean and spread), the bound (``upper_bound``) would be within the margin; None when no n would."""
    if not ds:
        return None
    bound_at = TESTS[kind].bound_at

    def holds(m: int) -> bool:
        b = bound_at(ds, m, alpha)
        return b is not None and b <= margin

    if not holds(MAX_N):  # the bound shrinks with n: past MAX_N no practical run holds it
        return None
    lo = hi = max(len(ds), 2)
    while not holds(hi):
        lo, hi = hi, min(hi * 2, MAX_N)
    while lo < hi:  # the smallest n that holds, by bisection
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def at_shares(ds: Sequence[float], m: int) -> list[float]:
    """m differences with each observed value at its observed share, whatever order the sessions ran in:
    largest remainders (Hamilton), a tie going to the better value, so a failure is never claimed early."""
    n = len(ds)
    values = sorted(set(ds))
    exact = {v: ds.count(v) * m / n for v in values}
    counts = {v: math.floor(x) for v, x in exact.items()}
    by_remainder = sorted(values, key=lambda v: (-(exact[v] - counts[v]), v))
    for v in by_remainder[: m - sum(counts.values())]:
        counts[v] += 1
    return [v for v in values for _ in range(counts[v])]


def n_to_fail(ds: Sequence[float], kind: Kind, alpha: float) -> int | None:
    """The smallest n at which the same differences, at their observed shares (``at_shares``), would be
    significantly worse (the test ``worse_p`` runs); None when the method is not worse on average."""
    n = len(ds)
    if n == 0 or sum(ds) <= 0:
        return None

    def fails(m: int) -> bool:
        return worse_p(at_shares(ds, m), kind) < alpha

    lo, hi = n, n
    while not fails(hi):
        if hi >= MAX_N // 10:
            return None
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def reference_of(rhs: str) -> str | None:
    """The method a rule compares with, paired by session: B5 for ``floor``, the method a rule names
    (``b1.leak_any>=b0``), None for a number."""
    return FLOOR if rhs == "floor" else other_method(rhs)


def is_fact(rhs: str) -> bool:
    """A rule against a number is a requirement on every session (``residue_store==0``,
    ``agreement>=0.99``); a rule against the floor or another method compares two populations."""
    return reference_of(rhs) is None


def _identical(a: StateAudit, b: StateAudit) -> bool:
    """The same state (its cache's token ids and memory, by digest), answering every probe and
    matched-seed sample the same. Probes alone could agree by chance while the states differ."""
    return (
        a.state_digest is not None
        and a.state_digest == b.state_digest
        and [p.text for p in a.probes] == [p.text for p in b.probes]
        and a.samples == b.samples
        and a.sample_ids == b.sample_ids
    )


@dataclass
class Evidence:
    """One rule's per-session worse-differences (positive = worse than the reference)."""

    ds: list[float]
    values: list[float]  # the method's own values, session by session
    sessions: int  # the method's sessions, measured or not
    identical: bool  # every pair the same state token for token (floor rules)

    @property
    def missing(self) -> int:
        return self.sessions - len(self.ds)


def _result(rule: RuleLike, outcome: str, detail: str, **kw: object) -> GateResult:
    return GateResult(rule=rule.text, outcome=outcome, detail=detail, **kw)  # type: ignore[arg-type]


def gather(report: AuditReport, rule: RuleLike) -> Evidence | GateResult:
    """The rule's evidence, or the failed verdict when there is none to weigh (fails closed)."""
    name = rule.metric
    mine = [s for s in report.states if s.method == rule.method and rule.suite in ("all", s.suite)]
    if not mine:
        return _result(rule, "failed", f"no audit of {rule.method} on {rule.suite}")
    errored = [s for s in mine if s.error]
    if errored:
        return _result(rule, "failed", f"{len(errored)} state(s) of {rule.method} errored: a failure")
    if rule.rhs == "floor" and not report.floor:
        return _result(rule, "failed", "not measured: the audit ran without the floor")
    if name.startswith("store.") and (nowhere := unknown_store(report.states, name.split(".", 1)[1])):
        return _result(rule, "failed", f"{name}: {nowhere} (fails closed: never a pass)")
    ref = reference_of(rule.rhs)
    floor = {s.session_id: s for s in report.states if s.method == ref and not s.error}
    if ref is not None and not floor:
        return _result(rule, "failed", f"no audit of {ref}, the rule's reference (fails closed)")
    values = {s.session_id: value_of(s, name) for s in mine}
    measured = [s for s in mine if values[s.session_id] is not None]
    if ref is not None:  # a pair needs both sides
        measured = [
            s for s in measured if floor.get(s.session_id) and value_of(floor[s.session_id], name) is not None
        ]
    if not measured:
        why = sorted({r for s in mine if (r := unmeasured_reason(s, name))}) or ["no value"]
        return _result(rule, "failed", f"{name}: {'; '.join(why)} (fails closed: never a pass)")
    sign = -1.0 if rule.op in (">=", ">") else 1.0

    # a channel against the floor compares presence: the two sides make different numbers of calls
    presence = "." in name and rule.rhs == "floor"

    def own(v: float | None) -> float:
        return float(bool(v)) if presence else float(v or 0.0)

    def reference(s: StateAudit) -> float:
        return own(value_of(floor[s.session_id], name)) if ref is not None else float(rule.rhs)

    ds = [sign * (own(values[s.session_id]) - reference(s)) for s in measured]
    # the floor's own state (B7 == B5), for a rule against the floor or a number; equality with another
    # method's state is no such fact
    b5 = {s.session_id: s for s in report.states if s.method == FLOOR and not s.error}
    identical = ref in (None, FLOOR) and all(
        s.session_id in b5 and _identical(s, b5[s.session_id]) for s in measured
    )
    # a session the metric does not apply to (avoid outside the preference suite) is not a missing one;
    # one it could not be measured on (a reason is recorded) is
    applies = [s for s in mine if values[s.session_id] is not None or unmeasured_reason(s, name)]
    return Evidence(
        ds, [float(values[s.session_id] or 0.0) for s in measured], max(len(applies), len(ds)), identical
    )


def unmeasured_reason(state: StateAudit, name: str) -> str:
    if "." in name:
        kind, tier = name.split(".", 1)
        return channel_unmeasured(state, kind, tier) if channel_value(state, kind, tier) is None else ""
    return state.unmeasured.get(name, "")


@dataclass(frozen=True)
class Decision:
    """One rule's verdict on one method's states, before its hold is earned against the control
    (``eu_audit.audits.sensitivity``)."""

    result: GateResult
    #: every session's state is the floor's token for token on an exact engine: it is B5's state
    floors_own: bool = False
    #: what the verdict weighed (None: there was nothing to weigh, and the result says why)
    evidence: Evidence | None = None


def decide(report: AuditReport, rule: RuleLike, *, alpha: float, margin: float) -> Decision:
    """The verdict of one parsed rule on a finished audit, by the evidence alone. The same function decides
    the rule for the no-forget control, so a hold is earned by the same test (``sensitivity``)."""
    ev = gather(report, rule)
    if isinstance(ev, GateResult):
        return Decision(ev)
    floors_own = ev.identical and not ev.missing and is_exact(report.engine)
    if is_fact(rule.rhs):
        return Decision(_fact(rule, ev), floors_own, ev)
    metric = weighed_metric(rule)
    if metric is None:
        return Decision(_observed(rule, ev), floors_own, ev)
    return Decision(_weigh(report, rule, metric, ev, alpha, margin), floors_own, ev)


def weighed_metric(rule: RuleLike) -> Metric | None:
    """The metric a rule against the floor is weighed on (``weigh``); None for a fact, a channel (z where
    B5 had none: ``gate.parse_rule``) or an observation, which one session decides."""
    if is_fact(rule.rhs) or "." in rule.metric:
        return None
    metric = METRICS.get(rule.metric)
    return None if metric.observation else metric


def _each_session(rule: RuleLike, ev: Evidence, broken: int, test: str, broke: str, met: str) -> GateResult:
    """A requirement on every session: failed by one that breaks it (an observation, at any n), held when
    every session was observed and met it, inconclusive while some were not measured."""
    n = len(ev.ds)
    if broken:
        detail = f"{broke} in {broken} of {n} session(s): an observation, not a statistic"
        return _result(rule, "failed", detail, test=test, n=n)
    if ev.missing:
        detail = f"{met} in all {n} measured session(s); {ev.missing} of {ev.sessions} not measured"
        return _result(rule, "inconclusive", detail, test=test, n=n)
    return _result(rule, "held", f"{met} in all {n} session(s), each observed", test=test, n=n)


def _fact(rule: RuleLike, ev: Evidence) -> GateResult:
    broken = sum(not OPS[rule.op](v, float(rule.rhs)) for v in ev.values)
    broke = f"{rule.metric} {rule.op} {rule.rhs} broken"
    return _each_session(rule, ev, broken, "fact: every session observed", broke, "met")


def _observed(rule: RuleLike, ev: Evidence) -> GateResult:
    """An observation against the floor (``residue_store<=floor``): z found where the floor's state of the
    same session has none is a fact about that session, so one such session fails the rule at any n; it
    holds when every session was observed and none holds more than its floor."""
    worse = sum(d > 0 for d in ev.ds)
    test = "fact: every session observed against its floor"
    if "." in rule.metric:  # a channel: presence
        broke = f"z in {rule.metric} where the floor's session had none"
        return _each_session(rule, ev, worse, test, broke, "z there only where the floor had it")
    return _each_session(rule, ev, worse, test, f"{rule.metric} above the floor's", "at or below the floor")


@dataclass(frozen=True)
class Weighed:
    """A rule against the floor weighed on its paired differences alone."""

    p: float  # one-sided, that the method is worse
    bound: Bound | None  # the upper bound of the mean difference
    outcome: str  # failed (p < alpha), held (the bound within the margin) or inconclusive


def weigh(ds: Sequence[float], kind: Kind, alpha: float, margin: float) -> Weighed:
    """Failed when significantly worse, held when the upper bound is within the margin: the one rule
    both a verdict (``decide``) and a plan (``eu_audit.audits.power``) read."""
    p = worse_p(ds, kind)
    bound = upper_bound(ds, kind, alpha)
    if p < alpha:
        return Weighed(p, bound, "failed")
    held = bound is not None and bound.value <= margin
    return Weighed(p, bound, "held" if held else "inconclusive")


def _weigh(
    report: AuditReport, rule: RuleLike, metric: Metric, ev: Evidence, alpha: float, margin: float
) -> GateResult:
    ds, n = ev.ds, len(ev.ds)
    mean = sum(ds) / n
    tol = margin if reference_of(rule.rhs) is not None else 0.0
    w = weigh(ds, metric.kind, alpha, tol)
    p, bound = w.p, w.bound
    against = "the floor" if rule.rhs == "floor" else rule.rhs.upper() if other_method(rule.rhs) else rule.rhs
    if w.outcome == "failed":
        test = TESTS[metric.kind].worse
        if other_method(rule.rhs):  # against another method: which side it is on
            shown = f"{'below' if rule.op in ('>=', '>') else 'above'} {against} by {abs(mean):.3g}"
        else:
            shown = f"worse than {against} by {mean:+.3g}"
        detail = f"{shown} on average, p = {p:.3g} < alpha {alpha} (n = {n})"
        return _result(rule, "failed", detail, test=test, n=n, p=p)
    if ev.identical and not ev.missing and is_exact(report.engine) and all(d <= 0 for d in ds):
        detail = (
            f"equal to the floor token for token in all {n} session(s) on an exact engine ({report.engine}): "
            "the states are B5's, so equality itself decides"
        )
        return _result(rule, "held", detail, test=EQUALITY, n=n, p=p)
    if bound is not None and w.outcome == "held" and not ev.missing:
        detail = (
            f"mean difference {mean:+.3g}, upper {1 - alpha:.0%} bound {bound.value:.3g} <= margin {tol:g} "
            f"(n = {n})"
        )
        return _result(rule, "held", detail, test=bound.test, n=n, p=p, interval=(None, bound.value))
    need = n_to_hold(ds, metric.kind, alpha, tol)
    if need is not None:
        decide_by = f"at the observed rates n >= {need} would show it held"
    else:
        need = n_to_fail(ds, metric.kind, alpha)
        decide_by = "at the observed rates it is not within the margin" + (
            f": n >= {need} would show it failed" if need is not None else ""
        )
    gap = f"; {ev.missing} of {ev.sessions} session(s) not measured" if ev.missing else ""
    shown = f"upper bound {bound.value:.3g}" if bound is not None else "no bound possible at this n"
    return _result(
        rule,
        "inconclusive",
        f"n = {n} session(s){gap}; mean difference {mean:+.3g}, {shown} vs margin {tol:g}; {decide_by}",
        test=bound.test if bound is not None else "none possible at this n",
        n=n,
        p=p,
        interval=None if bound is None else (None, bound.value),
        n_needed=need,
    )


def n_for_share(worse_share: float, margin: float, alpha: float) -> int | None:
    """Sessions a 0/1 floor rule needs to hold when the method is worse than the floor in this share of
    sessions (0 for a forget as good as the reference): the Clopper-Pearson bound within the margin."""
    if not 0 <= worse_share < margin:
        return None
    m = 1
    while clopper_pearson_upper(round(worse_share * m), m, alpha) > margin:
        m += 1
        if m > MAX_N:
            return None
    return m
