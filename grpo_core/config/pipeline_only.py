"""The pipeline's own sections: what TRL has no field for. `rounds` (iterative GRPO and
its KL schedule), `algorithm` (the policy update's baseline), `dynamic_sampling` (DAPO),
`in_round_eval`, `diagnosis` and `sft_stage` (whether the SFT cold start runs)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grpo_core.config.base import Section


class KLSchedule(Section):
    kind: Literal["constant", "linear", "cosine"] = "constant"
    """constant uses grpo.beta; linear/cosine go from beta_start to beta_end (TRL's beta
    is set to the schedule's value at every step)."""
    beta_start: float = Field(default=0.1, ge=0)
    beta_end: float = Field(default=0.01, ge=0)
    per: Literal["round", "run"] = "round"
    """round: every round runs the schedule from beta_start to beta_end; run: one schedule
    over all rounds.count x grpo.max_steps steps, each round continuing where the last ended."""


class RoundsConfig(Section):
    """Iterative GRPO: rounds of grpo.max_steps steps, re-filtering between them."""

    count: int = Field(default=1, ge=1)
    kl_schedule: KLSchedule = Field(default_factory=KLSchedule)
    skip_update_below: float | None = None
    """Skip the optimizer step (no parameter or optimizer-state change) when every reward
    in its generation batch is below this (seeds' option). Not under DeepSpeed, whose
    engine steps inside backward."""
    kl_ceiling: float | None = Field(default=None, gt=0)
    """Stop the round when KL exceeds this (divergence guard)."""
    rollback_on_regression: bool = True
    """When a round's evaluation falls below the lower bound of the CI of the evaluation it
    started from (eval.primary_metric, on the first benchmark), the next round, the final
    evaluation and the registered model start from the best model evaluated so far (a
    finding says so; grpo_core/eval/round_gate.py). false: the finding only, and training
    goes on from the round's model. Retraining (one round) leaves it to the promotion rule."""


class AlgorithmConfig(Section):
    name: Literal["grpo", "ppo", "rloo", "grpo_vhead"] = "grpo"
    """Baseline of the policy update: grpo (group mean, the paper), ppo (learned critic, GAE;
    grpo_core/train/ppo.py), rloo (TRL's RLOOTrainer: `grpo:` then holds RLOOConfig fields),
    grpo_vhead (group mean mixed with an auxiliary value head's prediction;
    grpo_core/train/vhead.py)."""
    gae_gamma: float = Field(default=1.0, ge=0, le=1)
    """ppo: GAE discount over completion tokens (1.0: InstructGPT's, TRL PPO's)."""
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    """ppo: GAE lambda (0.95: InstructGPT's, TRL PPO's)."""
    value_clip: float = Field(default=0.2, gt=0)
    """ppo: the value update is clipped to the rollout's values +- this (TRL PPO's cliprange_value)."""
    value_loss_coef: float = Field(default=0.1, ge=0)
    """ppo and grpo_vhead: weight of the value (MSE) loss next to the policy loss (TRL PPO's vf_coef)."""
    value_learning_rate: float | None = Field(default=None, gt=0)
    """ppo: the value model's learning rate; None: grpo.learning_rate (TRL PPO's one optimizer)."""
    vhead_weight: float = Field(default=0.5, ge=0, le=1)
    """grpo_vhead: baseline = (1 - w) x group mean + w x head prediction; 0 is plain GRPO, exactly."""
    vhead_learning_rate: float = Field(default=1e-3, gt=0)
    """grpo_vhead: the head's learning rate (a linear probe on detached features, so above the policy's)."""


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling, which TRL lacks: a group whose rewards are all equal has
    zero advantage everywhere and teaches nothing; it is dropped from the optimizer step
    and replaced by the groups of fresh prompts."""

    enabled: bool = False
    max_regenerations: int = Field(default=3, ge=1)
    """Extra generation passes per optimizer step to refill dropped groups; when the cap is
    hit the step trains on what it has, the still-uninformative groups included."""


class InRoundEvalConfig(Section):
    every: int | None = Field(default=None, ge=1)
    """Evaluate the policy every N optimizer steps (and at the last) on `problems`
    held-out pool problems (greedy, strict accuracy); the round's model is the best of
    those checkpoints, not the last. None: no in-round evaluation."""
    problems: int = Field(default=32, ge=1)
    """Size of the in-round held-out slice: pool problems the round does not train on."""
    patience: int | None = Field(default=None, ge=1)
    """Stop the round after this many in-round evaluations in a row below the best."""


class SFTStageConfig(Section):
    """The SFT cold start (the SFT+GRPO recipe); how it trains is the `sft:` section."""

    enabled: bool = False
    """Run the SFT cold start before GRPO."""
    max_examples: int | None = Field(default=None, ge=1)
    """Train on at most this many traces."""


class ProbeConfig(Section):
    """The memorisation probe after SFT and each GRPO round: accuracy (eval.samples at
    eval.temperature) on problems the stage trained on, on RL-part problems no stage sees
    (the RL part's last `problems` rows, held back from every round), and the held-out
    benchmark beside them; after SFT, the RL-readiness of the model on those unseen ones."""

    problems: int = Field(default=64, ge=0)
    """Problems in each probe set (0: no probe, nothing held back)."""
    gap_threshold: float = Field(default=0.05, ge=0, le=1)
    """memorisation_gap fires when the stage's gain on its trained problems exceeds its gain
    on unseen ones by more than this (and by more than the noise)."""
    min_entropy: float = Field(default=0.18, ge=0)
    """sft_entropy_collapsed fires below this policy entropy (nats/token at grpo.temperature)."""
    max_zero_variance_share: float = Field(default=0.8, ge=0, le=1)
    """sft_zero_variance fires when more unseen prompts than this share would give a GRPO
    group with equal rewards (all G right or all wrong)."""
    max_prompt_repeats: int = Field(default=4, ge=1)
    """prompt_repeats fires when a GRPO round trains any prompt more times than this."""


class DiagnosisConfig(Section):
    """Thresholds of the rules run over each GRPO round's per-step metrics
    (grpo_core/train/diagnosis.py). They do not change training, so not the round's cache key."""

    collapse_threshold: float = Field(default=0.9, ge=0, le=1)
    """Flag collapse when the fraction of zero-variance groups exceeds this ..."""
    collapse_patience: int = Field(default=5, ge=1)
    """... for this many consecutive steps."""

    window: int = Field(default=5, ge=2)
    """Steps: the tail truncation and KL are averaged over, the fewest a trend is fitted on."""
    constant_patience: int = Field(default=8, ge=1)
    """Consecutive steps a reward function's std must stay ~0 for reward_fn_constant."""
    constant_std: float = Field(default=1e-4, ge=0)
    """A rewards/<fn>/std at or below this counts as zero."""
    level_margin: float = Field(default=0.05, ge=0, lt=0.5)
    """Accuracy within this fraction of its range from 0 (or 1) counts as at the floor (ceiling)."""
    reward_range: tuple[float, float] = (0.0, 1.0)
    """Floor and ceiling of the total reward, used when no rewards/accuracy/mean is logged."""
    length_trend: float = Field(default=0.3, gt=0)
    """Relative change of mean completion length over the round that counts as a trend."""
    min_change: float = Field(default=0.05, ge=0)
    """Accuracy (fraction of its range) or shaping-reward change over the round below which it is flat."""
    truncation_ratio: float = Field(default=0.3, ge=0, le=1)
    """Mean completions/clipped_ratio over the last `window` steps above which truncation fires."""
    format_drop: float = Field(default=0.2, gt=0)
    """Fall of rewards/format/mean over the round (fitted, reward units) that counts as dropping."""
    kl_floor: float = Field(default=0.1, ge=0)
    """kl_rising needs the last `window` steps' mean KL above this (and KL still rising)."""
    kl_high: float = Field(default=1.0, gt=0)
    """kl_rising also fires, rising or not, when the last `window` steps' mean KL is above
    this (nats/token): the policy has left the reference even if the beta term now holds it."""
    repeated_pattern_share: float = Field(default=0.5, gt=0, le=1)
    """reward_hacking_suspect also fires when one wrong completion pattern (its normalised
    text, or its final answer) appears under more than this fraction of a batch's prompts,
    averaged over `window` logged steps (grpo_core/train/batch_patterns.py). 0.5: "most of
    a batch"; different problems' wrong answers rarely agree, a template's placeholder does."""
    repeated_pattern_min_prompts: int = Field(default=3, ge=2)
    """Batches with fewer prompts are not measured: one problem's completions agreeing is
    a diversity question (no_diversity), not a pattern across problems."""
    stop_on_collapsed_start: bool = False
    """Stop before a GRPO round whose difficulty filter finds no problem solved only
    sometimes under the round's input model (every group's accuracy reward equal, e.g. all
    0: diagnosis.start_collapse's finding, raised as CollapsedStart naming the fix) instead
    of training it on the whole pool with zero advantage. Off: that fallback, with a note
    (random test models train that way)."""

    @model_validator(mode="after")
    def _ordered(self) -> DiagnosisConfig:
        if self.reward_range[0] >= self.reward_range[1]:
            raise ValueError("reward_range: the floor must be below the ceiling")
        return self
