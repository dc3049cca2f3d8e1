"""PPO with a learned critic (algorithm.name: ppo) on TRL's GRPOTrainer: what GRPO's group
baseline replaces, measured side by side by bench/grpo_vs_ppo.py.

A value model (the policy's decoder stack copied from the policy, with a scalar head
initialised to zero) predicts, at every completion token, the reward still to come. The
rule reward is sequence-level: it is placed on the completion's last token, every other
token's reward is 0, and GAE over the per-token values gives token-level advantages
(algorithm.gae_gamma, algorithm.gae_lambda), whitened over the batch's completion tokens. The
policy loss is GRPOTrainer's own (the same clipped ratio and, with grpo.beta, the same KL
to the frozen reference in the loss) on those (B, T) advantages; the value loss is PPO's
clipped one (algorithm.value_clip) weighted by algorithm.value_loss_coef, and the value model's
parameters are a second group of the Trainer's optimizer (grpo_core.train.auxiliary).
Samples per prompt are grpo.num_generations, 1 allowed (no group is needed).

How it sits in TRL: PipelineGRPOTrainer's `rebaseline` hook runs after TRL's
generate-score step and replaces its group advantages with GAE's (the values of the
rollout and their returns travel in the batch as `old_values` and `returns`);
`auxiliary_loss` adds the value loss to TRL's. Rollout rows record each completion's mean
token advantage.

What it simplifies compared with a full RLHF PPO (InstructGPT; TRL's old PPOTrainer,
OpenRLHF, verl):
- No learned reward model: the reward is the rule rewards (rewards.funcs), so PPO holds
  policy + reference + value model, not the write-ups' four models (bench/grpo_vs_ppo.py
  --reward-model adds one to reproduce that count).
- KL to the reference is in the loss (as GRPO, beta x k3 estimator per token), not a
  per-token penalty folded into the reward before GAE; the value model learns the rule
  reward alone.
- The value model is a copy of the policy's stack initialised from the policy (RLHF PPO
  usually starts it from the reward model) and the head starts at 0.
- No separate value-model epochs or minibatch schedule: policy and value share each
  optimizer step (grpo.num_iterations passes over a batch), one gradient clip each.
- No reward whitening or clipping, no adaptive KL controller (rounds.kl_schedule is the
  option), no entropy bonus beyond what TRL offers.
- One training process (train.num_processes: 1); dynamic sampling is refused at load.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from grpo_core.train.auxiliary import add_auxiliary, check_one_process
from grpo_core.train.trainer import AuxiliaryGRPOTrainer
from grpo_core.train.trainer_internals import drop_metric, log_metric
from grpo_core.train.trainer_setup import one_completion_per_prompt
from grpo_core.train.trl_args import grpo_kwargs, trl_grpo_args


class ValueModel(nn.Module):
    """The policy's architecture with a scalar head: a copy of its decoder stack (weights
    from the policy) and Linear(hidden, 1) starting at 0."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)
        # skip_init: no draw from the random stream TRL samples completions with
        self.head = nn.utils.skip_init(nn.Linear, policy.config.get_text_config().hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L) float32 values, V(ids[:, :t + 1]) at position t."""
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False).last_hidden_state
        return self.head(h.to(self.head.weight.dtype)).squeeze(-1).float()


# ----------------------------------------------------------------------------- pure steps


def completion_values(values: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """(B, P+C) values over prompt + completion -> (B, C): the value of the state before
    each completion token (positions P-1 .. P+C-2)."""
    return values[:, prompt_len - 1:-1]


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence rewards -> (B, T) token rewards: each on its completion's last token
    (mask: (B, T) right-padded 0/1), 0 elsewhere; rows without a token get none."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    length = mask.sum(1).long()
    rows = torch.nonzero(length > 0).squeeze(1)
    out[rows, length[rows] - 1] = rewards[rows].float()
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over (B, T) right-padded token sequences:
    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token = 0),
    A_t = delta_t + gamma lam A_{t+1}. Returns (advantages, returns = A + V), 0 on padding."""
    mask = mask.float()
    T = rewards.size(1)
    adv = torch.zeros_like(values)
    last = torch.zeros_like(values[:, 0])
    for t in reversed(range(T)):
        alive = mask[:, t + 1] if t + 1 < T else torch.zeros_like(last)  # a next token exists
        next_v = values[:, t + 1] * alive if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * alive * last
        adv[:, t] = last * mask[:, t]
    return adv, (adv + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / (std + eps) over the masked entries; 0 elsewhere."""
    m = mask.bool()
    if m.sum() < 2:
        return x * mask
    vals = x[m]
    return (x - vals.mean()) / (vals.std() + eps) * mask


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's value loss 0.5 max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clamp(V - V_old,
    -clip, clip), averaged over masked tokens; and the fraction of tokens the clip bound."""
    m = mask.float()
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    a, b = (values - returns) ** 2, (clipped - returns) ** 2
    n = m.sum().clamp(min=1.0)
    loss = 0.5 * (torch.maximum(a, b) * m).sum() / n
    return loss, ((b > a).float() * m).sum() / n


# ----------------------------------------------------------------------------- TRL wiring


def trl_args(cfg, output_dir: str, report_to=None, round_no: int = 1):
    """GRPOTrainer's config; grpo.num_generations 1 (refused by TRL's config, which checks
    for a group) is set after it is built: the trainer itself runs with 1."""
    if cfg.grpo.num_generations > 1:
        return trl_grpo_args(cfg, output_dir, report_to, round_no)
    from trl import GRPOConfig

    owned = grpo_kwargs(cfg, output_dir, report_to, round_no)
    batch = owned["per_device_train_batch_size"] * owned["gradient_accumulation_steps"]
    if batch < 2:
        raise ValueError("algorithm.name: ppo with grpo.num_generations 1 needs grpo.per_device_train_batch_size "
                         "x grpo.gradient_accumulation_steps >= 2 (TRL's config checks for a group)")
    args = GRPOConfig(**{**owned, "num_generations": batch})
    return one_completion_per_prompt(args)


class PPOTrainer(AuxiliaryGRPOTrainer):
    """GRPOTrainer with a critic (see the module doc)."""

    value_model: ValueModel | None = None
    gae_gamma, gae_lambda, value_clip, value_loss_coef = 1.0, 0.95, 0.2, 0.1

    @torch.no_grad()
    def _values(self, prompt_ids, prompt_mask, completion_ids, completion_mask):
        ids = torch.cat([prompt_ids, completion_ids], dim=1)
        mask = torch.cat([prompt_mask, completion_mask], dim=1)
        step = self.args.per_device_train_batch_size
        with self.accelerator.autocast():
            values = torch.cat([self.value_model(ids[i:i + step], mask[i:i + step])
                                for i in range(0, ids.size(0), step)])
        return completion_values(values, prompt_ids.size(1))

    def rebaseline(self, out: dict, rewards: torch.Tensor) -> list[float]:
        mask = out["completion_mask"]
        if "tool_mask" in out:
            mask = mask * out["tool_mask"]
        values = self._values(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask)
        scored = ~torch.isnan(rewards.to(mask.device))  # one process: every row is local
        r = terminal_rewards(torch.nan_to_num(rewards.to(mask.device), nan=0.0), mask)
        adv, returns = gae(r, values, mask, self.gae_gamma, self.gae_lambda)
        adv = whiten(adv, mask * scored.unsqueeze(1))  # unscorable rows: 0, as TRL does
        returns = torch.where(scored.unsqueeze(1), returns, values)  # nothing to learn there
        out.update(advantages=adv, old_values=values, returns=returns)
        m = mask.float()
        tokens = m.sum().clamp(min=1.0)
        if self.num_generations == 1:  # no groups: TRL's 1.0 would read as a collapse
            drop_metric(self, "frac_reward_zero_std")
        log_metric(self, "ppo/value_mean", (values * m).sum() / tokens)
        log_metric(self, "ppo/return_mean", (returns * m).sum() / tokens)
        per_row = (adv * m).sum(1) / m.sum(1).clamp(min=1.0)
        return per_row.tolist()

    def auxiliary_loss(self, inputs: dict, loss: torch.Tensor) -> torch.Tensor:
        """TRL's clipped policy loss + beta KL, plus the value loss."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        with self.accelerator.autocast():
            values = completion_values(self.value_model(ids, attn), inputs["prompt_ids"].size(1))
        vloss, clipped = clipped_value_loss(values, inputs["old_values"], inputs["returns"], mask,
                                            self.value_clip)
        log_metric(self, "ppo/value_loss", vloss.detach())
        log_metric(self, "ppo/value_clipfrac", clipped.detach())
        # as TRL scales its "grpo" loss: a mean per micro-batch, over the accumulation steps
        scale = self.current_gradient_accumulation_steps if self.model.training else 1.0
        return loss + self.value_loss_coef * vloss / scale


def prepare(trainer, cfg) -> None:
    """The value model, copied from the policy as it starts the round, in the optimizer."""
    check_one_process(trainer, "ppo")
    g = cfg.algorithm
    trainer.gae_gamma, trainer.gae_lambda = g.gae_gamma, g.gae_lambda
    trainer.value_clip, trainer.value_loss_coef = g.value_clip, g.value_loss_coef
    policy = trainer.accelerator.unwrap_model(trainer.model)
    trainer.value_model = ValueModel(policy)
    add_auxiliary(trainer, "value_model", trainer.value_model, g.value_learning_rate or cfg.grpo.learning_rate)
