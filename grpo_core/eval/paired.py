"""Paired comparison of two models scored on the same problems: per-problem differences.

A problem's difficulty is shared by both models, so it cancels out of the difference. Each
model's own CI carries that difficulty spread and makes a consistent small gain look like
noise (and an inconsistent one look solid). `pooled_paired_delta` averages several
replicates (seeds) per problem before resampling problems.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from grpo_core.eval.metric_names import GPASS_TAUS, GREEDY, parse_metric
from grpo_core.eval.metrics import avg_at_k, bootstrap_ci, g_pass_at_k, maj_at_k, pass_at_k


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict:
    """{"delta", "lo", "hi", "n"}: mean(a - b) with its percentile bootstrap CI, where a[i]
    and b[i] are two models' scores on the same problem i.

    Problem indices are resampled jointly (a resample of the differences a[i] - b[i] is
    exactly that), so the interval measures how the models differ, not which problems
    happened to be drawn.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError("paired_bootstrap needs two 1-D sequences of per-problem scores")
    if x.size != y.size:
        raise ValueError(f"paired scores need one value per problem on both sides: "
                         f"{x.size} problems against {y.size}")
    if x.size == 0:
        raise ValueError("paired_bootstrap of zero problems is undefined")
    delta, lo, hi = bootstrap_ci(x - y, n_resamples=n_resamples, alpha=alpha, seed=seed)
    return {"delta": delta, "lo": lo, "hi": hi, "n": int(x.size)}


def paired_metric(name: str) -> bool:
    """Whether `name` has a per-problem score to pair: every evaluation metric does
    (greedy_accuracy, avg@k, maj@k, pass@k, optionally prefixed strict/ or flexible/;
    grpo_core.eval.metric_names)."""
    return parse_metric(name) is not None


def _problem_score(record: dict, name: str, canon) -> float:
    """One problem's value of `name`, by the definitions problem_scores uses; only that
    metric is computed (voting canonicalises every answer, which costs the most)."""
    m = parse_metric(name)
    kind, k, suffix = m.kind, m.k, m.record_suffix
    pid = record.get("problem_id")
    if kind == GREEDY:
        value = record.get(f"greedy_correct{suffix}")
        if value is None:
            raise ValueError(f"problem {pid!r} has no greedy_correct{suffix} for {name}")
        return float(bool(value))
    correct = [bool(c) for c in record.get(f"sample_correct{suffix}") or []]
    if len(correct) < k:
        raise ValueError(f"problem {pid!r} has {len(correct)} sample_correct{suffix} "
                         f"values; {name} needs {k}")
    if kind == "avg":
        return avg_at_k(correct[:k])
    if kind == "pass":
        return pass_at_k(len(correct), sum(correct), k)
    if kind in GPASS_TAUS:
        return g_pass_at_k(len(correct), sum(correct), k, GPASS_TAUS[kind])
    answers = record.get(f"sample_answers{suffix}")
    if answers is None:
        raise ValueError(f"problem {pid!r} has no sample_answers{suffix} for {name}")
    return maj_at_k(answers[:k], correct[:k], canon=canon)


def _by_problem(records: Sequence[dict], side: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in records:
        pid = r["problem_id"]
        if pid in out:
            raise ValueError(f"problem {pid!r} appears twice in the {side} records")
        out[pid] = r
    return out


def _check_same_problems(a: dict, b: dict) -> None:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        raise ValueError(
            f"not the same problems: {len(only_a)} only in a"
            f"{f' (e.g. {only_a[0]!r})' if only_a else ''}, {len(only_b)} only in b"
            f"{f' (e.g. {only_b[0]!r})' if only_b else ''}")


def _check_same_samples(a: dict, b: dict, name: str) -> None:
    """pass@k's estimator and avg@k's first k both depend on the sample count: pairing
    problems with different counts would compare two different estimates."""
    field = f"sample_correct{parse_metric(name).record_suffix}"
    for pid, ra in a.items():
        na, nb = len(ra.get(field) or []), len(b[pid].get(field) or [])
        if na != nb:
            raise ValueError(f"problem {pid!r} has {na} samples in a and {nb} in b "
                             f"({field}); paired {name} needs the same count")


def paired_scores(
    a_records: Sequence[dict],
    b_records: Sequence[dict],
    metric: str,
    canon: Callable[[str], Hashable] | None = None,
) -> tuple[list[float], list[float]]:
    """Aligned per-problem `metric` values of two eval record sets (keyed by problem_id,
    sorted by it). ValueError when the problems or sample counts differ, or a record
    lacks what the metric needs. `flexible/<metric>` reads the records' *_flexible fields."""
    if not paired_metric(metric):
        raise ValueError(f"{metric!r} has no per-problem score to pair")
    a, b = _by_problem(a_records, "a"), _by_problem(b_records, "b")
    _check_same_problems(a, b)
    if parse_metric(metric).kind != GREEDY:
        _check_same_samples(a, b, metric)
    ids = sorted(a)
    return ([_problem_score(a[i], metric, canon) for i in ids],
            [_problem_score(b[i], metric, canon) for i in ids])


def paired_delta(
    a_records: Sequence[dict],
    b_records: Sequence[dict],
    metric: str,
    canon: Callable[[str], Hashable] | None = None,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict:
    """paired_bootstrap of `metric` for a minus b over their common problems (which must
    be all of them): {"delta", "lo", "hi", "n"}."""
    xs, ys = paired_scores(a_records, b_records, metric, canon)
    return paired_bootstrap(xs, ys, n_resamples=n_resamples, alpha=alpha, seed=seed)


def pooled_paired_delta(
    pairs: Sequence[tuple[Sequence[dict], Sequence[dict]]],
    metric: str,
    canon: Callable[[str], Hashable] | None = None,
    n_resamples: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict:
    """The paired delta of several replicates (seeds) on the same problems: per problem the
    mean over replicates of (a - b), bootstrapped over problems. {"delta", "lo", "hi", "n",
    "replicates"}. Every pair must cover the same problems: the unit resampled is the problem,
    so a seed's luck on a problem and another seed's on the same problem are averaged first."""
    if not pairs:
        raise ValueError("pooled_paired_delta needs at least one (a, b) pair of records")
    diffs, ids = [], None
    for a_records, b_records in pairs:
        a, b = _by_problem(a_records, "a"), _by_problem(b_records, "b")
        _check_same_problems(a, b)
        if ids is None:
            ids = sorted(a)
        elif sorted(a) != ids:
            raise ValueError("the replicates of a pooled delta must score the same problems")
        xs, ys = paired_scores(a_records, b_records, metric, canon)
        diffs.append(np.asarray(xs) - np.asarray(ys))
    out = paired_bootstrap(np.mean(diffs, axis=0), np.zeros(len(ids)),
                           n_resamples=n_resamples, alpha=alpha, seed=seed)
    return {**out, "replicates": len(pairs)}
