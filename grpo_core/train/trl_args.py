"""TRL's training arguments built from the pipeline's config: GRPO's (GRPOConfig) and
SFT's (SFTConfig), the precision rule, and the KL schedule's beta. Every GRPO knob is set
explicitly: TRL's defaults differ from the paper's."""
from __future__ import annotations

import math

from grpo_core.config import PipelineConfig, grpo_micro_batching
from grpo_core.modeling.memory_plan import gradient_checkpointing


def precision_flags(cfg: PipelineConfig) -> dict:
    """TRL/accelerate mixed-precision flags for train.precision. The policy itself is
    always loaded in float32 (load_for_training): these only add autocast."""
    import torch

    on_gpu = torch.cuda.is_available()
    mode = cfg.train.precision
    if mode == "auto":
        mode = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    return {"bf16": mode == "bf16", "fp16": mode == "fp16", "use_cpu": not on_gpu}


def checkpointing_field(args_cls=None) -> str:
    """TrainingArguments' name for activation checkpointing in the installed transformers:
    `activation_checkpointing` where it exists (there `gradient_checkpointing` is its
    deprecated alias and warns), `gradient_checkpointing` before (5.17 has only that)."""
    import dataclasses

    if args_cls is None:
        from transformers import TrainingArguments as args_cls

    names = {f.name for f in dataclasses.fields(args_cls)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


# Pipeline defaults that grpo.trl may override (TRL's own defaults differ).
GRPO_TRL_DEFAULTS = {"top_k": 0, "disable_tqdm": True, "dataloader_num_workers": 0}


def trl_grpo_args(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None,
                  round_no: int = 1):
    """Every GRPO knob set explicitly from our config (TRL's defaults differ from the
    paper), over the pass-through grpo.trl, over GRPO_TRL_DEFAULTS."""
    from trl import GRPOConfig

    return GRPOConfig(**{**GRPO_TRL_DEFAULTS, **cfg.grpo.trl,
                         **owned_grpo_args(cfg, output_dir, report_to, round_no)})


def owned_grpo_args(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None,
                    round_no: int = 1) -> dict:
    """The TRL arguments the pipeline decides: config.GRPOConfig.TRL_OWNED lists them (plus
    the ones TRL derives from these), and grpo.trl refuses them."""
    g = cfg.grpo
    beta = kl_beta(0, g.max_steps, cfg, round_no)
    micro, passes = grpo_micro_batching(cfg)
    return dict(  # reads as TRL's keyword arguments
        output_dir=output_dir,
        num_generations=g.num_generations,
        # forward/backward passes of per_device_micro_batch completions; one generation
        # batch (TRL's default steps_per_generation = GA) per optimizer step
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=passes,
        beta=beta,
        epsilon=g.epsilon,
        epsilon_high=g.epsilon_high if g.epsilon_high is not None else g.epsilon,
        loss_type=g.loss_type,
        scale_rewards=g.scale_rewards,
        temperature=g.temperature,
        top_p=g.top_p,
        learning_rate=g.learning_rate,
        max_completion_length=g.max_completion_length,
        num_iterations=g.num_iterations,
        max_steps=g.max_steps,
        save_steps=g.save_steps,
        save_strategy="steps",
        save_total_limit=g.save_total_limit,
        logging_steps=g.logging_steps,
        seed=cfg.project.seed,
        data_seed=cfg.project.seed,
        **precision_flags(cfg),
        report_to=report_to or [],
        use_vllm=g.use_vllm,
        vllm_mode=g.vllm_mode,
        vllm_gpu_memory_utilization=g.vllm_gpu_memory_utilization,
        vllm_tensor_parallel_size=g.vllm_tensor_parallel_size,
        vllm_server_host=g.vllm_server_host,
        vllm_server_port=g.vllm_server_port,
        vllm_server_timeout=g.vllm_server_timeout,
        remove_unused_columns=False,
        mask_truncated_completions=g.mask_truncated_completions,
        # TRL's default (on) would be on for every model: ours is per model, under the
        # installed transformers' name for it
        **{checkpointing_field(): gradient_checkpointing(cfg, g.gradient_checkpointing)},
    )


def kl_beta(step: int, total: int, cfg: PipelineConfig, round_no: int = 1) -> float:
    """beta at a round's step under the configured schedule (the seeds' 0.1 -> 0.01 decay).
    kl_schedule.per "run": one schedule over every round's steps, round `round_no` (from 1)
    starting where round_no - 1 ended; "round": each round runs it from the start."""
    sched = cfg.grpo.kl_schedule
    if sched.kind == "constant":
        return cfg.grpo.beta
    if sched.per == "run":
        step, total = step + (round_no - 1) * total, total * cfg.grpo.rounds
    frac = min(max(step / max(total, 1), 0.0), 1.0)
    if sched.kind == "linear":
        return sched.beta_start + (sched.beta_end - sched.beta_start) * frac
    return sched.beta_end + 0.5 * (sched.beta_start - sched.beta_end) * (1 + math.cos(math.pi * frac))


def trl_sft_args(cfg: PipelineConfig, output_dir: str, report_to: list[str] | None = None):
    """SFTTrainer's config: the pipeline's defaults, under sft.trl, under what it decides."""
    from trl import SFTConfig

    # The pipeline's defaults, which sft.trl may override ...
    defaults = dict(  # noqa: C408 - reads as TRL's keyword arguments
        lr_scheduler_type="cosine",
        warmup_steps=max(1, cfg.sft.max_steps // 20),
        logging_steps=max(1, cfg.sft.max_steps // 50),
        disable_tqdm=True,
        **{checkpointing_field(): gradient_checkpointing(cfg)},
    )
    # ... and what it decides (config.SFTConfig.TRL_OWNED), which sft.trl may not.
    owned = dict(  # reads as TRL's keyword arguments
        output_dir=output_dir,
        max_steps=cfg.sft.max_steps,
        learning_rate=cfg.sft.learning_rate,
        per_device_train_batch_size=cfg.sft.batch_size // cfg.train.num_processes,
        max_length=cfg.sft.max_length,
        completion_only_loss=True,
        save_strategy="no",
        seed=cfg.project.seed,
        **precision_flags(cfg),
        report_to=report_to or [],
    )
    return SFTConfig(**{**defaults, **cfg.sft.trl, **owned})
