"""GRPO with an auxiliary value head as a baseline aid (algorithm.name: grpo_vhead): the
seeds' "half-critic" between GRPO's group mean and PPO's value model.

A scalar head (Linear(hidden, 1)) reads the policy's last hidden state at the prompt's
last token and is trained (MSE, weight algorithm.value_loss_coef, learning rate
algorithm.vhead_learning_rate) to predict the prompt's expected reward, its target the group's
mean reward. Its prediction v is mixed into GRPO's baseline:

    b = (1 - w) x group mean + w x v,   w = algorithm.vhead_weight

    A_i = TRL's (r_i - mean) / (s + 1e-4)  +  w (mean - v) / (s' + 1e-4)

which is (r_i - b) / (s + 1e-4) whenever s' = s. s is the scale TRL divides by
(grpo.scale_rewards: the group's reward std, the batch's, or none = 1); s' is the same
but for a group whose rewards are all equal (s = 0), where it is the batch's reward std
(1 when that is 0 too): GRPO gives such a group no advantage, and dividing the head's
correction by 1e-4 would blow it up. The head thus gives a zero-variance group a signal
(all solved where the head expected half: positive), which GRPO cannot.

- w = 0 is plain GRPO, exactly: the correction is 0, the head reads detached features (its
  loss sends no gradient into the policy) and has its own optimizer group, so the policy's
  advantages, gradients and weights are GRPO's (tests/test_algorithms.py checks it).
- The head starts at weight 0 and bias = the first batch's mean reward (no random draw),
  so an untrained head predicts the batch average, not 0.
- The features come from one extra no-grad forward of the policy over each group's prompt
  (one row per group), at generation time; the head trains on them in the loss step.
- One training process; dynamic sampling works (the head's inputs splice as row keys).
"""
from __future__ import annotations

import torch
from torch import nn

from grpo_core.train.auxiliary import add_auxiliary, check_one_process
from grpo_core.train.dynamic_sampling import TRL_ADVANTAGE_EPS
from grpo_core.train.trainer import AuxiliaryGRPOTrainer
from grpo_core.train.trainer_internals import log_metric, reward_std
from grpo_core.train.trl_args import trl_grpo_args

FEATURES, TARGET = "vhead_features", "vhead_target"  # per-row batch keys
EQUAL_STD = 1e-6  # a reward std at or below this counts as zero


class ValueHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.utils.skip_init(nn.Linear, hidden, 1)  # no draw from the RNG TRL samples with
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))  # bias set yet

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features.to(self.linear.weight.dtype)).squeeze(-1)


def mixed_advantages(trl_adv: torch.Tensor, rewards: torch.Tensor, prediction: torch.Tensor,
                     G: int, weight: float, scale: str) -> torch.Tensor:
    """(N,) advantages: TRL's plus the head's correction w (mean - v) / (s' + 1e-4) (see the
    module doc). rewards: (N,) NaN where unscorable (their advantage stays TRL's 0);
    prediction: (N / G,) one per group."""
    groups = rewards.view(-1, G)
    mean = torch.nanmean(groups, dim=1)
    batch_std = reward_std(rewards) if rewards.numel() > 1 else torch.zeros(())
    batch_std = torch.where(batch_std > EQUAL_STD, batch_std, torch.ones_like(batch_std))
    if scale == "none":
        denom = torch.ones_like(mean)
    elif scale == "batch":
        denom = batch_std.expand_as(mean) + TRL_ADVANTAGE_EPS
    else:
        std = reward_std(groups, dim=1)
        denom = torch.where(std > EQUAL_STD, std, batch_std) + TRL_ADVANTAGE_EPS
    correction = (weight * (mean - prediction) / denom).repeat_interleave(G)
    correction = torch.where(torch.isnan(rewards), torch.zeros_like(correction), correction)
    return trl_adv + correction.to(trl_adv)


def trl_args(cfg, output_dir: str, report_to=None, round_no: int = 1):
    return trl_grpo_args(cfg, output_dir, report_to, round_no)


class ValueHeadGRPOTrainer(AuxiliaryGRPOTrainer):
    """GRPOTrainer whose baseline mixes in a value head's prediction (see the module doc)."""

    vhead: ValueHead | None = None
    vhead_weight, value_loss_coef = 0.5, 0.1

    @torch.no_grad()
    def _prompt_features(self, prompt_ids, prompt_mask) -> torch.Tensor:
        """(B, H) the policy's last hidden state at each prompt's last token (prompts
        are left-padded: the last position)."""
        policy = self.accelerator.unwrap_model(self.model)
        with self.accelerator.autocast():
            h = policy.base_model(input_ids=prompt_ids, attention_mask=prompt_mask,
                                  use_cache=False).last_hidden_state
        return h[:, -1].float()

    def rebaseline(self, out: dict, rewards: torch.Tensor) -> list[float]:
        G = self.num_generations
        device = out["advantages"].device
        features = self._prompt_features(out["prompt_ids"][::G], out["prompt_mask"][::G])
        target = torch.nanmean(rewards.view(-1, G), dim=1).to(device)  # (groups,)
        head = self.vhead
        with torch.no_grad():
            if not head.started:  # an untrained head predicts the batch average
                head.linear.bias.fill_(float(torch.nan_to_num(torch.nanmean(target), nan=0.0)))
                head.started.fill_(True)
            prediction = head(features)
        adv = mixed_advantages(out["advantages"], rewards.to(device), prediction, G,
                               self.vhead_weight, self.scale_rewards)
        out["advantages"] = adv
        out[FEATURES] = features.repeat_interleave(G, dim=0)
        out[TARGET] = target.repeat_interleave(G)
        log_metric(self, "vhead/prediction_mean", prediction.mean())
        ok = ~torch.isnan(target)
        if ok.any():
            log_metric(self, "vhead/abs_error", (prediction - target)[ok].abs().mean())
        return adv.tolist()

    def auxiliary_loss(self, inputs: dict, loss: torch.Tensor) -> torch.Tensor:
        target = inputs[TARGET]
        ok = ~torch.isnan(target)
        if not ok.any():
            return loss
        mse = ((self.vhead(inputs[FEATURES]) - target)[ok] ** 2).mean()
        log_metric(self, "vhead/loss", mse.detach())
        scale = self.current_gradient_accumulation_steps if self.model.training else 1.0
        return loss + self.value_loss_coef * mse / scale


def prepare(trainer, cfg) -> None:
    check_one_process(trainer, "grpo_vhead")
    if getattr(trainer, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        raise ValueError("algorithm.name: grpo_vhead mixes its baseline into TRL's "
                         "'sum_then_normalize' advantages; drop multi_objective_aggregation "
                         "from grpo")
    policy = trainer.accelerator.unwrap_model(trainer.model)
    trainer.vhead_weight, trainer.value_loss_coef = cfg.algorithm.vhead_weight, cfg.algorithm.value_loss_coef
    trainer.vhead = ValueHead(policy.config.get_text_config().hidden_size)
    add_auxiliary(trainer, "vhead", trainer.vhead, cfg.algorithm.vhead_learning_rate)
