"""Evaluation metrics: greedy accuracy, avg@k, maj@k, unbiased pass@k, G-Pass@k, bootstrap CIs.

Pure Python + numpy so that an eval can be re-scored from stored per-problem rows in a
notebook. Conventions follow the papers the numbers are compared with:
- pass@k is the unbiased estimator of Chen et al. 2021 (Codex), computed from n >= k
  samples per problem, not the biased "any of the first k is correct".
- avg@k is the mean correctness of k samples, which DeepSeek-R1 reports as pass@1.
- maj@k is whether the most common answer of k samples is correct (self-consistency).
- G-Pass@k_tau (Liu et al. 2024, "Are your LLMs capable of stable reasoning?"; lighteval
  reports it) is the probability that at least ceil(tau * k) of k samples drawn without
  replacement from the n are correct: a stability measure beside pass@k (tau -> 0), for
  tau 0.5, 0.75 and 1.0 (metric_names.GPASS_TAUS), from the same samples.
- Every headline number carries a percentile bootstrap CI over problems, because
  benchmarks such as AIME have 30 problems and a 3-point gap is noise.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from grpo_core.eval.metric_names import (
    GPASS_TAUS,
    GREEDY,
    metric_name,
    report_order,
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct.

    1 - C(n-c, k) / C(n, k), evaluated as a product so that n in the hundreds does not
    overflow or lose precision in the binomials (Chen et al. 2021, Fig. 3).
    """
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def g_pass_at_k(n: int, c: int, k: int, tau: float) -> float:
    """Probability that at least ceil(tau * k) (at least 1) of k samples drawn without
    replacement from n, c of them correct, are correct: the hypergeometric tail
    sum_{j >= ceil(tau k)} C(c, j) C(n - c, k - j) / C(n, k), in exact integers."""
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if not (0.0 <= tau <= 1.0):
        raise ValueError(f"need 0 <= tau <= 1, got tau={tau}")
    need = max(1, math.ceil(tau * k - 1e-9))  # 0.75 * 4 is 3, not 4 by rounding
    hits = sum(math.comb(c, j) * math.comb(n - c, k - j) for j in range(need, min(c, k) + 1))
    return hits / math.comb(n, k)


def avg_at_k(correct: Sequence[bool]) -> float:
    """Mean correctness over the k samples of one problem (R1's pass@1 estimate)."""
    if len(correct) == 0:
        raise ValueError("avg@k of zero samples is undefined")
    return float(np.mean(np.asarray(correct, dtype=float)))


def _vote(
    answers: Sequence[str | None],
    keys: Sequence[Hashable | None] | None,
    canon: Callable[[str], Hashable] | None,
) -> int | None:
    """Index of the first sample holding the winning answer, or None when nothing was voted."""
    if keys is None:
        keys = [None if a is None else (canon(a) if canon else a) for a in answers]
    elif len(keys) != len(answers):
        raise ValueError(f"{len(keys)} keys for {len(answers)} answers")
    counts: Counter = Counter()
    first: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        if key is None:  # unparseable / missing answers abstain rather than form a bloc
            continue
        counts[key] += 1
        first.setdefault(key, i)
    if not counts:
        return None
    # Ties go to the answer seen first, so the result never depends on hash order.
    winner = max(counts, key=lambda key: (counts[key], -first[key]))
    return first[winner]


def majority_vote(
    answers: Sequence[str | None],
    keys: Sequence[Hashable | None] | None = None,
    canon: Callable[[str], Hashable] | None = None,
) -> str | None:
    """The most common non-None answer (as first written), or None if every answer is None.

    `keys` are precomputed canonical forms parallel to `answers` (e.g. from math-verify);
    otherwise `canon(answer)` is applied, so that "0.5" and "1/2" vote together. A key of
    None abstains. Ties are broken by earliest first occurrence.
    """
    idx = _vote(answers, keys, canon)
    return None if idx is None else answers[idx]


def maj_at_k(
    answers: Sequence[str | None],
    correct_flags: Sequence[bool],
    keys: Sequence[Hashable | None] | None = None,
    canon: Callable[[str], Hashable] | None = None,
) -> float:
    """1.0 if the majority answer of these k samples is correct, else 0.0.

    Correctness of the winner is read from `correct_flags` at the winner's first
    occurrence, so the verifier (not the canonicaliser) stays the judge. No answer at all
    counts as wrong.
    """
    if len(correct_flags) != len(answers):
        raise ValueError(f"{len(correct_flags)} flags for {len(answers)} answers")
    idx = _vote(answers, keys, canon)
    return 0.0 if idx is None else float(bool(correct_flags[idx]))


def bootstrap_ci(
    values: Sequence[float],
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, lo, hi): percentile bootstrap CI of the mean of per-problem scores.

    Problems are the unit of resampling because they, not samples, are what a benchmark
    draws. Resamples are drawn in chunks so memory stays bounded for large benchmarks.
    The interval is widened to include the mean if needed: for tiny or constant inputs
    the percentiles can miss it by rounding, and a CI that excludes its own point
    estimate only confuses a report.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("bootstrap_ci needs a non-empty 1-D sequence of scores")
    if not (0.0 < alpha < 1.0) or n_resamples < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_resamples >= 1, got {alpha}, {n_resamples}")
    mean = float(x.mean())
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // x.size)
    means = np.empty(n_resamples)
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        means[start:stop] = x[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return mean, float(min(lo, mean)), float(max(hi, mean))


def k_grid(k_max: int) -> list[int]:
    """k values to report: 1, powers of two below k_max, and k_max itself."""
    ks, k = {1, k_max}, 2
    while k < k_max:
        ks.add(k)
        k *= 2
    return sorted(ks)


def problem_scores(
    record: dict, ks: Sequence[int], canon: Callable[[str], Hashable] | None = None
) -> dict[str, float]:
    """Per-problem metric values for one eval record (the unit the bootstrap resamples).

    pass@k and G-Pass@k use all n samples of the problem (the estimator's point: n >= k
    reduces variance); avg@k and maj@k use the first k samples, which is what their names
    say. G-Pass@k is reported for k >= 2 (at k = 1 every threshold is pass@1).
    """
    out: dict[str, float] = {}
    correct = [bool(c) for c in record.get("sample_correct") or []]
    answers = record.get("sample_answers")
    if correct:
        n, c, k_max = len(correct), sum(correct), max(ks)
        out[metric_name("avg", k_max)] = avg_at_k(correct[:k_max])
        for k in ks:
            out[metric_name("pass", k)] = pass_at_k(n, c, k)
            for kind, tau in GPASS_TAUS.items() if k > 1 else ():
                out[metric_name(kind, k)] = g_pass_at_k(n, c, k, tau)
            if answers is not None:
                out[metric_name("maj", k)] = maj_at_k(answers[:k], correct[:k], canon=canon)
    return out


def _rate(flags: list) -> float | None:
    flags = [bool(f) for f in flags if f is not None]
    return float(np.mean(flags)) if flags else None


def _ci_dict(values: list[float], **ci_kw) -> dict | None:
    if not values:
        return None
    mean, lo, hi = bootstrap_ci(values, **ci_kw)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(values)}


def _summarise_group(records: list[dict], ks: list[int], canon, ci_kw: dict) -> dict:
    """The metric block for one set of problems: every metric with its CI."""
    out: dict = {"n_problems": len(records)}
    greedy = [float(bool(r["greedy_correct"])) for r in records
              if r.get("greedy_correct") is not None]
    out[GREEDY] = _ci_dict(greedy, **ci_kw)
    per_metric: dict[str, list[float]] = {}
    for r in records:
        for name, value in problem_scores(r, ks, canon).items():
            per_metric.setdefault(name, []).append(value)
    for name in sorted(per_metric, key=report_order):  # by kind (G-Pass after pass), then k
        out[name] = _ci_dict(per_metric[name], **ci_kw)
    greedy_trunc = [r.get("greedy_truncated") for r in records]
    sample_trunc = [t for r in records for t in (r.get("sample_truncated") or [])]
    out["truncation_rate"] = {
        "greedy": _rate(greedy_trunc),
        "samples": _rate(sample_trunc),
        "all": _rate(greedy_trunc + sample_trunc),
    }
    return out


def summarise(
    per_problem: list[dict],
    canon: Callable[[str], Hashable] | None = None,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict:
    """Headline metrics with CIs, plus the same block per level and per subject.

    Each record may hold: greedy_correct (bool|None), greedy_truncated (bool|None),
    sample_correct (list[bool]), sample_answers (list[str|None]), sample_truncated
    (list[bool]), level, subject. Missing fields skip the metrics that need them.
    k_max is the smallest sample count over problems that have samples, so every problem
    contributes to every reported k. The result holds only str keys, ints, floats and
    None: it goes straight to JSON and MLflow.
    """
    ci_kw = {"n_resamples": n_resamples, "alpha": alpha, "seed": seed}
    counts = [len(r["sample_correct"]) for r in per_problem if r.get("sample_correct")]
    k_max = min(counts) if counts else 0
    ks = k_grid(k_max) if k_max else []
    # Problems without samples still count for greedy accuracy and truncation.
    out = _summarise_group(per_problem, ks, canon, ci_kw)
    out["k"] = k_max
    out["ks"] = ks
    out["alpha"] = alpha
    for field, label in (("level", "by_level"), ("subject", "by_subject")):
        groups: dict[str, list[dict]] = {}
        for r in per_problem:
            value = r.get(field)
            groups.setdefault("unknown" if value is None else str(value), []).append(r)
        if set(groups) != {"unknown"}:
            out[label] = {
                g: _summarise_group(rs, ks, canon, ci_kw)
                for g, rs in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))
            }
    return out


def _sort_key(label: str) -> tuple:
    """Numeric levels sort as numbers ("2" before "10"); other labels alphabetically."""
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)
