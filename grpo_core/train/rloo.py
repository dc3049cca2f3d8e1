"""RLOO (algorithm.name: rloo): TRL 1.16's own RLOOTrainer, run by run_grpo_round with the
same config, reward functions, callbacks (KL schedule, monitor, in-round eval, skipped
updates), stop strings, rollout sink and saving as GRPO: PipelineRLOOTrainer
(grpo_core.train.trainer) has the same hooks over RLOOTrainer, which has GRPOTrainer's
generate / score / log methods.

RLOO differs from GRPO in TRL's implementation, not ours (Ahmadian et al., 2024):
- the baseline of completion i is the mean reward of the *other* G - 1 completions of its
  prompt; no std scaling. grpo.scale_rewards "batch" maps to RLOOConfig's
  normalize_advantages (whitening over the batch); "group" (the default) and "none" give
  RLOO's plain leave-one-out advantage.
- the KL to the reference (grpo.beta, and rounds.kl_schedule) is a sequence-level penalty
  subtracted from the reward, with the first-order estimator, not a term of the loss.
- the loss is a clipped ratio of whole-sequence probabilities (grpo.epsilon); grpo.loss_type
  other than grpo is refused at load.
Refused at load: dynamic sampling (RLOO's batch carries sequence log-probs the splice does
not know), `grpo:` keys that are not RLOOConfig fields, grpo.num_generations 1. Several
training processes work as TRL's RLOOTrainer does.
"""
from __future__ import annotations

from grpo_core.train.trl_args import grpo_kwargs

GRPO_ONLY = ("loss_type", "scale_rewards")  # GRPOConfig fields RLOOConfig lacks


def trl_args(cfg, output_dir: str, report_to=None, round_no: int = 1):
    from trl import RLOOConfig

    owned = grpo_kwargs(cfg, output_dir, report_to, round_no)
    owned = {k: v for k, v in owned.items() if k not in GRPO_ONLY}
    return RLOOConfig(**{**owned,
                         "normalize_advantages": cfg.grpo.scale_rewards == "batch"})


def prepare(trainer, cfg) -> None:
    """Nothing beyond TRL's trainer."""
