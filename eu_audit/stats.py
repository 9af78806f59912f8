"""Paired statistics, from the libraries (statsmodels, scipy), with the degenerate cases made explicit.

Every comparison is paired: the same sessions under a method and under the B5 reference.
- binary outcomes (leaked or not): exact McNemar on the discordant pairs;
- continuous outcomes (CAD, avoid rate, utility): Wilcoxon signed-rank;
- equivalence within a margin the user gives (the paper leaves it as future work): TOST on the paired
  differences. A small p says "equivalent within +-margin"; with no variance there is no TOST.
Gate verdicts (held / failed / inconclusive) are decided in ``eu_audit.audits.verdict``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class McNemar:
    only_method: int  # pairs where the method outcome is true and the reference's false
    only_reference: int
    p: float


def mcnemar_exact(method: Sequence[bool], reference: Sequence[bool]) -> McNemar:
    from statsmodels.stats.contingency_tables import mcnemar

    if len(method) != len(reference):
        raise ValueError("paired outcomes need equal lengths")
    n11 = sum(a and b for a, b in zip(method, reference, strict=True))
    n10 = sum(a and not b for a, b in zip(method, reference, strict=True))
    n01 = sum(b and not a for a, b in zip(method, reference, strict=True))
    n00 = len(method) - n11 - n10 - n01
    if n10 + n01 == 0:
        return McNemar(0, 0, 1.0)  # no discordant pair: no evidence of a difference
    res = mcnemar([[n11, n10], [n01, n00]], exact=True)
    return McNemar(n10, n01, float(res.pvalue))


def wilcoxon_paired(method: Sequence[float], reference: Sequence[float]) -> float:
    """Two-sided p of the Wilcoxon signed-rank test (1.0 when every difference is zero)."""
    from scipy.stats import wilcoxon

    diffs = [a - b for a, b in zip(method, reference, strict=True)]
    if not any(diffs):
        return 1.0
    return float(wilcoxon(diffs).pvalue)


def tost_paired(method: Sequence[float], reference: Sequence[float], margin: float) -> float | None:
    """p of the paired TOST for |mean difference| < margin; None where the test cannot be computed (fewer
    than two sessions, or the same difference in every session). Equal in all n sessions is not a p of 0:
    it is "equal in all n sessions", and what that shows depends on n (``eu_audit.audits.verdict`` bounds
    it)."""
    from statsmodels.stats.weightstats import ttost_paired

    diffs = [a - b for a, b in zip(method, reference, strict=True)]
    if len(diffs) < 2 or len(set(diffs)) == 1:
        return None
    p = float(ttost_paired(np.asarray(method, float), np.asarray(reference, float), -margin, margin)[0])
    return 1.0 if math.isnan(p) else p


def stars(p: float | None) -> str:
    if p is None:
        return ""
    return "**" if p < 0.01 else "*" if p < 0.05 else ""
