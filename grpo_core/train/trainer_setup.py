"""A pipeline trainer's settings that need no private member, applied once when a round
builds its trainer: stop strings on `model.generate` (`stop_at_text`), no log printing
(`quiet_trainer`), a single-completion GRPOConfig (`one_completion_per_prompt`).
What reaches into a trainer's internals is grpo_core/train/trainer.py's (the overrides) and
grpo_core/train/trainer_internals.py's (the functions)."""
from __future__ import annotations


def stop_at_text(model, tokenizer, stops: tuple[str, ...]) -> None:
    """Make `model.generate` (what TRL calls, unwrapped, for transformers rollouts) end each
    row once its generated text holds a stop string: the criterion the hf rollout backend
    uses for filter and eval, so training samples stop where they do."""
    if not stops:
        return
    from transformers import StoppingCriteriaList

    from grpo_core.generation.rollout import text_stop_criterion

    generate = model.generate

    def generate_stopping_at_text(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            crit = text_stop_criterion(tokenizer, stops, ids.shape[1])
            kwargs["stopping_criteria"] = StoppingCriteriaList(
                [*(kwargs.get("stopping_criteria") or []), crit])
        return generate(*args, **kwargs)

    model.generate = generate_stopping_at_text


def quiet_trainer(trainer) -> None:
    """With disable_tqdm, transformers prints every log dict to stdout (PrinterCallback):
    the metrics go to MLflow and the history instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def one_completion_per_prompt(args):
    """`args` (a GRPOConfig validated with a group) run with one completion per prompt:
    GRPOConfig checks num_generations >= 2 in __post_init__ only."""
    args.num_generations = 1
    return args
