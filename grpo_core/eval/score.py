"""A model's score on one benchmark, as an eval stage keeps it: the metrics and what
identifies the evaluation behind them (its protocol, its per-problem records' run, the
split and problem set). Every reader after the eval stage (the round gate, the budget
check, the headline, the comparison, the registry) takes `Scores`, {benchmark: score}."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class BenchmarkScore(BaseModel):
    model_config = ConfigDict(frozen=True)

    # {metric name: {"mean", "lo", "hi", ...}} and scalars (n_problems, scorer_errors);
    # the names are grpo_core.eval.metric_names's.
    metrics: dict[str, Any] = {}
    protocol_hash: str | None = None  # the eval protocol's hash: scores compare only within one
    eval_run_id: str | None = None  # the store's eval run holding the per-problem records
    split: str | None = None
    problems_hash: str | None = None

    def metric(self, name: str) -> dict[str, Any]:
        """The block of metric `name` ({"mean", "lo", "hi", ...}); {} when not measured."""
        return self.metrics.get(name) or {}


Scores = dict[str, BenchmarkScore]
"""{benchmark: score}: one evaluation of one model."""


def metric_of(scores: Scores, bench: str, name: str) -> dict[str, Any]:
    """The block of metric `name` on `bench`; {} when the benchmark or metric is absent."""
    score = scores.get(bench)
    return score.metric(name) if score else {}
