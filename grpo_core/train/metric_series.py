"""Per-step metric series of a training round, the shapes the diagnosis rules
(grpo_core/train/diagnosis.py) read them in: (step, value) points of one key, the change
of their least-squares line, runs and windows of consecutive points meeting a test.
Pure Python over TRL's logged dicts; a value that is missing, not a number or not
finite is no point."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def number_or_none(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def finite_or_none(v) -> float | None:
    x = number_or_none(v)
    return x if x is not None and math.isfinite(x) else None


def series_of(rows: list[tuple[int, Mapping]], key: str) -> list[tuple[int, float]]:
    """(step, value) of the steps where `key` is a finite number."""
    return [(s, x) for s, r in rows if (x := finite_or_none(r.get(key))) is not None]


def fit_change(points: Sequence[tuple[int, float]]) -> float:
    """The change across the points' steps of their least-squares line (0 for < 2 steps)."""
    n = len(points)
    if n < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope * (xs[-1] - xs[0])


def mean_of(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def runs_where(points: Sequence[tuple[int, float]], pred) -> list[list[tuple[int, float]]]:
    """Maximal runs of consecutive logged points satisfying pred(value)."""
    runs: list[list[tuple[int, float]]] = [[]]
    for p in points:
        if pred(p[1]):
            runs[-1].append(p)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def round4(x: float) -> float:
    return round(x, 4)


def windows_where(points: Sequence[tuple[int, float]], n: int, pred) -> set[int]:
    """Steps of every window of n consecutive logged points whose mean satisfies pred."""
    return {s for i in range(len(points) - n + 1) if pred(mean_of(x for _, x in points[i:i + n]))
            for s, _ in points[i:i + n]}
