"""The pipeline's config schema: every GRPO knob is a field with the papers' default.

A config is YAML validated by pydantic. `load_config(path, overrides)` returns a
`PipelineConfig` or raises `ConfigError`, whose message names the offending field, so
the CLI can print one line and exit 2 before any work starts.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)


class ConfigError(ValueError):
    """A config that cannot run. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config error: {field}: {message}" if field else f"config error: {message}")


class _Section(BaseModel):
    # Unknown keys are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectConfig(_Section):
    name: str = "grpo"
    """MLflow experiment and registered-model name stem."""
    recipe: str = "custom"
    """Label of the recipe (r1_zero, sft_grpo, ...), tagged on every run."""
    seed: int = 0
    """Seeds data generation, sampling and training."""
    workdir: str | None = None
    """Local state (DuckDB, MLflow, checkpoints); default ./.grpo or $GRPO_WORKDIR."""


class PeftConfig(_Section):
    """LoRA adapters (grpo_core/train/lora.py): TRL trains them on the frozen base, the
    reference is the base with adapters disabled, the saved model is merged."""

    enabled: bool = False
    """Train LoRA adapters instead of every weight (SFT and GRPO)."""
    r: int = Field(default=16, ge=1)
    """Adapter rank."""
    alpha: int = Field(default=32, ge=1)
    """LoRA alpha: the update is scaled by alpha / r."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapters' input. 0: GRPO's ratio compares two forward passes."""
    target_modules: str | list[str] = "all-linear"
    """`all-linear` (every linear layer but the LM head) or module names (q_proj, ...)."""


class ModelConfig(_Section):
    name_or_path: str = "builtin:tiny-arith"
    """Hugging Face id, local path, `builtin:tiny-arith` (built offline in-process), or
    `builtin:proxy-qwen2` (a random bf16 Qwen2 with multi-token tags and ChatML: runs the
    real presets' code paths on a CPU; its answers are noise)."""
    template: Literal["auto", "r1_zero", "chat"] = "auto"
    """Prompt template: R1-Zero text template for base models, chat template for instruct."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bfloat16 on GPU, float32 on CPU."""
    gguf_file: str | None = None
    """GGUF file inside name_or_path, when the weights are GGUF."""
    hub_token: SecretStr | None = None
    """Hugging Face token for gated or private models (better: the HF_TOKEN env var).
    Never written anywhere: dumps, hashes, MLflow and Prefect see `**********`."""
    peft: PeftConfig = Field(default_factory=PeftConfig)
    """LoRA (off by default)."""


class DataSource(_Section):
    source: str
    """Preset (gsm8k, math, math500, aime24, aime25, amc23), synthetic:arith, file path or hub id."""
    split: str | None = None
    """Split to read; default: the source's train split."""
    limit: int | None = Field(default=None, ge=1)
    """Keep at most this many problems (after shuffling with the seed)."""
    columns: dict[str, str] | None = None
    """Column mapping for generic files: {problem: col, answer: col, solution: col, ...}."""
    levels: list[int] | None = None
    """Synthetic task: difficulty levels to generate (1-5)."""


class DataConfig(_Section):
    train: list[DataSource] = Field(default_factory=lambda: [DataSource(source="synthetic:arith")])
    """Training pool sources."""
    data_dir: str | None = None
    """Local copies laid out like shared/data; default $GRPO_DATA_DIR."""
    decontaminate: bool = True
    """Exclude training problems sharing an n-gram with an eval set."""
    decontam_ngram: int = Field(default=8, ge=3)
    """n of the decontamination n-gram (after normalisation)."""
    max_problem_chars: int = Field(default=20000, ge=100)
    """Rows with longer problem text are quarantined as absurd."""
    store_lock_timeout: float = Field(default=60.0, ge=0)
    """Seconds to wait for the DuckDB store when another pipeline holds it."""
    allow_eval_split_training: bool = False
    """Allow a training source that is a benchmark's evaluation split (gsm8k test,
    math500, aime, amc). Off: such a config is refused; its numbers would be contaminated."""

    @model_validator(mode="after")
    def _no_eval_split(self) -> DataConfig:
        from grpo_core.data.benchmarks import is_eval_split

        for i, src in enumerate(self.train):
            if is_eval_split(src.source, src.split) and not self.allow_eval_split_training:
                raise ValueError(
                    f"train.{i}: {src.source} ({src.split or 'default split'}) is an evaluation "
                    "split; train on its train split, or set data.allow_eval_split_training")
        return self


class RolloutConfig(_Section):
    backend: Literal["auto", "hf", "vllm"] = "auto"
    """auto: vllm when installed and a GPU is present, else hf."""
    batch_size: int = Field(default=64, ge=1)
    """Sequences generated per forward batch (hf backend)."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Completion budget for filtering/eval sampling."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor parallel size."""
    data_parallel_size: int = Field(default=1, ge=1)
    """vLLM data parallel size (engine replicas) for filter and eval sampling."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """vLLM share of GPU memory."""


class FilterConfig(_Section):
    enabled: bool = True
    """Keep only prompts the current policy solves within the band."""
    k: int = Field(default=8, ge=1)
    """Samples per prompt to estimate its pass rate."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature of the estimate (the rollout temperature)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    band: tuple[float, float] = (0.3, 0.7)
    """Keep prompts whose pass rate lies in [lo, hi]."""
    max_problems: int | None = Field(default=None, ge=1)
    """Estimate at most this many problems per round (sampled with the seed)."""
    refilter_each_round: bool = True
    """Re-estimate pass rates under the current policy before every round."""
    shards: int = Field(default=1, ge=1)
    """Split the missing estimates across this many worker processes (a Prefect flow,
    flows/shards.py); 1 estimates in the pipeline's process. The rows do not change."""
    shard_runner: Literal["process", "ray", "dask"] = "process"
    """Where shards run when shards > 1: a local process pool, or a Ray / Dask cluster
    (extras grpo-pipeline[ray] / [dask]; workers need the model path and a shared folder)."""
    adaptive: bool = False
    """Sample in rounds and stop a problem once its interval lies wholly outside or wholly
    inside the band (grpo_core/eval/adaptive.py); k is the cap. Its samples are the first
    ones of the fixed-k estimate (same seeds)."""
    adaptive_start: int = Field(default=4, ge=1)
    """Samples every problem draws in the first round of an adaptive estimate."""
    adaptive_step: int = Field(default=4, ge=1)
    """Samples added per later round, up to k."""
    adaptive_confidence: float = Field(default=0.8, gt=0, lt=1)
    """Two-sided level of the Wilson interval the adaptive stop tests (stored: the 95% one)."""
    rollout_evidence_weight: float = Field(default=0.0, ge=0, le=1)
    """What one of the previous round's GRPO rollouts of a problem counts for, in fresh
    samples, in the next round's estimate (capped at k/2 in all; grpo_core/eval/evidence.py);
    0 turns it off."""

    @field_validator("band")
    @classmethod
    def _band_ordered(cls, band: tuple[float, float]) -> tuple[float, float]:
        lo, hi = band
        if not (0.0 <= lo <= hi <= 1.0):
            raise ValueError(f"band must satisfy 0 <= lo <= hi <= 1, got [{lo}, {hi}]")
        return band


class SFTConfig(_Section):
    enabled: bool = False
    """Run the SFT cold start before GRPO (the SFT+GRPO recipe)."""
    max_steps: int = Field(default=200, ge=1)
    learning_rate: float = Field(default=1e-3, gt=0)
    batch_size: int = Field(default=16, ge=1)
    max_length: int = Field(default=256, ge=16)
    max_examples: int | None = Field(default=None, ge=1)
    trl: dict[str, Any] = Field(default_factory=dict)
    """Any other field of the installed TRL `SFTConfig` (e.g. `lr_scheduler_type`,
    `warmup_steps`, `activation_checkpointing`), checked against it at load time. The keys
    of TRL_OWNED are set by the pipeline and refused here; everything else overrides the
    pipeline's defaults (cosine schedule, 5% warmup, checkpointing off for builtin:*)."""

    # TRL arguments the pipeline sets itself, and from what (grpo_core/train/sft.py builds them).
    TRL_OWNED: ClassVar[dict[str, str]] = {
        "output_dir": "the stage's checkpoint folder",
        "max_steps": "sft.max_steps",
        "learning_rate": "sft.learning_rate",
        "per_device_train_batch_size": "sft.batch_size",
        "max_length": "sft.max_length",
        "completion_only_loss": "the SFT data (loss on the trace only)",
        "save_strategy": "the SFT stage (saves only the final model)",
        "seed": "project.seed",
        "bf16": "train.precision",
        "fp16": "train.precision",
        "use_cpu": "the device (GPU when one is visible)",
        "report_to": "tracking (MLflow)",
        "model_init_kwargs": "train.precision (the pipeline loads the model)",
    }


class KLSchedule(_Section):
    kind: Literal["constant", "linear", "cosine"] = "constant"
    """constant uses grpo.beta; linear/cosine go from beta_start to beta_end."""
    beta_start: float = Field(default=0.1, ge=0)
    beta_end: float = Field(default=0.01, ge=0)
    per: Literal["round", "run"] = "round"
    """round: every round runs the schedule from beta_start to beta_end; run: one schedule
    over all grpo.rounds x grpo.max_steps steps, each round continuing where the last ended."""


class DynamicSamplingConfig(_Section):
    """DAPO's dynamic sampling, which TRL lacks: a group whose rewards are all equal has
    zero advantage everywhere and teaches nothing; it is dropped from the optimizer step
    and replaced by the groups of fresh prompts."""

    enabled: bool = False
    max_regenerations: int = Field(default=3, ge=1)
    """Extra generation passes per optimizer step to refill dropped groups; when the cap is
    hit the step trains on what it has, the still-uninformative groups included."""


class DiagnosisConfig(_Section):
    """Thresholds of the rules run over each GRPO round's per-step metrics
    (grpo_core/train/diagnosis.py; the collapse rules use grpo.collapse_threshold and
    grpo.collapse_patience). They do not change training, so not the round's cache key."""

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

    @model_validator(mode="after")
    def _ordered(self) -> DiagnosisConfig:
        if self.reward_range[0] >= self.reward_range[1]:
            raise ValueError("reward_range: the floor must be below the ceiling")
        return self


class GRPOConfig(_Section):
    rounds: int = Field(default=1, ge=1)
    """Iterative GRPO rounds, re-filtering between them."""
    algorithm: Literal["grpo", "ppo", "rloo", "grpo_vhead"] = "grpo"
    """Baseline of the policy update: grpo (group mean, the paper), ppo (learned critic, GAE;
    grpo_core/train/ppo.py), rloo (TRL's RLOOTrainer), grpo_vhead (group mean mixed with an
    auxiliary value head's prediction; grpo_core/train/vhead.py)."""
    num_generations: int = Field(default=8, ge=1)
    """G: completions per prompt (a group); 1 only under algorithm ppo (a critic baseline)."""
    beta: float = Field(default=0.04, ge=0)
    """KL coefficient (KL to the frozen reference is in the loss, not the reward)."""
    epsilon: float = Field(default=0.2, gt=0)
    """PPO-style clip epsilon."""
    epsilon_high: float | None = Field(default=None, gt=0)
    """Upper clip (DAPO clip-higher); None means epsilon."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "grpo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Std-normalise advantages within each group (the paper; TRL 1.16 divides by std + 1e-4,
    a constant it does not expose)."""
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    learning_rate: float = Field(default=1e-6, gt=0)
    max_completion_length: int = Field(default=64, ge=1)
    num_iterations: int = Field(default=1, ge=1)
    """mu: optimisation passes per batch of generations."""
    max_steps: int = Field(default=20, ge=1)
    """Optimizer steps per round."""
    prompts_per_step: int = Field(default=4, ge=1)
    """Prompts per accumulation step, all processes together. The batch arithmetic:
    one optimizer step consumes P = prompts_per_step x gradient_accumulation_steps prompts,
    C = P x num_generations completions (TRL's generation batch, sampled at once); each
    process takes C / train.num_processes of them in forward/backward passes of
    per_device_micro_batch completions. A round whose pool holds fewer than P prompts is
    refused (TRL would drop the incomplete batch and train 0 steps)."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Accumulation steps of prompts_per_step prompts per optimizer step (see
    prompts_per_step). With per_device_micro_batch unset it is also the number of
    forward/backward passes per optimizer step."""
    per_device_micro_batch: int | None = Field(default=None, ge=1)
    """Completions per forward/backward pass per process: what bounds activation memory.
    None: prompts_per_step x num_generations / train.num_processes (one prompt batch's
    completions at once). Set, the passes per optimizer step become C / (num_processes x
    per_device_micro_batch), which must be a whole number (checked at load: exit 2); the
    optimizer step itself (P prompts, C completions) does not change."""
    gradient_checkpointing: bool | None = None
    """Recompute activations in backward (TRL's activation_checkpointing): less memory,
    ~20% slower. None: on for real models, off for builtin:* ones."""
    save_total_limit: int | None = Field(default=2, ge=1)
    """Keep at most this many round checkpoints (each holds optimizer state: ~12 bytes
    per parameter); None keeps them all."""
    save_steps: int = Field(default=10, ge=1)
    """Checkpoint every N steps (resume continues from the last one)."""
    kl_schedule: KLSchedule = Field(default_factory=KLSchedule)
    collapse_threshold: float = Field(default=0.9, ge=0, le=1)
    """Flag collapse when the fraction of zero-variance groups exceeds this ..."""
    collapse_patience: int = Field(default=5, ge=1)
    """... for this many consecutive steps."""
    skip_update_below: float | None = None
    """Skip the optimizer step (no parameter or optimizer-state change) when every reward
    in its generation batch is below this (seeds' option). Not under DeepSpeed, whose
    engine steps inside backward."""
    kl_ceiling: float | None = Field(default=None, gt=0)
    """Stop the round when KL exceeds this (divergence guard)."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_completion_length out of the loss (TRL's option; DAPO):
    a truncated reasoning trace is not a wrong one."""
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    eval_every: int | None = Field(default=None, ge=1)
    """Evaluate the policy every N optimizer steps (and at the last) on eval_problems
    held-out pool problems (greedy, strict accuracy); the round's model is the best of
    those checkpoints, not the last. None: no in-round evaluation."""
    eval_problems: int = Field(default=32, ge=1)
    """Size of the in-round held-out slice: pool problems the round does not train on."""
    eval_patience: int | None = Field(default=None, ge=1)
    """Stop the round after this many in-round evaluations in a row below the best."""
    diagnosis: DiagnosisConfig = Field(default_factory=DiagnosisConfig)
    """Thresholds of the diagnosis rules run after each round (`grpo diagnose`)."""
    use_vllm: bool = False
    """Generate with vLLM inside TRL (GPU)."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """colocate: vLLM shares the training GPUs; server: a `trl vllm-serve` on its own GPUs."""
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(default=1, ge=1)
    """Colocate mode: vLLM tensor parallel size (GPUs per vLLM engine)."""
    vllm_server_launch: bool = True
    """Server mode: the stage starts `trl vllm-serve` for the round on the first
    vllm_server_gpus visible GPUs and trains on the rest; False: use a server you run."""
    vllm_server_gpus: int = Field(default=1, ge=1)
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = Field(default=8000, ge=1, le=65535)
    vllm_server_timeout: float = Field(default=600.0, gt=0)
    """Seconds to wait for the vLLM server to answer /health."""
    logging_steps: int = Field(default=1, ge=1)
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
    trl: dict[str, Any] = Field(default_factory=dict)
    """Any other field of the installed TRL `GRPOConfig` (e.g. `mask_truncated_completions`,
    `vllm_max_model_length`, `lr_scheduler_type`, `max_grad_norm`), checked against it at
    load time. The keys of TRL_OWNED are set by the pipeline and refused here; everything
    else overrides TRL's default or the pipeline's (top_k 0, no progress bars)."""

    # TRL arguments the pipeline sets itself, and from what (grpo_core/train/grpo.py builds them).
    TRL_OWNED: ClassVar[dict[str, str]] = {
        "output_dir": "the round's checkpoint folder",
        "num_generations": "grpo.num_generations",
        "per_device_train_batch_size": "grpo.per_device_micro_batch",
        "gradient_accumulation_steps": "grpo.gradient_accumulation_steps",
        "steps_per_generation": "grpo.gradient_accumulation_steps",
        "generation_batch_size": "grpo.prompts_per_step",
        "beta": "grpo.beta",
        "epsilon": "grpo.epsilon",
        "epsilon_high": "grpo.epsilon_high",
        "loss_type": "grpo.loss_type",
        "scale_rewards": "grpo.scale_rewards",
        "temperature": "grpo.temperature",
        "top_p": "grpo.top_p",
        "learning_rate": "grpo.learning_rate",
        "max_completion_length": "grpo.max_completion_length",
        "num_iterations": "grpo.num_iterations",
        "max_steps": "grpo.max_steps",
        "save_steps": "grpo.save_steps",
        "save_strategy": "grpo.save_steps",
        "save_total_limit": "grpo.save_total_limit",
        "logging_steps": "grpo.logging_steps",
        "seed": "project.seed",
        "data_seed": "project.seed",
        "bf16": "train.precision",
        "fp16": "train.precision",
        "use_cpu": "the device (GPU when one is visible)",
        "report_to": "tracking (MLflow)",
        "use_vllm": "grpo.use_vllm",
        "vllm_mode": "grpo.vllm_mode",
        "vllm_gpu_memory_utilization": "grpo.vllm_gpu_memory_utilization",
        "vllm_tensor_parallel_size": "grpo.vllm_tensor_parallel_size",
        "vllm_server_host": "grpo.vllm_server_host",
        "vllm_server_port": "grpo.vllm_server_port",
        "vllm_server_timeout": "grpo.vllm_server_timeout",
        "activation_checkpointing": "grpo.gradient_checkpointing",
        "gradient_checkpointing": "grpo.gradient_checkpointing",
        "remove_unused_columns": "the reward functions (they read the answer column)",
        "reward_weights": "rewards.weights",
        "mask_truncated_completions": "grpo.mask_truncated_completions",
        "model_init_kwargs": "train.precision (the pipeline loads the model)",
    }

    # grpo.algorithm's refusals: each names the field a user would change (field validators
    # see the fields declared above theirs, algorithm among them).
    @field_validator("num_generations")
    @classmethod
    def _group_baseline_needs_a_group(cls, g: int, info) -> int:
        if g < 2 and info.data.get("algorithm", "grpo") != "ppo":
            raise ValueError("a group baseline needs >= 2 completions per prompt; 1 is only for "
                             "grpo.algorithm: ppo (a learned critic)")
        return g

    @field_validator("loss_type")
    @classmethod
    def _rloo_has_its_own_loss(cls, loss: str, info) -> str:
        if loss != "grpo" and info.data.get("algorithm") == "rloo":
            raise ValueError(f"{loss!r} is a GRPOTrainer loss; grpo.algorithm: rloo trains with "
                             "RLOOTrainer's own sequence-level loss (leave loss_type: grpo)")
        return loss

    @field_validator("dynamic_sampling")
    @classmethod
    def _dynamic_sampling_splices_group_advantages(cls, ds, info):
        algo = info.data.get("algorithm")
        if ds.enabled and algo in ("ppo", "rloo"):
            raise ValueError(f"dynamic sampling splices GRPOTrainer's per-sequence batches; "
                             f"grpo.algorithm: {algo} carries other ones (per-token advantages and "
                             "values, or RLOO's sequence log-probs): disable it or use grpo / grpo_vhead")
        return ds

    @field_validator("trl")
    @classmethod
    def _rloo_takes_rloo_fields(cls, given: dict, info) -> dict:
        if given and info.data.get("algorithm") == "rloo":
            import dataclasses

            import trl

            known = {f.name for f in dataclasses.fields(trl.RLOOConfig)}
            bad = sorted(set(given) - known)
            if bad:
                raise ValueError(f"{bad[0]!r} is not a field of TRL's RLOOConfig, which "
                                 "grpo.algorithm: rloo trains with")
        return given


class LengthRewardConfig(_Section):
    min_tokens: int = Field(default=200, ge=0)
    max_tokens: int = Field(default=800, ge=1)
    penalty: float = Field(default=-0.5, le=0)
    """Reward at zero length / at twice max_tokens; linear in between."""

    @model_validator(mode="after")
    def _ordered(self) -> LengthRewardConfig:
        if self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must be <= max_tokens")
        return self


class SoftOverlongConfig(_Section):
    """DAPO's overlong reward shaping: 0 up to max_tokens - buffer_tokens, then a linear
    ramp to `penalty` at max_tokens (and beyond)."""

    max_tokens: int | None = Field(default=None, ge=2)
    """None: grpo.max_completion_length (where TRL truncates)."""
    buffer_tokens: int | None = Field(default=None, ge=1)
    """Length of the ramp; None: a fifth of max_tokens (DAPO: 4096 of 20480)."""
    penalty: float = Field(default=-1.0, le=0)

    def resolved(self, max_completion_length: int) -> tuple[int, int]:
        """(max_tokens, buffer_tokens) with the defaults filled in."""
        top = self.max_tokens or max_completion_length
        return top, min(self.buffer_tokens or max(1, top // 5), top)


class KeywordRewardConfig(_Section):
    keywords: list[str] = Field(
        default_factory=lambda: ["therefore", "so", "thus", "hence", "because", "因此", "所以"]
    )
    per_hit: float = Field(default=0.1, ge=0)
    max_reward: float = Field(default=0.5, ge=0)


class RepetitionRewardConfig(_Section):
    ngram: int = Field(default=3, ge=1)
    max_penalty: float = Field(default=-0.5, le=0)


class RewardsConfig(_Section):
    funcs: list[str] = Field(default_factory=lambda: ["accuracy", "format"])
    """Reward functions by registry name (grpo_core.verify.rewards.REWARDS)."""
    weights: list[float] | None = None
    """One weight per function; None means all 1.0."""
    format_reward: float = 0.5
    """+format_reward for <think>..</think><answer>..</answer>, minus it otherwise."""
    length: LengthRewardConfig = Field(default_factory=LengthRewardConfig)
    soft_overlong: SoftOverlongConfig = Field(default_factory=SoftOverlongConfig)
    reasoning_keywords: KeywordRewardConfig = Field(default_factory=KeywordRewardConfig)
    repetition: RepetitionRewardConfig = Field(default_factory=RepetitionRewardConfig)

    @model_validator(mode="after")
    def _check(self) -> RewardsConfig:
        from grpo_core.verify.rewards import REWARDS  # late: rewards imports nothing from here

        if not self.funcs:
            raise ValueError("funcs: at least one reward function is needed")
        unknown = [f for f in self.funcs if f not in REWARDS]
        if unknown:
            raise ValueError(f"funcs: unknown reward {unknown[0]!r}; known: {sorted(REWARDS)}")
        if self.weights is not None and len(self.weights) != len(self.funcs):
            raise ValueError(
                f"weights: {len(self.weights)} weights for {len(self.funcs)} reward functions"
            )
        return self

    def resolved_weights(self) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(self.funcs)


class EvalConfig(_Section):
    benchmarks: list[str] = Field(default_factory=lambda: ["synthetic"])
    """gsm8k, math500, aime24, aime25, amc23, synthetic, or a source ingested with split
    test/eval; always the evaluation split (grpo_core/data/benchmarks.py)."""
    limit: int | None = Field(default=None, ge=1)
    """Evaluate at most this many problems per benchmark (the first N, fixed)."""
    samples: int = Field(default=4, ge=1)
    """k for avg@k, maj@k, pass@k."""
    temperature: float = Field(default=0.6, ge=0)
    """R1 convention for sampled eval."""
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_new_tokens: int = Field(default=64, ge=1)
    greedy: bool = True
    """Also report greedy accuracy."""
    bootstrap: int = Field(default=1000, ge=10)
    """Bootstrap resamples for the 95% CIs."""
    primary_metric: str = "greedy_accuracy"
    """Metric that decides champion promotion and the comparison: greedy_accuracy,
    avg@<samples>, maj@k or pass@k, scored with strict extraction (the template's own
    answer format); prefix `flexible/` to score with the standard evaluators' chain."""
    shards: int = Field(default=1, ge=1)
    """Score each benchmark's problems in this many worker processes (the sharded-eval
    flow, flows/shards.py; where they run: filter.shard_runner); 1 = in-process. The
    per-problem rows and the metrics do not change."""

    @model_validator(mode="after")
    def _known_metric(self) -> EvalConfig:
        k = self.samples
        extraction, _, m = self.primary_metric.rpartition("/")
        if extraction == "strict":  # the default extraction: one spelling of each metric
            self.__dict__["primary_metric"] = m
        ok = extraction in ("", "strict", "flexible") and (m == "greedy_accuracy" or m == f"avg@{k}" or (
            m.split("@")[0] in ("maj", "pass") and m.split("@")[-1].isdigit() and 1 <= int(m.split("@")[1]) <= k))
        if not ok:
            raise ValueError(f"primary_metric: {self.primary_metric!r} is not reported with "
                             f"samples={k} (use greedy_accuracy, avg@{k}, maj@j or pass@j with "
                             f"j <= {k}, optionally prefixed flexible/)")
        return self


class TrainConfig(_Section):
    """How the SFT and GRPO stages run: in the pipeline's process, or through
    `accelerate launch` when more than one process is asked for."""

    num_processes: int = Field(default=1, ge=1)
    """Processes in all (GPUs, or CPU processes on gloo). >1: the stage is launched with
    `accelerate launch`; grpo.prompts_per_step x G is split across them."""
    num_machines: int = Field(default=1, ge=1)
    accelerate_config: str | None = None
    """An accelerate config file (infra/accelerate/*.yaml: DDP, ZeRO-2/3, FSDP); its
    relative path is read from the repository root. None: accelerate's defaults."""
    main_process_port: int | None = Field(default=None, ge=1, le=65535)
    """Rendezvous port; None picks a free one (single machine)."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """How SFT and GRPO train. The policy always loads in float32 (fp32 master weights,
    whatever dtype the checkpoint is stored in); bf16/fp16 add autocast on GPU (TRL's
    bf16/fp16 flags). auto: bf16 on a GPU that supports it, else fp16 on GPU, fp32 on CPU.
    Trained models are saved in the input checkpoint's stored dtype; model.dtype is the
    sampling dtype (filter, eval)."""


class TrackingConfig(_Section):
    tracking_uri: str | None = None
    """MLflow tracking URI; default $MLFLOW_TRACKING_URI or SQLite under the workdir."""
    experiment: str | None = None
    """MLflow experiment; default project.name."""
    register_model: bool = True
    flush_timeout_s: float = Field(default=120.0, ge=0)
    """At the end of a training stage, wait this long for an unreachable tracking server
    before keeping the unsent metric points in <workdir>/runs/unsent/ (sent next run)."""


class PipelineConfig(_Section):
    project: ProjectConfig = Field(default_factory=ProjectConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def hash(self) -> str:
        """Content hash of the resolved config (cache keys, MLflow tags)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(dotted, f"{part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", c), with c parsed as YAML (numbers, lists, booleans)."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(text, "empty key in override")
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    return key, value


def _first_error(err: ValidationError) -> ConfigError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown field"
    msg = msg.removeprefix("Value error, ")
    return ConfigError(loc, msg)


def config_from_dict(tree: dict, overrides: list[str] | None = None) -> PipelineConfig:
    tree = json.loads(json.dumps(tree or {}))  # deep copy, plain types
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
    try:
        cfg = PipelineConfig.model_validate(tree)
    except ValidationError as err:
        raise _first_error(err) from None
    _cross_section_checks(cfg)
    return cfg


def grpo_micro_batching(cfg: PipelineConfig) -> tuple[int, int]:
    """(completions per forward/backward per process, forward/backward passes per optimizer
    step): TRL's per_device_train_batch_size and gradient_accumulation_steps (the arithmetic
    is in GRPOConfig.prompts_per_step's docstring). Assumes _cross_section_checks passed."""
    g, n = cfg.grpo, cfg.train.num_processes
    completions = g.prompts_per_step * g.gradient_accumulation_steps * g.num_generations
    micro = g.per_device_micro_batch or g.prompts_per_step * g.num_generations // n
    return micro, completions // (n * micro)


def _cross_section_checks(cfg: PipelineConfig) -> None:
    """Rules that span two sections, named by the field a user would change."""
    n, g = cfg.train.num_processes, cfg.grpo
    batch = g.prompts_per_step * g.num_generations
    if g.per_device_micro_batch is None and batch % n:
        raise ConfigError("train.num_processes",
                          f"{n} processes cannot share a GRPO batch of grpo.prompts_per_step x "
                          f"grpo.num_generations = {batch} completions evenly")
    if g.per_device_micro_batch is not None:
        per_step = batch * g.gradient_accumulation_steps
        if per_step % (n * g.per_device_micro_batch):
            raise ConfigError(
                "grpo.per_device_micro_batch",
                f"{g.per_device_micro_batch} does not divide one optimizer step's completions "
                f"per process: grpo.prompts_per_step x grpo.gradient_accumulation_steps x "
                f"grpo.num_generations / train.num_processes = {g.prompts_per_step} x "
                f"{g.gradient_accumulation_steps} x {g.num_generations} / {n} = "
                f"{per_step / n:g}")
    if cfg.sft.enabled and cfg.sft.batch_size % n:
        raise ConfigError("train.num_processes",
                          f"{n} processes cannot share sft.batch_size={cfg.sft.batch_size} evenly")
    if cfg.grpo.trl:
        _check_trl_passthrough("grpo", cfg.grpo.trl, GRPOConfig.TRL_OWNED)
    if cfg.sft.trl:
        _check_trl_passthrough("sft", cfg.sft.trl, SFTConfig.TRL_OWNED)


def _check_trl_passthrough(section: str, given: dict, owned: dict[str, str]) -> None:
    """`<section>.trl` keys must be fields of the installed TRL config class and not one
    the pipeline sets. Imports trl (seconds), so only for a non-empty dict."""
    import dataclasses

    import trl

    cls = trl.GRPOConfig if section == "grpo" else trl.SFTConfig
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in given:
        where = f"{section}.trl.{key}"
        if key in owned:
            src = owned[key]
            raise ConfigError(where, f"set by the pipeline from {src}; set {src} instead"
                              if " " not in src else f"set by the pipeline ({src})")
        if key not in known:
            raise ConfigError(where, f"not a field of TRL {trl.__version__}'s {cls.__name__}")


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_tree(p: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A YAML mapping, with `extends: other.yaml` (relative to this file) merged underneath."""
    if not p.is_file():
        raise ConfigError("config", f"file not found: {p}")
    if p.resolve() in chain:
        raise ConfigError("extends", f"cycle through {p}")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"cannot read {p}: {exc}") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise ConfigError("config", f"{p} is not valid YAML: {first}") from None
    if not isinstance(tree, dict):
        raise ConfigError("config", f"{p} must hold a mapping at the top level")
    parent = tree.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError("extends", "must be a path to another YAML file")
        base = _read_tree((p.parent / parent), chain + (p.resolve(),))
        tree = _deep_merge(base, tree)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read, override and validate a config. No side effects; raises ConfigError."""
    tree = _read_tree(Path(path)) if path is not None else {}
    return config_from_dict(tree, overrides)
