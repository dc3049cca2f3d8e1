"""Eval metrics against brute-force enumeration and known values."""
from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.eval.metric_names import parse_metric
from grpo_core.eval.metrics import (
    avg_at_k,
    bootstrap_ci,
    g_pass_at_k,
    k_grid,
    maj_at_k,
    majority_vote,
    pass_at_k,
    problem_scores,
    summarise,
)
from grpo_core.eval.paired import (
    paired_bootstrap,
    paired_delta,
    paired_metric,
    paired_scores,
    pooled_paired_delta,
)

# ---------------------------------------------------------------- pass@k


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_fraction_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            hits = sum(any(samples[i] for i in s) for s in subsets)
            assert pass_at_k(n, c, k) == pytest.approx(hits / len(subsets), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_exact_binomials_for_large_n():
    # The product form must not lose precision where the binomials are astronomically big.
    for n, c, k in [(200, 3, 50), (500, 1, 10), (1000, 999, 1), (300, 30, 100)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 5, 1), (4, -1, 1), (4, 1, 0), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_properties(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the plain success rate
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12  # more tries never hurt
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12
    assert (p == 0.0) == (c == 0)


def test_avg_at_k():
    assert avg_at_k([True, False, True, True]) == 0.75
    assert avg_at_k([False] * 8) == 0.0
    with pytest.raises(ValueError):
        avg_at_k([])


# ---------------------------------------------------------------- majority vote


def brute_force_winner(answers):
    """The answer that beats every other on (count, earlier first occurrence), pairwise."""
    voted = [a for a in answers if a is not None]
    if not voted:
        return None
    for a in set(voted):
        if all(
            voted.count(a) > voted.count(b)
            or (voted.count(a) == voted.count(b) and answers.index(a) < answers.index(b))
            for b in set(voted) - {a}
        ):
            return a
    raise AssertionError("no winner")


def test_majority_vote_and_maj_at_k_match_brute_force_on_every_short_sequence():
    alphabet = ["1", "2", "3", None]
    for k in range(1, 6):
        for answers in itertools.product(alphabet, repeat=k):
            answers = list(answers)
            flags = [a == "2" for a in answers]  # "2" is the gold answer
            winner = brute_force_winner(answers)
            assert majority_vote(answers) == winner, answers
            assert maj_at_k(answers, flags) == (1.0 if winner == "2" else 0.0), answers


def test_majority_vote_ties_break_by_first_occurrence():
    assert majority_vote(["b", "a", "a", "b"]) == "b"
    assert majority_vote(["a", "b", "b", "a"]) == "a"
    assert majority_vote([None, "x", None, None]) == "x"  # None abstains, never wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def test_majority_vote_canonicalises_and_returns_first_written_form():
    answers = ["0.5", "7", "1/2", "7", "\\frac{1}{2}"]
    canon = {"0.5": "1/2", "1/2": "1/2", "\\frac{1}{2}": "1/2", "7": "7"}.get
    assert majority_vote(answers) == "7"
    assert majority_vote(answers, canon=canon) == "0.5"
    keys = [canon(a) for a in answers]
    assert majority_vote(answers, keys=keys) == "0.5"
    keys[0] = None  # an unparseable answer abstains even if its text is present
    assert majority_vote(answers, keys=keys) == "7"  # 7 and 1/2 tie at 2, 7 appears first
    with pytest.raises(ValueError):
        majority_vote(answers, keys=keys[:2])


def test_maj_at_k_reads_correctness_of_the_winner():
    assert maj_at_k(["4", "5", "5"], [True, False, False]) == 0.0
    assert maj_at_k(["4", "4", "5"], [True, True, False]) == 1.0
    assert maj_at_k([None, None], [False, False]) == 0.0
    with pytest.raises(ValueError):
        maj_at_k(["4"], [True, False])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from("abcde")), max_size=12))
def test_majority_vote_properties(answers):
    w = majority_vote(answers)
    voted = [a for a in answers if a is not None]
    if not voted:
        assert w is None
        return
    assert w in voted
    assert all(voted.count(w) >= voted.count(b) for b in voted)
    assert w == brute_force_winner(answers)


# ---------------------------------------------------------------- bootstrap CI


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    rng = np.random.default_rng(1)
    values = rng.random(50) < 0.4
    mean, lo, hi = bootstrap_ci(values)
    assert mean == pytest.approx(values.mean())
    assert lo <= mean <= hi and 0.0 <= lo < hi <= 1.0
    assert bootstrap_ci(values, seed=0) == (mean, lo, hi)
    assert bootstrap_ci(values, seed=1) != (mean, lo, hi)


def test_bootstrap_ci_narrows_with_n_at_the_expected_rate():
    rng = np.random.default_rng(2)
    small = rng.random(30) < 0.5
    large = rng.random(3000) < 0.5
    w_small = np.subtract(*bootstrap_ci(small)[2:0:-1])
    w_large = np.subtract(*bootstrap_ci(large)[2:0:-1])
    assert w_large < w_small / 5  # sqrt(100) = 10 in theory
    # For a large sample the percentile interval approaches mean +- 1.96 * se.
    se = large.std() / math.sqrt(large.size)
    assert w_large == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_bootstrap_ci_edge_cases():
    assert bootstrap_ci([1.0]) == (1.0, 1.0, 1.0)
    assert bootstrap_ci([0.3] * 7) == pytest.approx((0.3, 0.3, 0.3))
    m, lo, hi = bootstrap_ci([0.3] * 7)
    assert lo <= m <= hi  # rounding in resampled means must not exclude the mean
    with pytest.raises(ValueError):
        bootstrap_ci([])
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, 0.0], alpha=1.5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=60), st.integers(0, 2**31))
def test_bootstrap_ci_properties(values, seed):
    mean, lo, hi = bootstrap_ci(values, n_resamples=200, seed=seed)
    assert min(values) - 1e-12 <= lo <= mean <= hi <= max(values) + 1e-12


# ---------------------------------------------------------------- summarise


def test_k_grid():
    assert k_grid(1) == [1]
    assert k_grid(8) == [1, 2, 4, 8]
    assert k_grid(6) == [1, 2, 4, 6]
    assert k_grid(64) == [1, 2, 4, 8, 16, 32, 64]


def _records():
    return [
        {"greedy_correct": True, "greedy_truncated": False, "level": 1, "subject": "add",
         "sample_correct": [True, True, False, True], "sample_answers": ["3", "3", "4", "3"],
         "sample_truncated": [False, False, False, False]},
        {"greedy_correct": False, "greedy_truncated": True, "level": 2, "subject": "add",
         "sample_correct": [False, True, False, False], "sample_answers": ["9", "8", "9", None],
         "sample_truncated": [False, False, False, True]},
        {"greedy_correct": None, "level": 10, "subject": "mul",
         "sample_correct": [False] * 5, "sample_answers": [None] * 5},
    ]


def test_summarise_values_breakdowns_and_json():
    s = summarise(_records(), n_resamples=200)
    json.dumps(s, allow_nan=False)  # straight to JSON / MLflow
    assert s["n_problems"] == 3 and s["k"] == 4 and s["ks"] == [1, 2, 4]
    assert s["greedy_accuracy"]["mean"] == 0.5 and s["greedy_accuracy"]["n"] == 2
    assert s["avg@4"]["mean"] == pytest.approx((0.75 + 0.25 + 0.0) / 3)
    assert s["maj@4"]["mean"] == pytest.approx(1 / 3)
    assert s["pass@1"]["mean"] == pytest.approx((0.75 + 0.25 + 0.0) / 3)
    assert s["pass@4"]["mean"] == pytest.approx((1 + 1 + 0) / 3)
    # The third problem has 5 samples: pass@k uses all of them, avg@4 the first 4.
    assert problem_scores(_records()[2], [1, 4])["pass@4"] == 0.0
    for name in ("greedy_accuracy", "avg@4", "maj@1", "maj@2", "maj@4", "pass@1", "pass@2", "pass@4"):
        block = s[name]
        assert block["lo"] <= block["mean"] <= block["hi"], name
    assert s["truncation_rate"] == {"greedy": 0.5, "samples": 0.125, "all": pytest.approx(2 / 10)}
    assert list(s["by_level"]) == ["1", "2", "10"]  # numeric order, str keys
    assert s["by_level"]["2"]["pass@4"]["mean"] == 1.0
    assert s["by_subject"]["add"]["n_problems"] == 2
    assert s["by_subject"]["mul"]["greedy_accuracy"] is None


def test_summarise_greedy_only_and_canon():
    s = summarise([{"greedy_correct": True}, {"greedy_correct": False}], n_resamples=100)
    assert s["k"] == 0 and s["ks"] == [] and "pass@1" not in s and "by_level" not in s
    assert s["greedy_accuracy"]["mean"] == 0.5
    assert s["truncation_rate"] == {"greedy": None, "samples": None, "all": None}
    rec = {"sample_correct": [False, True, True], "sample_answers": ["5", "0.5", "1/2"]}
    canon = {"0.5": "1/2"}.get
    assert summarise([rec], n_resamples=10)["maj@2"]["mean"] == 0.0  # tie 5 vs 0.5 -> 5
    assert summarise([rec], canon=lambda a: canon(a, a), n_resamples=10)["maj@3"]["mean"] == 1.0


# ---------------------------------------------------------------- paired


def test_paired_bootstrap_sees_a_consistent_gain_the_separate_cis_hide():
    rng = np.random.default_rng(3)
    b = rng.random(60)  # problems of very different difficulty
    a = b + 0.02  # the same small gain on each of them
    d = paired_bootstrap(a, b)
    assert d["n"] == 60 and d["delta"] == pytest.approx(0.02)
    assert d["lo"] == pytest.approx(0.02) and d["hi"] == pytest.approx(0.02)
    assert bootstrap_ci(a)[0] < bootstrap_ci(b)[2]  # unpaired: inside the other's CI
    assert paired_bootstrap(a, b, seed=0) == d  # deterministic
    # Each pair resampled together: a swap of the two sides mirrors the interval.
    flipped = paired_bootstrap(b, a)
    assert flipped["delta"] == pytest.approx(-d["delta"])
    assert flipped["lo"] == pytest.approx(-d["hi"]) and flipped["hi"] == pytest.approx(-d["lo"])


def test_paired_bootstrap_of_swings_straddles_zero():
    a, b = [1.0, 0.0] * 20, [0.0, 0.9] * 20
    d = paired_bootstrap(a, b, n_resamples=2000)
    assert d["delta"] == pytest.approx(0.05) and d["lo"] < 0 < d["hi"]


def test_paired_bootstrap_rejects_mismatches():
    with pytest.raises(ValueError, match="3 problems against 2"):
        paired_bootstrap([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="zero problems"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="1-D"):
        paired_bootstrap([[1.0]], [[0.0]])


def _paired_records(pid: str, greedy: bool, correct: list[bool], answers: list, **flexible) -> dict:
    return {"problem_id": pid, "greedy_correct": greedy, "sample_correct": correct,
            "sample_answers": answers, **{f"{k}_flexible": v for k, v in flexible.items()}}


def test_paired_scores_align_by_problem_id_and_read_each_metric():
    a = [_paired_records("q2", True, [True, True, False], ["3", "3", "4"]),
         _paired_records("q1", False, [False, True, False], ["1", "2", "1"])]
    b = [_paired_records("q1", True, [True, True, True], ["2", "2", "2"]),
         _paired_records("q2", False, [False, False, False], ["4", "4", "5"])]
    assert paired_scores(a, b, "greedy_accuracy") == ([0.0, 1.0], [1.0, 0.0])
    assert paired_scores(a, b, "strict/greedy_accuracy") == ([0.0, 1.0], [1.0, 0.0])
    xs, ys = paired_scores(a, b, "avg@3")
    assert xs == pytest.approx([1 / 3, 2 / 3]) and ys == pytest.approx([1.0, 0.0])
    assert paired_scores(a, b, "avg@2") == ([0.5, 1.0], [1.0, 0.0])  # the first k samples
    assert paired_scores(a, b, "pass@2")[0] == pytest.approx([2 / 3, 1.0])  # all n samples
    assert paired_scores(a, b, "maj@3") == ([0.0, 1.0], [1.0, 0.0])
    d = paired_delta(a, b, "greedy_accuracy", n_resamples=100)
    assert d["delta"] == 0.0 and d["n"] == 2


def test_paired_scores_flexible_reads_the_flexible_fields():
    a = [_paired_records("q1", False, [False, False], ["x", "x"], greedy_correct=True,
                         sample_correct=[True, False], sample_answers=["7", "8"])]
    b = [_paired_records("q1", False, [False, False], ["x", "x"], greedy_correct=False,
                         sample_correct=[False, False], sample_answers=["1", "1"])]
    assert paired_scores(a, b, "greedy_accuracy") == ([0.0], [0.0])
    assert paired_scores(a, b, "flexible/greedy_accuracy") == ([1.0], [0.0])
    assert paired_scores(a, b, "flexible/avg@2") == ([0.5], [0.0])
    assert paired_scores(a, b, "flexible/maj@1") == ([1.0], [0.0])
    old = [_paired_records("q1", True, [True, True], ["7", "7"])]  # stored before *_flexible
    with pytest.raises(ValueError, match="greedy_correct_flexible"):
        paired_scores(a, old, "flexible/greedy_accuracy")


def test_paired_scores_name_the_mismatch():
    one = [_paired_records("q1", True, [True, False], ["1", "2"])]
    two = [_paired_records("q1", True, [True, False], ["1", "2"]),
           _paired_records("q2", True, [True, False], ["1", "2"])]
    with pytest.raises(ValueError, match=r"0 only in a, 1 only in b \(e.g. 'q2'\)"):
        paired_scores(one, two, "greedy_accuracy")
    four = [_paired_records("q1", True, [True, False, True, True], ["1"] * 4)]
    with pytest.raises(ValueError, match="'q1' has 2 samples in a and 4 in b"):
        paired_scores(one, four, "pass@1")
    assert paired_scores(one, four, "greedy_accuracy") == ([1.0], [1.0])  # greedy: no samples
    with pytest.raises(ValueError, match="appears twice"):
        paired_scores(one + one, one, "greedy_accuracy")
    with pytest.raises(ValueError, match="needs 4"):
        paired_scores(one, one, "avg@4")
    with pytest.raises(ValueError, match="no per-problem score"):
        paired_scores(one, one, "format_adherence")
    no_greedy = [{**one[0], "greedy_correct": None}]
    with pytest.raises(ValueError, match="no greedy_correct"):
        paired_scores(no_greedy, no_greedy, "greedy_accuracy")


def test_paired_metric_names():
    for name in ("greedy_accuracy", "avg@16", "maj@1", "pass@8", "flexible/avg@4",
                 "strict/pass@1", "flexible/greedy_accuracy"):
        assert paired_metric(name), name
    for name in ("format_adherence", "avg@", "pass@0", "truncation_rate", "flexible/n_problems"):
        assert not paired_metric(name), name


# ---------------------------------------------------------------- G-Pass@k

def test_g_pass_at_k_hand_computed():
    # n=4 samples, c=2 right, k=2 drawn: C(4,2)=6 draws; 1 has both right, 4 have one.
    assert g_pass_at_k(4, 2, 2, 0.5) == pytest.approx(5 / 6)  # >= 1 of 2 right
    assert g_pass_at_k(4, 2, 2, 0.75) == pytest.approx(1 / 6)  # ceil(1.5) = 2 of 2
    assert g_pass_at_k(4, 2, 2, 1.0) == pytest.approx(1 / 6)
    # n=5, c=3, k=4: C(5,4)=5 draws leave one sample out; 2 of them (leaving out a wrong
    # one) hold all 3 right, 3 hold 2 right; 4 right never.
    assert g_pass_at_k(5, 3, 4, 0.5) == 1.0
    assert g_pass_at_k(5, 3, 4, 0.75) == pytest.approx(2 / 5)
    assert g_pass_at_k(5, 3, 4, 1.0) == 0.0
    # tau 0.75 of k=4 needs exactly 3 (not 4 through float rounding)
    assert g_pass_at_k(4, 3, 4, 0.75) == 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_g_pass_at_k_equals_fraction_of_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            subsets = list(itertools.combinations([i < c for i in range(n)], k))
            for tau in (0.5, 0.75, 1.0):
                need = max(1, math.ceil(tau * k - 1e-9))
                hits = sum(sum(s) >= need for s in subsets)
                assert g_pass_at_k(n, c, k, tau) == pytest.approx(hits / len(subsets), abs=1e-12)
            # G-Pass@k never exceeds pass@k (its tau -> 0 limit)
            assert g_pass_at_k(n, c, k, 0.5) <= pass_at_k(n, c, k) + 1e-12


def test_summarise_reports_g_pass_next_to_pass():
    s = summarise(_records(), n_resamples=100)
    # problem 1: 3 of 4 right; problem 2: 1 of 4; problem 3: 0 of 5 (all n used).
    assert s["gpass50@4"]["mean"] == pytest.approx((1 + 0 + 0) / 3)
    assert s["gpass75@4"]["mean"] == pytest.approx((1 + 0 + 0) / 3)
    assert s["gpass100@4"]["mean"] == 0.0
    assert s["gpass50@2"]["mean"] == pytest.approx((g_pass_at_k(4, 3, 2, 0.5)
                                                    + g_pass_at_k(4, 1, 2, 0.5)) / 3)
    assert "gpass50@1" not in s  # at k=1 every threshold is pass@1
    names = [n for n in s if parse_metric(n) is not None]
    assert names.index("gpass50@2") == names.index("pass@4") + 1  # listed right after pass@k
    assert paired_metric("gpass75@4") and parse_metric("flexible/gpass100@8").kind == "gpass100"


def test_pooled_paired_delta_averages_seeds_per_problem_before_resampling():
    def recs(flags):
        return [{"problem_id": f"p{i}", "greedy_correct": bool(f)} for i, f in enumerate(flags)]
    before = recs([0, 0, 1, 1])
    seed_a, seed_b = recs([1, 0, 1, 1]), recs([1, 1, 1, 0])   # +0.25 and +0.25
    one = pooled_paired_delta([(seed_a, before)], "greedy_accuracy", n_resamples=200)
    assert one["delta"] == paired_delta(seed_a, before, "greedy_accuracy")["delta"] == 0.25
    both = pooled_paired_delta([(seed_a, before), (seed_b, before)], "greedy_accuracy",
                               n_resamples=200)
    assert both["delta"] == 0.25 and both["replicates"] == 2 and both["n"] == 4
    # per problem: (1 + 1)/2, (0 + 1)/2, 0, (0 - 1)/2 -> the pooled CI is narrower than seed b's
    assert both["hi"] - both["lo"] <= paired_delta(seed_b, before, "greedy_accuracy",
                                                   n_resamples=200)["hi"] - \
        paired_delta(seed_b, before, "greedy_accuracy", n_resamples=200)["lo"]
    with pytest.raises(ValueError, match="same problems"):
        pooled_paired_delta([(seed_a, before), (recs([1, 1]), recs([0, 0]))], "greedy_accuracy")
    with pytest.raises(ValueError, match="at least one"):
        pooled_paired_delta([], "greedy_accuracy")
