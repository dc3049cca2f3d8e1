"""Pass-rate statistics: difficulty band selection and group-advantage diagnostics.

GRPO learns only from groups whose rewards differ: a prompt the policy always solves, or
never solves, yields a zero-variance group, zero advantages and no gradient. So prompts
are kept when their estimated pass rate lies in a band (default [0.3, 0.7]), and the
fraction of zero-variance groups is watched during training. Pure Python + numpy;
matplotlib is imported only when a plot is asked for.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

# Pass rates are ratios c/k; the tolerance keeps the band inclusive when a rate arrives
# through float arithmetic (a mean of rewards) a few ulps off 0.3 or 0.7.
_BAND_TOL = 1e-9


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion.

    Used instead of the normal (Wald) interval because pass rates come from k=8 samples
    and sit near 0 or 1, where Wald collapses to a zero-width interval. n=0 gives the
    uninformative (0, 1).
    """
    if n < 0 or not (0 <= successes <= n):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # The exact bounds at the edges are 0 and 1; pin them so rounding cannot leave 1e-17.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


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


def plot_histogram(
    pass_rates: Sequence[float],
    band: tuple[float, float],
    path: str | Path,
    bins: int = 8,
    title: str = "Estimated pass rate per prompt",
) -> Path:
    """Write a PNG of the pass-rate histogram with the kept band shaded; returns the path.

    Uses the Agg canvas directly (not pyplot), so it neither needs a display nor changes
    the backend of a notebook that imported us.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h = histogram(pass_rates, bins)
    fig = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.axvspan(band[0], band[1], color="tab:green", alpha=0.15, label=f"band [{band[0]}, {band[1]}]")
    ax.bar(h["centres"], h["counts"], width=0.8 / bins, color="tab:blue", label="prompts")
    ax.set_xlim(-0.5 / bins, 1 + 0.5 / bins)
    ax.set_xlabel("pass rate")
    ax.set_ylabel("prompts")
    ax.set_title(f"{title} (n={len(pass_rates)})", loc="left", fontsize=10)
    # Above the axes, so it never hides a bar.
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False, fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks with ties sharing the mean of the ranks they span."""
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # rank of the last member of each tie group
    return (ends - (counts - 1) / 2.0)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant.

    Used to check that the estimated pass rate falls as difficulty level rises; levels
    are heavily tied, hence average ranks rather than ordinal ones.
    """
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two 1-D sequences of equal length, got {a.shape} and {b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        raise ValueError("spearman does not accept NaN")
    if a.size < 2:
        return float("nan")
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float("nan") if denom == 0.0 else float(ra @ rb) / denom


def _groups(rewards: Sequence[float], group_size: int) -> np.ndarray:
    """Rewards as a (groups, group_size) array; completions of one prompt are contiguous."""
    r = np.asarray(rewards, dtype=float)
    if group_size < 1 or r.ndim != 1 or r.size % group_size:
        raise ValueError(f"{r.size} rewards do not split into groups of {group_size}")
    return r.reshape(-1, group_size)


def _flat(groups: np.ndarray, atol: float) -> np.ndarray:
    """Mask of groups whose rewards are all equal (up to atol)."""
    return np.ptp(groups, axis=1) <= atol


def zero_variance_fraction(rewards: Sequence[float], group_size: int, atol: float = 1e-12) -> float:
    """Fraction of groups whose rewards are all equal: the share of prompts teaching nothing.

    The collapse signal of the seeds: near 1 means the data left the band (re-filter) or
    sampling lacks diversity (raise temperature). Mirrors TRL's frac_reward_zero_std.
    """
    g = _groups(rewards, group_size)
    return float(_flat(g, atol).mean()) if g.size else 0.0


def group_advantages(
    rewards: Sequence[float],
    group_size: int,
    eps: float = 1e-8,
    scale: Literal["group", "batch", "none"] = "group",
    atol: float = 1e-12,
) -> np.ndarray:
    """Per-completion advantages A_i = (r_i - mean(r_group)) / (std + eps), for logging.

    `scale` follows TRL's scale_rewards: "group" divides by the group's std (GRPO paper),
    "batch" by the std of all rewards in the batch, "none" not at all (Dr. GRPO). The std
    is unbiased (ddof=1) like torch.std, which TRL uses, so logged values match training.
    Zero-variance groups get exactly 0, not float noise from mean-rounding, because they
    carry no learning signal. Returns a float array in input order (.tolist() to store).
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    g = _groups(rewards, group_size)
    if g.size == 0:
        return np.zeros(0)
    centred = g - g.mean(axis=1, keepdims=True)
    if scale == "group":
        std = g.std(axis=1, ddof=1, keepdims=True) if group_size > 1 else np.zeros((len(g), 1))
        adv = centred / (std + eps)
    elif scale == "batch":
        adv = centred / ((g.std(ddof=1) if g.size > 1 else 0.0) + eps)
    else:
        adv = centred
    adv[_flat(g, atol)] = 0.0
    return adv.reshape(-1)
