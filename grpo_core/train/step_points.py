"""What a trainer's log line becomes in MLflow (pure; tasks.tracking.step_logger sends it):
the keys a point is sent under, the one-value summary kept as tags, and the points left
out because they are constant by construction."""
from __future__ import annotations

from collections.abc import Mapping

from grpo_core.eval.metric_names import flatten_metrics, sanitize_key

# The trainer's end-of-training summary: one value per run, a one-dot chart as a metric;
# tags of the run instead (`trainer.<key>`, readable on its overview).
RUN_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                         "total_flos", "train_loss"})


# MLflow 3.17's run page groups charts by key prefix in alphabetical order, so a GRPO round
# opened on TRL's seven completions/* charts. The three curves that say whether the round
# learned are also sent under a group named for people that sorts first, "At a glance"
# (case-sensitive or not; checked in Chromium by
# bench/mlflow_ui_check.py); their original keys stay for anyone who reads them by name.
HEADLINE_CURVES = {"reward": "At a glance/reward", "rewards/accuracy/mean": "At a glance/accuracy",
                   "completions/mean_length": "At a glance/mean_length",
                   # in_round_eval.every: the held-out points beside the training accuracy
                   "in_round_eval/accuracy": "At a glance/accuracy_in_round_eval"}

# GRPO's loss on a small model is mostly beta x KL, ~1e-8 per token: MLflow's chart axis
# rounds such values to "0 0 0 0". It is also sent multiplied by a fixed power of ten
# (fixed, so runs stay comparable; the factor is in the name): ~1e-8 reads 0.01.
SCALED = {"loss": ("loss_x1e6", 1e6)}


def chart_copies(flat: dict[str, float], grpo: bool = True) -> dict[str, float]:
    """The extra keys a point is also sent under: HEADLINE_CURVES (sorted first on the
    run's chart tab) and, for a GRPO trainer's points, SCALED (a readable axis; SFT's
    cross-entropy loss reads well as it is)."""
    out = {HEADLINE_CURVES[k]: v for k, v in flat.items() if k in HEADLINE_CURVES}
    if grpo:
        out.update({SCALED[k][0]: v * SCALED[k][1] for k, v in flat.items() if k in SCALED})
    return out


def summary_tags(summary: dict) -> dict[str, str]:
    """{"trainer.train_loss": "0.0123", ...}: 4 significant digits (no float noise)."""
    return {f"trainer.{k}": f"{v:.4g}" if isinstance(v, float) else str(v)
            for k, v in summary.items()}


def step_points(logs: Mapping, args) -> tuple[dict, dict[str, float]]:
    """(the summary values in `logs`, the points to send: sanitised keys and values) of one
    log line of a trainer with TrainingArguments `args`. TRL's clip_ratio/* with
    num_iterations 1 are left out: the importance ratio is exactly 1, they are 0 at every
    step (five flat charts); a non-zero value is always sent."""
    summary = {k: v for k, v in logs.items() if k in RUN_SUMMARY}
    flat = flatten_metrics({k: v for k, v in logs.items() if k not in RUN_SUMMARY})
    # a GRPO trainer's arguments say how many completions per prompt
    flat.update(chart_copies(flat, grpo=hasattr(args, "num_generations")))
    one_iteration = getattr(args, "num_iterations", None) == 1
    return summary, {sanitize_key(k): v for k, v in flat.items()
                     if not (one_iteration and k.startswith("clip_ratio/") and v == 0)}


def errors_since(now: Mapping[str, int], start: Mapping[str, int]) -> dict[str, int]:
    """scorer_errors/<reward fn>: reward calls whose scoring raised (their reward was left
    out, not read as wrong) between the counts `start` and `now`
    (grpo_core.verify.rewards.scorer_error_counts)."""
    return {sanitize_key(f"scorer_errors/{label.removeprefix('reward/')}"): n - start.get(label, 0)
            for label, n in now.items() if label.startswith("reward/")}
