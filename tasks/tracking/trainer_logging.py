"""The keys and tags the trainer callback (tasks.tracking.step_logger, which imports
transformers) sends a point under, importable without transformers."""
from __future__ import annotations

# The trainer's end-of-training summary: one value per run, a one-dot chart as a metric;
# tags of the run instead (`trainer.<key>`, readable on its overview).
RUN_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                         "total_flos", "train_loss"})


# MLflow 3.17's run page groups charts by key prefix in alphabetical order, so a GRPO round
# opened on TRL's seven completions/* charts. The three curves that say whether the round
# learned are also sent under a prefix that sorts first (checked in Chromium by
# bench/mlflow_ui_check.py); their original keys stay for anyone who reads them by name.
HEADLINE_CURVES = {"reward": "0 headline/reward", "rewards/accuracy/mean": "0 headline/accuracy",
                   "completions/mean_length": "0 headline/mean_length",
                   # in_round_eval.every: the held-out points beside the training accuracy
                   "in_round_eval/accuracy": "0 headline/accuracy_in_round_eval"}

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
