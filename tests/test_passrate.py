"""Pass-rate statistics: Wilson interval, band selection, histogram, rank correlation."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from grpo_core.eval.passrate import (
    classify,
    histogram,
    select_band,
    spearman,
    wilson_interval,
)

# ---------------------------------------------------------------- Wilson interval


@pytest.mark.parametrize(
    "c,n,lo,hi",
    [
        (5, 10, 0.2366, 0.7634),  # textbook values (Newcombe 1998 style tables)
        (1, 10, 0.0179, 0.4042),
        (0, 8, 0.0, 0.3244),
        (8, 8, 0.6756, 1.0),
        (4, 8, 0.2152, 0.7848),
    ],
)
def test_wilson_known_values(c, n, lo, hi):
    got = wilson_interval(c, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


@pytest.mark.parametrize("z", [1.96, 1.3, 1.2815515655446004])
def test_wilson_is_scipys_on_whole_counts(z):
    from scipy.special import ndtr

    level = float(2 * ndtr(z) - 1)
    for n in range(1, 41):
        for c in range(n + 1):
            ci = stats.binomtest(c, n).proportion_ci(confidence_level=level, method="wilson")
            assert wilson_interval(c, n, z) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_wilson_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)  # no data: no information
    assert wilson_interval(0, 5)[0] == 0.0
    assert wilson_interval(5, 5)[1] == 1.0
    for bad in [(-1, 5), (6, 5), (0, -1)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_bounds_solve_the_score_equation(cn):
    c, n = cn
    z, p_hat = 1.96, c / n
    lo, hi = wilson_interval(c, n, z)
    assert 0.0 <= lo <= p_hat <= hi <= 1.0
    # The Wilson bounds are the p where |p_hat - p| = z * sqrt(p (1 - p) / n).
    for p in (lo, hi):
        if 0.0 < p < 1.0:
            assert abs(p_hat - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-9)
    # More samples at the same rate give a narrower interval.
    lo2, hi2 = wilson_interval(4 * c, 4 * n, z)
    assert hi2 - lo2 < hi - lo


# ---------------------------------------------------------------- band


def test_classify_is_inclusive_at_both_edges():
    assert classify(0.3) == classify(0.7) == classify(3 / 10) == classify(7 / 10) == "in_band"
    assert classify(np.mean([1, 1, 1, 0, 0, 0, 0, 0, 0, 0])) == "in_band"
    assert classify(0.1 + 0.2) == "in_band"  # 0.30000000000000004
    assert classify(0.29) == classify(0.0) == "too_hard"
    assert classify(0.71) == classify(1.0) == "too_easy"
    assert classify(0.5, band=(0.5, 0.5)) == "in_band"
    assert classify(1.0, band=(0.0, 1.0)) == "in_band"
    with pytest.raises(ValueError):
        classify(0.5, band=(0.7, 0.3))


def test_select_band_keeps_order_and_counts_all_classes():
    est = [{"problem_id": f"p{i}", "pass_rate": r} for i, r in enumerate([0.0, 0.5, 1.0, 0.375, 0.75, 0.3])]
    kept, counts = select_band(est)
    assert [e["problem_id"] for e in kept] == ["p1", "p3", "p5"]
    assert counts == {"too_easy": 2, "in_band": 3, "too_hard": 1}
    assert select_band([]) == ([], {"too_easy": 0, "in_band": 0, "too_hard": 0})


# ---------------------------------------------------------------- histogram


def test_histogram_has_one_bin_per_attainable_rate():
    h = histogram([0.0, 1 / 8, 1 / 8, 0.5, 1.0, 1.0, 1.0], bins=8)
    assert h["counts"] == [1, 2, 0, 0, 1, 0, 0, 0, 3]
    assert h["centres"] == [j / 8 for j in range(9)]
    assert len(h["edges"]) == 10
    assert histogram([], bins=4)["counts"] == [0] * 5
    assert histogram([0.33], bins=4)["counts"] == [0, 1, 0, 0, 0]  # off-grid: nearest bin
    with pytest.raises(ValueError):
        histogram([1.2])
    with pytest.raises(ValueError):
        histogram([0.5], bins=0)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 32).flatmap(lambda k: st.tuples(st.just(k), st.lists(st.integers(0, k), max_size=50))))
def test_histogram_puts_each_j_over_k_in_bin_j(k_js):
    k, js = k_js
    counts = histogram([j / k for j in js], bins=k)["counts"]
    assert counts == [js.count(j) for j in range(k + 1)]



# ---------------------------------------------------------------- Spearman


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [9, 4, 1, 0]) == pytest.approx(-1.0)
    # Ties: x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4] -> r = 4.5 / sqrt(4.5 * 5).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(spearman([1], [2]))
    with pytest.raises(ValueError):
        spearman([1, 2], [1, 2, 3])


def test_spearman_detects_pass_rate_falling_with_level():
    levels = [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4 + [5] * 4
    rates = [1, 0.875, 1, 0.75, 0.75, 0.5, 0.625, 0.875, 0.5, 0.25, 0.375, 0.5,
             0.125, 0.25, 0, 0.25, 0, 0, 0.125, 0]
    assert spearman(levels, rates) < -0.8


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8)), min_size=2, max_size=40))
def test_spearman_matches_scipy(pairs):
    x, y = zip(*pairs)
    ours = spearman(x, y)
    if len(set(x)) < 2 or len(set(y)) < 2:
        assert math.isnan(ours)
    else:
        assert ours == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
