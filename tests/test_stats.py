"""Each statistic matches a hand-checked case."""

from __future__ import annotations

import math

import pytest

from eu_audit.stats import mcnemar_exact, stars, tost_paired, wilcoxon_paired


def test_exact_mcnemar_is_the_two_sided_binomial_on_discordant_pairs() -> None:
    # 6 sessions leak only under the method, 1 only under the floor, 3 under both:
    # p = 2 * P(X <= 1 | n=7, 1/2) = 2 * (1 + 7) / 128 = 0.125
    method = [True] * 6 + [False] + [True] * 3
    floor = [False] * 6 + [True] + [True] * 3
    res = mcnemar_exact(method, floor)
    assert (res.only_method, res.only_reference) == (6, 1)
    assert res.p == pytest.approx(0.125)


def test_mcnemar_without_discordant_pairs_finds_no_difference() -> None:
    assert mcnemar_exact([True, False], [True, False]).p == 1.0


def test_wilcoxon_signed_rank_exact_small_sample() -> None:
    # five positive differences: the exact two-sided p is 2 / 2^5 = 0.0625
    assert wilcoxon_paired([2, 3, 4, 5, 6], [1, 1, 1, 1, 1]) == pytest.approx(0.0625)
    assert wilcoxon_paired([0.2, 0.3], [0.2, 0.3]) == 1.0


def test_tost_matches_the_two_one_sided_t_tests_by_hand() -> None:
    from scipy import stats

    method, floor, margin = [0.1, 0.2, 0.0, 0.1], [0.1, 0.1, 0.1, 0.1], 0.3
    d = [a - b for a, b in zip(method, floor, strict=True)]
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) / math.sqrt(len(d))
    lower = 1 - stats.t.cdf((mean + margin) / se, len(d) - 1)
    upper = stats.t.cdf((mean - margin) / se, len(d) - 1)
    assert tost_paired(method, floor, margin) == pytest.approx(max(lower, upper))


def test_equal_at_n_1_is_never_equivalence_and_constant_differences_have_no_tost() -> None:
    assert tost_paired([0.0], [0.0], 0.05) is None  # one identical pair: no evidence of equivalence
    assert tost_paired([0.0, 0.0, 0.0], [0.0, 0.0, 0.0], 0.05) is None  # "equal in all 3", not p = 0
    assert tost_paired([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], 0.3) is None


def test_significance_marks() -> None:
    assert (stars(0.001), stars(0.03), stars(0.2), stars(None)) == ("**", "*", "", "")
