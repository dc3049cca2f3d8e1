"""Trainable modules beside the policy (PPO's value model, grpo_vhead's value head) inside
TRL's training loop, which only knows the policy.

The Trainer builds its optimizer from the policy's parameters, clips the policy's gradient
norm, zeroes the policy's gradients after each step and checkpoints the policy. An
auxiliary module gets each of those here: its own parameter group (its learning rate,
TRL's schedule), its own gradient-norm clip (args.max_grad_norm), its gradients cleared at
each step's end, and its weights in every checkpoint folder (written before the Trainer's
trainer_state.json, which marks a checkpoint complete) and read back on resume. The saved
final model stays the policy alone.

One training process only: an auxiliary module is not part of the DDP-wrapped model, so
its gradients would not be averaged across ranks (refused at round start).
"""
from __future__ import annotations

import os

import torch

AUX_FILE = "auxiliary_{name}.pt"  # in each checkpoint folder


def check_one_process(trainer, algorithm: str) -> None:
    n = trainer.accelerator.num_processes
    if n > 1:
        raise ValueError(
            f"algorithm.name: {algorithm} trains a module beside the policy that runs in one "
            f"process; this round has {n} (train.num_processes). Set train.num_processes: 1 "
            "or algorithm.name: grpo / rloo")


def with_auxiliary(base):
    """`base` (a RecordingGRPOTrainer) whose `aux` modules {name: (module, lr)} are trained
    with the policy (see the module doc). Set `aux` before train()."""

    class WithAuxiliary(base):
        aux: dict = {}

        def aux_parameters(self) -> list:
            return [p for module, _ in self.aux.values() for p in module.parameters()]

        def create_optimizer(self, model=None):
            opt = super().create_optimizer(model)
            held = {id(p) for group in opt.param_groups for p in group["params"]}
            for module, lr in self.aux.values():
                params = [p for p in module.parameters() if id(p) not in held]
                if params:  # TRL's scheduler scales every group's lr alike
                    opt.add_param_group({"params": params, "lr": lr, "weight_decay": 0.0})
            return opt

        def _clip_grad_norm(self, model):
            norm = super()._clip_grad_norm(model)
            params = [p for p in self.aux_parameters() if p.grad is not None]
            if params:
                aux = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
                self._metrics["train"]["aux/grad_norm"].append(float(aux))
            return norm

        def _save_checkpoint(self, model, trial):
            if self.args.should_save:
                folder = os.path.join(self._get_output_dir(trial=trial),
                                      f"checkpoint-{self.state.global_step}")
                os.makedirs(folder, exist_ok=True)
                for name, (module, _) in self.aux.items():
                    torch.save(module.state_dict(), os.path.join(folder, AUX_FILE.format(name=name)))
            super()._save_checkpoint(model, trial)

        def _load_optimizer_and_scheduler(self, checkpoint):
            if checkpoint is not None:
                for name, (module, _) in self.aux.items():
                    path = os.path.join(checkpoint, AUX_FILE.format(name=name))
                    if not os.path.isfile(path):
                        raise FileNotFoundError(f"{path}: the checkpoint lacks the {name} weights "
                                                "its optimizer state belongs to")
                    module.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            super()._load_optimizer_and_scheduler(checkpoint)

    return WithAuxiliary


def add_auxiliary(trainer, name: str, module: torch.nn.Module, lr: float) -> None:
    """Put `module` on the trainer's device and in its optimizer (see with_auxiliary)."""
    from transformers import TrainerCallback

    module.to(trainer.accelerator.device).train()
    trainer.aux = {**trainer.aux, name: (module, lr)}
    if len(trainer.aux) == 1:
        class ClearAuxGrads(TrainerCallback):
            """The Trainer zeroes the policy's gradients after each optimizer step (and
            after a skipped one, skip_update_below); these are not the policy's."""

            def on_step_end(self, args, state, control, **kw):
                for p in trainer.aux_parameters():
                    p.grad = None

        trainer.add_callback(ClearAuxGrads())
