"""SFT cold start: TRL SFTTrainer on reference solutions written as reasoning traces,
`<think>steps</think><answer>final</answer>` (the R1 recipe's cold-start data)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.config import PipelineConfig
from grpo_core.data.problems import Problem
from grpo_core.modeling.loading import load_for_training
from grpo_core.prompts import render_prompt, resolve_template
from grpo_core.train import lora
from grpo_core.train.trl_args import trl_sft_args

_CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<48/2=24>>" annotations
_FINAL_SENTENCE = re.compile(r"\s*The answer is [^.]*\.\s*$")  # synthetic solutions


def reasoning_steps(p: Problem) -> str:
    """The solution text without its final-answer marker, ready to go inside <think>."""
    text = p.solution or ""
    if p.source.startswith("gsm8k"):
        text = _CALCULATOR_NOTE.sub("", text.rsplit("####", 1)[0])
    elif p.source.startswith("synthetic"):
        text = _FINAL_SENTENCE.sub("", text)
    return " ".join(text.split())


def sft_completion(p: Problem, prompt_ends_with_think: bool) -> str:
    """The target trace; when the prompt already opened <think>, the trace continues it."""
    body = f"{reasoning_steps(p)}</think><answer>{p.answer}</answer>"
    return body if prompt_ends_with_think else f"<think>{body}"


def has_trace(p: Problem) -> bool:
    """A problem SFT can train on: a reference solution to write as a trace (synthetic
    problems compose theirs from the answer)."""
    return bool(p.solution) or p.source.startswith("synthetic")


def examples_per_step(cfg: PipelineConfig) -> int:
    """Traces one optimizer step trains on (without packing)."""
    extra = cfg.sft.model_extra or {}
    return (cfg.sft.per_device_train_batch_size * cfg.train.num_processes
            * int(extra.get("gradient_accumulation_steps") or 1))


def sft_problem_budget(cfg: PipelineConfig) -> int | None:
    """The most traces the SFT stage can use: sft_stage.max_examples, and at most what its
    steps draw (sft.max_steps x examples per step) unless packing makes a step's count
    depend on lengths. A stage handed a whole pool reads this many of it (None: all)."""
    extra = cfg.sft.model_extra or {}
    budget = cfg.sft_stage.max_examples
    if not extra.get("packing"):
        per_step = examples_per_step(cfg)
        budget = min(budget or per_step * cfg.sft.max_steps, per_step * cfg.sft.max_steps)
    return budget


@dataclass
class SFTResult:
    output_dir: str
    steps: int
    history: list[dict] = field(default_factory=list)
    total_flos: float = 0.0  # the trainer's estimate (6 x parameters x tokens)


def sft_dataset(problems: list[Problem], template: str, tokenizer):
    from datasets import Dataset

    rows = []
    for p in problems:
        prompt = render_prompt(p.problem, template, tokenizer)
        rows.append({"prompt": prompt, "completion": sft_completion(p, prompt.rstrip().endswith("<think>"))})
    return Dataset.from_list(rows)


def run_sft(
    model_path: str,
    problems: list[Problem],
    cfg: PipelineConfig,
    output_dir: str | Path,
    template: str,
    report_to: list[str] | None = None,
    extra_callbacks: list | None = None,
) -> SFTResult:
    """Fine-tune on traces (loss on the completion only); the model lands in output_dir/final.
    `template`: model.template ("auto" is resolved here, with the tokenizer loaded here)."""
    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.modeling.threads import configure_threads
    from grpo_core.train.callbacks import LossHistory
    from grpo_core.train.trainer import PipelineSFTTrainer
    from grpo_core.train.trainer_internals import configured_logprob_tile
    from grpo_core.train.trainer_setup import quiet_trainer

    configure_threads()
    usable = [p for p in problems if has_trace(p)]
    if cfg.sft_stage.max_examples:
        usable = usable[: cfg.sft_stage.max_examples]
    if not usable:
        raise ValueError("SFT needs problems with reference solutions; none were found")
    out = Path(output_dir)
    tokenizer = load_tokenizer(model_path, padding_side=None)  # the tokenizer's own side
    template = resolve_template(template, tokenizer)  # "auto": by this tokenizer
    model, save_dtype = load_for_training(model_path)  # fp32 master weights
    args = trl_sft_args(cfg, str(out), report_to)
    result = SFTResult(output_dir=str(out / "final"), steps=0)
    trainer = PipelineSFTTrainer(
        model=model,
        args=args,
        train_dataset=sft_dataset(usable, template, tokenizer),
        processing_class=tokenizer,
        callbacks=[LossHistory(result.history), *(extra_callbacks or [])],
        **lora.trainer_kwargs(cfg),  # model.peft: LoRA adapters, saved merged (lora.py)
    )
    quiet_trainer(trainer)
    # TRL's fused log-prob head at the configured tile, as the GRPO rounds (not whatever an
    # earlier stage of this process left set: the float sums, so the weights, depend on it)
    with configured_logprob_tile(cfg):
        trainer.train()
    result.steps = trainer.state.global_step
    result.total_flos = float(trainer.state.total_flos or 0.0)
    trainer.save_dtype = save_dtype  # the input checkpoint's stored dtype
    trainer.save_model(result.output_dir)  # rank 0 only, under accelerate launch
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(result.output_dir)
    return result
