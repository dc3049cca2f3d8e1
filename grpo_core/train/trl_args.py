"""TRL's training arguments built from the pipeline's config: GRPO's (GRPOConfig) and
SFT's (SFTConfig), the precision flags, and the KL schedule's beta. The `grpo:` / `sft:`
sections are TRL's fields already (with the pipeline's defaults on TRL's); this module adds
only what the pipeline sets itself."""
from __future__ import annotations

import math

from grpo_core.config import PipelineConfig
from grpo_core.modeling.loading import resolve_precision
from grpo_core.modeling.memory_plan import gradient_checkpointing


def precision_flags(cfg: PipelineConfig) -> dict:
    """TRL/accelerate mixed-precision flags for train.precision (resolved by
    modeling.loading.resolve_precision). The policy itself is always loaded in float32
    (load_for_training): these only add autocast."""
    import torch

    mode = resolve_precision(cfg.train.precision)
    return {"bf16": mode == "bf16", "fp16": mode == "fp16", "use_cpu": not torch.cuda.is_available()}


def checkpointing_field(args_cls=None) -> str:
    """TrainingArguments' name for activation checkpointing in the installed transformers:
    `activation_checkpointing` where it exists (there `gradient_checkpointing` is its
    deprecated alias and warns), `gradient_checkpointing` before (5.17 has only that)."""
    import dataclasses

    if args_cls is None:
        from transformers import TrainingArguments as args_cls

    names = {f.name for f in dataclasses.fields(args_cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def grpo_kwargs(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None,
                round_no: int = 1) -> dict:
    """GRPOConfig's keyword arguments: the `grpo:` section (TRL's fields, the pipeline's
    defaults under the user's values), plus what the pipeline sets itself
    (config.trl_sections.PIPELINE_SET, refused in `grpo:`) and beta at the round's first step."""
    g = cfg.grpo
    return {
        **g.trl_kwargs(),
        "beta": kl_beta(0, g.max_steps, cfg, round_no),
        # TRL's default (on) would be on for every model: ours is per model, under the
        # installed transformers' name for it
        checkpointing_field(): gradient_checkpointing(cfg, g.activation_checkpointing),
        **pipeline_set(cfg, output_dir, report_to),
        "remove_unused_columns": False,
    }


def pipeline_set(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None) -> dict:
    """What the pipeline sets in every stage's TRL arguments (config.trl_sections.PIPELINE_SET):
    the stage's folder, the project's seed, the precision flags, the trackers."""
    return {
        "output_dir": output_dir,
        # TRL seeds its sampler and the policy's generate from `seed`. TRL 1.16 has no field
        # for the vLLM engine's seed, and a `seed` in generation_kwargs would seed every
        # request alike (colocate samples each prompt's G copies with n=1: the whole group
        # would be one completion). The colocated engine gets project.seed through
        # grpo_core/train/vllm_engine.py; a `trl vllm-serve` server takes no seed (vLLM's
        # default: docs/gpus.md, "Seeds").
        "seed": cfg.project.seed,
        "data_seed": cfg.project.seed,
        **precision_flags(cfg),
        "report_to": report_to or [],
    }


def trl_grpo_args(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None,
                  round_no: int = 1):
    """TRL's GRPOConfig for a round (grpo_kwargs)."""
    from trl import GRPOConfig

    return GRPOConfig(**grpo_kwargs(cfg, output_dir, report_to, round_no))


def kl_beta(step: int, total: int, cfg: PipelineConfig, round_no: int = 1) -> float:
    """beta at a round's step under the configured schedule (the seeds' 0.1 -> 0.01 decay).
    kl_schedule.per "run": one schedule over every round's steps, round `round_no` (from 1)
    starting where round_no - 1 ended; "round": each round runs it from the start."""
    sched = cfg.rounds.kl_schedule
    if sched.kind == "constant":
        return cfg.grpo.beta
    if sched.per == "run":
        step, total = step + (round_no - 1) * total, total * cfg.rounds.count
    frac = min(max(step / max(total, 1), 0.0), 1.0)
    if sched.kind == "linear":
        return sched.beta_start + (sched.beta_end - sched.beta_start) * frac
    return sched.beta_end + 0.5 * (sched.beta_start - sched.beta_end) * (1 + math.cos(math.pi * frac))


def trl_sft_args(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None):
    """SFTTrainer's config: the `sft:` section (TRL's fields, the pipeline's defaults under
    the user's values) plus what the pipeline sets itself (config.trl_sections.PIPELINE_SET)."""
    from trl import SFTConfig

    return SFTConfig(
        **cfg.sft.trl_kwargs(),
        **{checkpointing_field(): gradient_checkpointing(cfg, cfg.sft.activation_checkpointing)},
        **pipeline_set(cfg, output_dir, report_to),
        completion_only_loss=True,
        save_strategy="no",
    )
