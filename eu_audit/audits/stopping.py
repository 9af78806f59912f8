"""When a gate run in rounds may stop (``eu-audit gate``) without its verdict claiming more
than a run of fixed n would.

A failure that more sessions cannot undo ends the run at the round that shows it:

- a **fact** or an **observation** (``verdict._each_session``): one session that breaks a requirement on
  every session fails it at any n, so reading it after every round changes nothing;
- a **pseudo-rule** (an errored state, tampering) and a rule that **fails closed** (nothing to weigh);
- a rate found worse by the **betting test** (``verdict.betting_p``): under "not worse" its wealth is a
  nonnegative supermartingale, so by Ville's inequality the chance that it *ever* reaches 1 / alpha, at
  whichever round it is read, is at most alpha.

Every other verdict waits for the last round: McNemar on 0/1 outcomes and the hold side's bounds
(Clopper-Pearson, Hoeffding) are tests at a fixed n, and read after every round they would claim a failure
or a hold more often than alpha. Since the run stops early only on a failure, a run that reaches ``max_n``
holds exactly the data a fixed-n run would, and the chance of a wrong hold is no larger than that run's.

So a forget that leaves z stops at the first round that shows it, and a forget that works runs to
``max_n``: at alpha 0.05 and margin 0.1, no valid test holds a rule on fewer than 29 sessions (with no
worse session both bounds are 1 - alpha^(1/n)), so the default ``max_n`` of 30 is where a hold is first
possible, not a cost a better test could cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eu_audit.audits.model import GateResult

#: the tests whose failure is valid whenever it is read (module docstring); a test's name as a verdict
#: states it (``GateResult.test``)
FACT_TESTS = ("fact: ",)


def _betting_test() -> str:
    from eu_audit.audits.verdict import TESTS

    return TESTS["rate"].worse


def final_at_any_n(g: GateResult) -> bool:
    """A failure more sessions cannot undo: a fact or observation, a failed pseudo-rule or closed
    rule (no test: nothing was weighed), or the betting test's (valid under optional stopping)."""
    if g.outcome != "failed":
        return False
    return not g.test or g.test.startswith(FACT_TESTS) or g.test == _betting_test()


def sessions_schedule(max_n: int, first: int = 1) -> list[int]:
    """The n per suite after each round: ``first``, then doubling, ending at ``max_n`` (1, 2, 4, 8, 16,
    30): a forget that leaks is usually shown by its first session, and the rounds a working forget pays
    for (an audit each, read from the bundle: seconds) grow with log n."""
    if max_n < 1:
        raise ValueError("max_n must be at least 1")
    out, n = [], max(1, min(first, max_n))
    while n < max_n:
        out.append(n)
        n *= 2
    return [*out, max_n]


@dataclass(frozen=True)
class Stop:
    """Where a run in rounds stopped, and why: what the audit and the bundle's header say."""

    n: int  # sessions per suite recorded
    max_n: int
    why: str
    early: bool  # stopped before max_n, on a failure more sessions cannot undo

    def sentence(self) -> str:
        at = f"stopped at n = {self.n} of at most {self.max_n} per suite"
        return f"{at}: {self.why}" if self.early else f"{at} (every round run): {self.why}"


def should_stop(results: Sequence[GateResult], n: int, max_n: int) -> Stop | None:
    """Stop after a round: at the first failure that is final at any n (naming it), or at ``max_n``."""
    final = [g for g in results if final_at_any_n(g)]
    if final:
        named = "; ".join(f"{g.rule} failed ({g.test or 'fails closed'})" for g in final)
        return Stop(n, max_n, f"{named}: more sessions cannot undo it", early=n < max_n)
    if n >= max_n:
        return Stop(n, max_n, "the last round: every verdict is read at this n", False)
    return None
