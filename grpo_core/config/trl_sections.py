"""The `grpo:` and `sft:` sections: TRL's own GRPOConfig / SFTConfig fields, by TRL's names.

Declared below are only the pipeline's defaults where they differ from TRL's (the papers'
choices; docs/configs.md's table says why) and the fields the pipeline reads itself. Any other
field of the installed TRL class may be set too; `check_trl_keys` holds each key against
`dataclasses.fields` of that class at load time (an unknown key is a ConfigError naming
it). What the pipeline sets itself (`PIPELINE_SET`) is refused, and the keys of the old
schema (`MOVED`) get a one-line error naming their new place.
"""
from __future__ import annotations

import functools
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from grpo_core.config.base import ConfigError, Section


class TRLSection(Section):
    """A section whose keys are fields of a TRL config class (`TRL_CLASS`)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    TRL_CLASS: ClassVar[str]

    def trl_kwargs(self) -> dict:
        """The section as TRL keyword arguments (activation_checkpointing left to the
        pipeline's per-model rule: grpo_core/train/trl_args.py)."""
        return self.model_dump(exclude={"activation_checkpointing"})


# TRL arguments the pipeline sets itself in every stage, and from what.
_SET_BY_PIPELINE = {
    "output_dir": "the stage's checkpoint folder",
    "seed": "project.seed",
    "data_seed": "project.seed",
    "report_to": "tracking (MLflow)",
    "bf16": "train.precision",
    "fp16": "train.precision",
    "use_cpu": "train.precision (the device)",
    "model_init_kwargs": "model (the pipeline loads the policy)",
}


class GRPOSection(TRLSection):
    """TRL's GRPOConfig. One optimizer step generates TRL's generation batch,
    per_device_train_batch_size x train.num_processes x steps_per_generation completions
    (steps_per_generation defaults to gradient_accumulation_steps), that is that number
    / num_generations prompts; a round whose pool holds fewer is refused.

    A field noted "TRL x" overrides TRL's default x; the others keep TRL's default and are
    declared because the pipeline reads them (batch arithmetic, memory plan, vLLM server)."""

    TRL_CLASS: ClassVar[str] = "GRPOConfig"

    per_device_train_batch_size: int = Field(default=32, ge=1)
    """TRL 8. Completions per device per forward/backward pass (what bounds activation
    memory); 32 = 4 prompts x 8 completions on one device."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    steps_per_generation: int | None = Field(default=None, ge=1)
    generation_batch_size: int | None = Field(default=None, ge=1)
    num_generations: int = Field(default=8, ge=1)
    """G: completions per prompt (a group); 1 only under algorithm.name ppo (a critic)."""
    beta: float = Field(default=0.04, ge=0)
    """TRL 0.0. KL coefficient to the frozen reference, in the loss (the paper's 0.04);
    under a rounds.kl_schedule the schedule sets it."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "grpo"
    """TRL dapo. The paper's per-sequence mean."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    learning_rate: float = Field(default=1e-6, gt=0)
    max_completion_length: int = Field(default=64, ge=1)
    """TRL 512. Sized for the built-in and small models; the model presets raise it."""
    max_steps: int = Field(default=20, ge=1)
    """TRL -1 (epochs). Optimizer steps per round."""
    activation_checkpointing: bool | None = None
    """TRL on (gradient_checkpointing). None: on for real models, off for builtin:* ones."""
    save_steps: int = Field(default=10, ge=1)
    """TRL 500. Checkpoint every N steps (a killed round resumes from the last one)."""
    save_total_limit: int | None = Field(default=2, ge=1)
    """TRL None. Round checkpoints hold optimizer state (~12 bytes per parameter)."""
    logging_steps: int = Field(default=1, ge=1)
    """TRL 10. Every step's metrics feed the diagnosis rules."""
    disable_tqdm: bool = True
    """The pipeline reports progress itself."""
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_gpu_memory_utilization: float = Field(default=0.3, gt=0, le=1)
    vllm_server_host: str = "127.0.0.1"
    """TRL 0.0.0.0. The server train.vllm_server_launch starts listens locally."""
    vllm_server_port: int = Field(default=8000, ge=1, le=65535)
    vllm_server_timeout: float = Field(default=600.0, gt=0)
    """TRL 240. A large model's server takes longer to load."""


class SFTSection(TRLSection):
    """TRL's SFTConfig, for the SFT cold start (sft_stage.enabled)."""

    TRL_CLASS: ClassVar[str] = "SFTConfig"

    per_device_train_batch_size: int = Field(default=16, ge=1)
    """TRL 8."""
    max_steps: int = Field(default=200, ge=1)
    """TRL -1 (epochs)."""
    learning_rate: float = Field(default=1e-3, gt=0)
    """TRL 2e-5: a cold start of the small models needs more."""
    max_length: int = Field(default=256, ge=16)
    """TRL 1024. Prompt + trace tokens."""
    lr_scheduler_type: str = "cosine"
    """TRL linear."""
    warmup_steps: float = Field(default=0.05, ge=0)
    """TRL 0. Below 1: a fraction of max_steps."""
    logging_steps: float = Field(default=0.02, gt=0)
    """TRL 10. Below 1: a fraction of max_steps."""
    activation_checkpointing: bool | None = None
    """TRL on (gradient_checkpointing). None: on for real models, off for builtin:* ones."""
    disable_tqdm: bool = True


# TRL arguments the pipeline sets itself, per section, and from what: refused in the section.
PIPELINE_SET: dict[str, dict[str, str]] = {
    "grpo": {
        **_SET_BY_PIPELINE,
        "remove_unused_columns": "the reward functions (they read the answer column)",
        "reward_weights": "rewards.weights",
    },
    "sft": {
        **_SET_BY_PIPELINE,
        "completion_only_loss": "the SFT data (loss on the trace only)",
        "save_strategy": "the SFT stage (saves only the final model)",
    },
}

# Keys of the old schema -> their new place (a one-line error, not a silent default).
MOVED: dict[str, dict[str, str]] = {
    "grpo": {
        "rounds": "rounds.count",
        "kl_schedule": "rounds.kl_schedule",
        "skip_update_below": "rounds.skip_update_below",
        "kl_ceiling": "rounds.kl_ceiling",
        "algorithm": "algorithm.name",
        **{k: f"algorithm.{k}" for k in ("gae_gamma", "gae_lambda", "value_clip", "value_loss_coef",
                                          "value_learning_rate", "vhead_weight", "vhead_learning_rate")},
        "dynamic_sampling": "dynamic_sampling",
        "eval_every": "in_round_eval.every",
        "eval_problems": "in_round_eval.problems",
        "eval_patience": "in_round_eval.patience",
        "diagnosis": "diagnosis",
        "collapse_threshold": "diagnosis.collapse_threshold",
        "collapse_patience": "diagnosis.collapse_patience",
        "vllm_server_launch": "train.vllm_server_launch",
        "vllm_server_gpus": "train.vllm_server_gpus",
        "prompts_per_step": "grpo.per_device_train_batch_size (completions per device and "
                            "pass: prompts x num_generations / train.num_processes)",
        "per_device_micro_batch": "grpo.per_device_train_batch_size",
        "gradient_checkpointing": "grpo.activation_checkpointing",
        "trl": "grpo (TRL's fields are the section's own keys)",
    },
    "sft": {
        "enabled": "sft_stage.enabled",
        "max_examples": "sft_stage.max_examples",
        "batch_size": "sft.per_device_train_batch_size (per device)",
        "gradient_checkpointing": "sft.activation_checkpointing",
        "trl": "sft (TRL's fields are the section's own keys)",
    },
}


@functools.cache
def trl_fields(class_name: str) -> frozenset[str]:
    """Init fields of the installed TRL config class (imports trl: seconds, once)."""
    import dataclasses

    import trl

    return frozenset(f.name for f in dataclasses.fields(getattr(trl, class_name)) if f.init)


def check_trl_keys(section: type[TRLSection], name: str, given: dict, trl_class: str | None = None) -> None:
    """Refuse a key of the `name:` section (raw YAML) that moved, that the pipeline sets,
    or that is no field of `trl_class` (default: the section's TRL class). trl is
    imported only when a key is not declared by the section."""
    trl_class = trl_class or section.TRL_CLASS
    for key in given:
        where = f"{name}.{key}"
        if key in MOVED[name]:
            raise ConfigError(where, f"moved to {MOVED[name][key]}")
        if key in PIPELINE_SET[name]:
            raise ConfigError(where, f"set by the pipeline from {PIPELINE_SET[name][key]}")
        if key not in section.model_fields and key not in trl_fields(trl_class):
            import trl

            raise ConfigError(where, f"not a field of TRL {trl.__version__}'s {trl_class}")
