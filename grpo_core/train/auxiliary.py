"""Trainable modules beside the policy (PPO's value model, grpo_vhead's value head) inside
TRL's training loop, which only knows the policy.

The Trainer builds its optimizer from the policy's parameters, clips the policy's gradient
norm, zeroes the policy's gradients after each step and checkpoints the policy. An
auxiliary module gets each of those (grpo_core.train.trainer.AuxiliaryGRPOTrainer, and
ClearAuxGrads here): its own parameter group (its learning rate,
TRL's schedule), its own gradient-norm clip (args.max_grad_norm), its gradients cleared at
each step's end, and its weights in every checkpoint folder (written before the Trainer's
trainer_state.json, which marks a checkpoint complete) and read back on resume. The saved
final model stays the policy alone.

One training process only: an auxiliary module is not part of the DDP-wrapped model, so
its gradients would not be averaged across ranks (refused at round start).
"""
from __future__ import annotations

import torch
from transformers import TrainerCallback

AUX_FILE = "auxiliary_{name}.pt"  # in each checkpoint folder


def check_one_process(trainer, algorithm: str) -> None:
    n = trainer.accelerator.num_processes
    if n > 1:
        raise ValueError(
            f"algorithm.name: {algorithm} trains a module beside the policy that runs in one "
            f"process; this round has {n} (train.num_processes). Set train.num_processes: 1 "
            "or algorithm.name: grpo / rloo")


class ClearAuxGrads(TrainerCallback):
    """The Trainer zeroes the policy's gradients after each optimizer step (and after a
    skipped one, skip_update_below); these are not the policy's."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kw):
        for p in self.trainer.aux_parameters():
            p.grad = None


def add_auxiliary(trainer, name: str, module: torch.nn.Module, lr: float) -> None:
    """Put `module` on `trainer`'s device (an AuxiliaryGRPOTrainer,
    grpo_core.train.trainer) and in its optimizer."""
    module.to(trainer.accelerator.device).train()
    trainer.aux = {**trainer.aux, name: (module, lr)}
    if len(trainer.aux) == 1:
        trainer.add_callback(ClearAuxGrads(trainer))
