"""The memorisation gap of a training stage: what it gained on problems it trained on
against what it gained on problems of the same distribution that no stage trained on (the
RL part's held-back tail, grpo_core/data/stage_split.py), both measured from the model the
stage started from, with the held-out benchmark beside them. A stage that fits its own
problems gains far more on them than on unseen ones, and a gain read on its trained prompts
says nothing about the task: the measurement that showed GRPO after SFT re-learning SFT's
problems (issue 44). Gains, not levels: a round trains on the prompts its filter chose
(solved 1-7 of 8), which start above a random sample; the start model's score on the same
problems takes that selection out.

Accuracy is the eval protocol's sampled accuracy (eval.samples at eval.temperature, the
avg@k of docs/evaluation.md), read the way the rewards read answers (rewards.extraction)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from grpo_core.data.problems import Problem
from grpo_core.findings import Finding


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _se(xs: list[float]) -> float:
    """Standard error of the mean of `xs`."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


@dataclass(frozen=True)
class GapResult:
    """One stage's probe: accuracy before and after the stage on `n_trained` problems it
    trained on and `n_unseen` it never saw; `gap` = gain on trained - gain on unseen."""

    stage: str
    trained: float
    unseen: float
    trained_before: float
    unseen_before: float
    n_trained: int
    n_unseen: int
    gap_se: float = 0.0  # from the per-problem gains (paired before/after)
    heldout: float | None = None  # the stage's held-out benchmark figure (its eval stage)

    @property
    def gap(self) -> float:
        return (self.trained - self.trained_before) - (self.unseen - self.unseen_before)

    def metrics(self) -> dict[str, float]:
        out = {"memorisation/trained": self.trained, "memorisation/unseen": self.unseen,
               "memorisation/trained_gain": self.trained - self.trained_before,
               "memorisation/unseen_gain": self.unseen - self.unseen_before,
               "memorisation/gap": self.gap}
        if self.heldout is not None:
            out["memorisation/heldout"] = self.heldout
        return out

    def line(self) -> str:
        held = "" if self.heldout is None else f"; held-out {self.heldout:.3f}"
        return (f"trained {self.trained:.3f} ({self.trained - self.trained_before:+.3f}, "
                f"{self.n_trained} problems), unseen {self.unseen:.3f} "
                f"({self.unseen - self.unseen_before:+.3f}, {self.n_unseen}): gap "
                f"{self.gap:+.3f} +/- {1.96 * self.gap_se:.3f}{held}")


def gap_of(stage: str, before: dict[str, list[float]], after: dict[str, list[float]],
           heldout: float | None = None) -> GapResult:
    """The GapResult of per-problem accuracies ({"trained": [...], "unseen": [...]}) of the
    start model (`before`) and the stage's model (`after`) on the same problems."""
    gains = {k: [a - b for a, b in zip(after[k], before[k])] for k in ("trained", "unseen")}
    return GapResult(stage, _mean(after["trained"]), _mean(after["unseen"]),
                     _mean(before["trained"]), _mean(before["unseen"]),
                     len(after["trained"]), len(after["unseen"]),
                     math.hypot(_se(gains["trained"]), _se(gains["unseen"])), heldout)


def per_problem_accuracy(records: list[dict], extraction: str = "strict") -> list[float]:
    """Each problem's sampled accuracy in eval records (evaluation.score_problems)."""
    key = "sample_correct" if extraction == "strict" else f"sample_correct_{extraction}"
    return [sum(r[key]) / len(r[key]) if r.get(key) else 0.0 for r in records]


def sampled_only(cfg):
    """The eval protocol without its greedy pass: the probe reads the sampled accuracy only."""
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"greedy": False})})


def score_sets(records_of: Callable[[list[Problem]], list[dict]],
               sets: dict[str, list[Problem]], extraction: str = "strict"
               ) -> dict[str, list[float]]:
    """{name: per-problem accuracy} of each problem set; `records_of(problems)` scores them
    (evaluation.score_problems under sampled_only(cfg), here or in the eval's workers),
    all sets in one call: one model load, one worker process."""
    flat = [p for problems in sets.values() for p in problems]
    scores = per_problem_accuracy(records_of(flat), extraction) if flat else []
    out, start = {}, 0
    for name, problems in sets.items():
        out[name], start = scores[start:start + len(problems)], start + len(problems)
    return out


def gap_findings(result: GapResult, threshold: float) -> list[Finding]:
    """`memorisation_gap` (warn) when the gain on trained problems exceeds the gain on
    unseen ones by more than `threshold`, and by more than its noise (95% lower bound > 0)."""
    if result.gap <= threshold or result.gap - 1.96 * result.gap_se <= 0:
        return []
    return [Finding("memorisation_gap", "warn", [], {
        "stage": result.stage, "trained": round(result.trained, 4),
        "unseen": round(result.unseen, 4), "gap": round(result.gap, 4),
        "threshold": threshold},
        summary=f"{result.stage} scores {result.trained:.3f} on problems it trained on "
                f"({result.trained - result.trained_before:+.3f}), {result.unseen:.3f} on "
                f"unseen ones of the same distribution ({result.unseen - result.unseen_before:+.3f});"
                f" gap {result.gap:+.3f} > {threshold:g}")]


def repeat_findings(stage: str, uses: dict[str, float], limit: int) -> list[Finding]:
    """`prompt_repeats` (warn) when a GRPO round trained any prompt more than `limit` times
    (`uses`: problem id -> groups trained)."""
    if not uses or max(uses.values()) <= limit:
        return []
    over = sum(u > limit for u in uses.values())
    top = max(uses.values())
    return [Finding("prompt_repeats", "warn", [], {
        "stage": stage, "prompts": len(uses), "over_limit": over, "max_uses": top,
        "limit": limit},
        summary=f"{stage} trained {over} of its {len(uses)} prompts more than {limit} times "
                f"(at most {top:g})")]
