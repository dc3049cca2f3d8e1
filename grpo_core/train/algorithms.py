"""algorithm.name -> its training path, one module each (grpo_core.train.ppo, .rloo,
.vhead; plain GRPO is grpo_core.train.trainer's own trainer).

An `Algorithm` is three things run_grpo_round calls in order:
- trl_args(cfg, output_dir, report_to, round_no): TRL's config for the round;
- trainer: the trainer class (PipelineGRPOTrainer or one of its kind: its `rebaseline`
  may replace TRL's advantages, an AuxiliaryGRPOTrainer its `auxiliary_loss` add to TRL's);
- prepare(trainer, cfg): after construction, before any step (its models, its refusals)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_core.train import ppo, rloo, vhead
from grpo_core.train.trainer import PipelineGRPOTrainer, PipelineRLOOTrainer
from grpo_core.train.trl_args import trl_grpo_args


@dataclass(frozen=True)
class Algorithm:
    trl_args: Callable
    trainer: type
    prepare: Callable


def nothing_to_prepare(trainer, cfg) -> None:
    """TRL's trainer as it is."""


ALGORITHMS = {
    "grpo": Algorithm(trl_grpo_args, PipelineGRPOTrainer, nothing_to_prepare),
    "ppo": Algorithm(ppo.trl_args, ppo.PPOTrainer, ppo.prepare),
    "rloo": Algorithm(rloo.trl_args, PipelineRLOOTrainer, rloo.prepare),
    "grpo_vhead": Algorithm(vhead.trl_args, vhead.ValueHeadGRPOTrainer, vhead.prepare),
}
