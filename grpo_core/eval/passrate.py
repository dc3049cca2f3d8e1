"""Pass-rate statistics: confidence intervals, difficulty band selection, histograms.

GRPO learns only from groups whose rewards differ: a prompt the policy always solves, or
never solves, yields a zero-variance group, zero advantages and no gradient. So prompts
are kept when their estimated pass rate lies in a band (default [0.3, 0.7]). The
statistics are scipy's where it has them (imported on first use).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Pass rates are ratios c/k; the tolerance keeps the band inclusive when a rate arrives
# through float arithmetic (a mean of rewards) a few ulps off 0.3 or 0.7.
_BAND_TOL = 1e-9


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion, in closed form, at the two-sided
    confidence level of `z` (the one interval of the pipeline: fixed-k estimates, the
    adaptive stop rule, and pseudo-counts from earlier evidence, grpo_core.eval.evidence,
    added to the fresh ones, so counts may be fractional). On whole counts it is scipy's
    `binomtest(...).proportion_ci(method="wilson")` up to rounding (tests/test_passrate.py).

    Used instead of the normal (Wald) interval because pass rates come from k=8 samples
    and sit near 0 or 1, where Wald collapses to a zero-width interval. n=0 gives the
    uninformative (0, 1).
    """
    if n < 0 or not (0 <= successes <= n):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * float(np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)))
    # The exact bounds at the edges are 0 and 1; pin them so rounding cannot leave 1e-17.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def z_for(confidence: float) -> float:
    """The normal quantile of a two-sided confidence level: 0.95 -> 1.96, 0.8 -> 1.28."""
    from scipy.special import ndtri

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return float(ndtri((1.0 + confidence) / 2.0))


def classify(pass_rate: float, band: tuple[float, float] = (0.3, 0.7)) -> str:
    """"too_easy" above the band, "too_hard" below it, "in_band" within (edges included)."""
    lo, hi = band
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got {band}")
    if pass_rate > hi + _BAND_TOL:
        return "too_easy"
    if pass_rate < lo - _BAND_TOL:
        return "too_hard"
    return "in_band"


def select_band(
    estimates: Sequence[dict], band: tuple[float, float] = (0.3, 0.7)
) -> tuple[list[dict], dict[str, int]]:
    """Keep the estimates whose pass_rate is in band; count all three classes.

    The order of `estimates` is preserved so selection is reproducible, and the counts
    always hold all three keys so a report never has to guess a missing zero.
    """
    counts = {"too_easy": 0, "in_band": 0, "too_hard": 0}
    kept = []
    for est in estimates:
        label = classify(est["pass_rate"], band)
        counts[label] += 1
        if label == "in_band":
            kept.append(est)
    return kept, counts


def histogram(pass_rates: Sequence[float], bins: int = 8) -> dict[str, list]:
    """Counts of pass rates in bins+1 bins centred on 0, 1/bins, ..., 1.

    `bins` is the number of samples k per prompt: an estimate from k samples is one of
    the k+1 values j/k, so one bin per value shows the distribution without aliasing.
    Rates off that grid (other k) fall in the nearest bin. Returns JSON-friendly lists:
    centres, edges (bins+2 of them) and counts.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    x = np.asarray(pass_rates, dtype=float)
    if x.size and (np.isnan(x).any() or x.min() < 0.0 or x.max() > 1.0):
        raise ValueError("pass rates must lie in [0, 1]")
    centres = np.arange(bins + 1) / bins
    edges = (np.arange(bins + 2) - 0.5) / bins
    counts, _ = np.histogram(x, bins=edges)
    return {"centres": centres.tolist(), "edges": edges.tolist(), "counts": counts.tolist()}


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (scipy's, average ranks for ties); NaN when either side is
    constant or has fewer than two values.

    Used to check that the estimated pass rate falls as difficulty level rises; levels
    are heavily tied, hence average ranks rather than ordinal ones.
    """
    from scipy.stats import spearmanr

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-D sequences of equal length, got {a.shape} and {b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("spearman does not accept NaN")
    if a.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")  # scipy would warn (ConstantInputWarning) and give NaN too
    return float(spearmanr(a, b).statistic)
