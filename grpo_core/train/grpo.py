"""One GRPO round with TRL's GRPOTrainer, plus what TRL lacks: a KL schedule, a collapse
monitor, a divergence guard, optional skipped updates, and a record of every completion
with its per-function rewards and advantage. Reads top to bottom in run_grpo_round; the
trainer and its hooks are grpo_core.train.trainer's, the callbacks grpo_core.train.callbacks',
the training path of algorithm.name grpo_core.train.algorithms'."""
from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.config import PipelineConfig, generation_batch
from grpo_core.data.problems import Problem
from grpo_core.data.stage_split import prompts_per_update
from grpo_core.findings import Finding
from grpo_core.modeling.loading import load_for_training
from grpo_core.prompts import render_prompt, resolve_template, stop_strings
from grpo_core.train import lora
from grpo_core.train.batch_patterns import repeated_patterns, share_metrics
from grpo_core.train.in_round_eval import (
    BEST_DIR,
    BestTracker,
    InRoundEvaluator,
    load_tracker,
    split_held_out,
)
from grpo_core.verify.rewards import build_reward_funcs

RolloutSink = Callable[[int, list[dict]], None]  # (global step, one dict per completion)


@dataclass
class RoundResult:
    output_dir: str  # the trained model (tokenizer included)
    steps: int
    history: list[dict] = field(default_factory=list)  # TRL's logged metrics per step
    findings: list[Finding] = field(default_factory=list)  # what fired in the round (collapse, NaN, KL)
    stopped_early: bool = False
    train_seconds: float = 0.0  # TRL's train_runtime: the training loop alone
    nonfinite_rewards: list = field(default_factory=list)  # (reward name, value) seen
    best_step: int | None = None  # in_round_eval.every: the step whose model output_dir holds
    in_round_evals: list = field(default_factory=list)  # (step, held-out greedy accuracy)
    in_round_protocol: str | None = None  # the protocol hash of those numbers

    def __post_init__(self):  # read back from a launched stage's JSON (grpo_core.train.saved)
        self.findings = [Finding.of(f) for f in self.findings]


def check_round_size(n_problems: int, cfg: PipelineConfig) -> None:
    """Refuse a round that cannot fill one optimizer step: it would train 0 steps."""
    need = prompts_per_update(cfg)
    if n_problems < need:
        raise ValueError(
            f"GRPO round has {n_problems} problems; one generation batch needs {need} (grpo."
            f"per_device_train_batch_size x train.num_processes x grpo.steps_per_generation / "
            f"grpo.num_generations = {generation_batch(cfg)} / {cfg.grpo.num_generations}; TRL drops "
            "an incomplete batch: nothing would train). Add problems, widen filter.band, or "
            "lower grpo.per_device_train_batch_size")


def trl_stop_kwargs(stops: tuple[str, ...], use_vllm: bool) -> dict:
    """generation_kwargs that stop TRL's vLLM rollouts at the template's closing tag (vLLM
    matches text, however many tokens the tag is, and keeps it). The transformers path
    cannot take a stopping criterion through GenerationConfig: trainer_setup.stop_at_text
    puts it on the policy's generate instead. Either way the trainer cuts the ids
    (grpo_core.train.trainer)."""
    return {"stop": list(stops), "include_stop_str_in_output": True} if stops and use_vllm else {}


def _watch_finite(funcs: list, seen: list) -> list:
    """TRL sums rewards with nansum (a reward's None, "not scored", arrives as NaN), so a
    reward function returning NaN would vanish from the logged reward; note any non-finite
    value here, and the Monitor stops the round at the end of that step."""
    def wrap(fn):
        def watched(completions, **kw):
            out = fn(completions, **kw)
            bad = next((v for v in out if v is not None and not math.isfinite(v)), None)
            if bad is not None:
                seen.append((fn.__name__, bad))
            return out
        watched.__name__ = fn.__name__  # TRL logs rewards/<__name__>
        return watched
    return [wrap(f) for f in funcs]


def _watch_patterns(trainer, sink: RolloutSink | None, cfg: PipelineConfig,
                    result: RoundResult) -> RolloutSink:
    """Each batch's repeated-pattern shares into the step's metrics (the diagnosis rule's
    evidence, grpo_core/train/batch_patterns.py), then the rows on to `sink`. The first
    pattern over diagnosis.repeated_pattern_share is named in the round's findings: the
    metric holds a share, the finding says what repeats."""
    from grpo_core.train.trainer_internals import log_metric

    d = cfg.diagnosis
    named: set[str] = set()

    def watched(step: int, rows: list[dict]) -> None:
        found = repeated_patterns(rows, d.repeated_pattern_min_prompts)
        for name, value in share_metrics(found).items():
            log_metric(trainer, name, value)
        for kind, p in (found or {}).items():
            if p.share > d.repeated_pattern_share and kind not in named:
                named.add(kind)
                result.findings.append(Finding.note(
                    "repeated_output", f"repeated {kind} {p.pattern[:80]!r} under {p.share:.0%} "
                    f"of the {p.prompts} prompts of step {step}'s batch", "info", steps=[step],
                    kind=kind, share=p.share, prompts=p.prompts))
        if sink is not None:
            sink(step, rows)

    if hasattr(sink, "flush"):  # a buffering sink (records.RolloutBuffer): FlushRollouts calls it
        watched.flush = sink.flush
    return watched


def grpo_dataset(problems: list[Problem], template: str, tokenizer):
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": render_prompt(p.problem, template, tokenizer), "answer": p.answer, "problem_id": p.id}
        for p in problems
    ])


def checkpoint_step(checkpoint: str | Path | None) -> int:
    """The optimizer step a checkpoint folder (`.../checkpoint-40`) was saved at; 0 for
    None (no checkpoint: a round starts from step 0)."""
    return int(Path(checkpoint).name.rsplit("-", 1)[1]) if checkpoint else 0


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest *complete* checkpoint: a process killed while saving leaves a folder
    without trainer_state.json (written last), which must not be resumed from."""
    ckpts = sorted((p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=checkpoint_step)
    return str(ckpts[-1]) if ckpts else None


def run_grpo_round(
    model_path: str,
    problems: list[Problem],
    cfg: PipelineConfig,
    output_dir: str | Path,
    template: str,
    rollout_sink: RolloutSink | None = None,
    resume: bool = False,
    report_to: list[str] | None = None,
    extra_callbacks: list | None = None,
    round_no: int = 1,
    extra_rewards: list[tuple] | None = None,
    trainer_hook: Callable | None = None,
) -> RoundResult:
    """Train round `round_no` (from 1; the KL schedule may span rounds); the model lands in
    output_dir/final. With resume, continue from the last checkpoint in output_dir (a
    killed round picks up where it stopped). algorithm.name picks the training path
    (grpo_core.train.algorithms). extra_rewards: (TRL reward function or reward-model
    path, weight) pairs scored after cfg.rewards'; trainer_hook(trainer) runs once the
    trainer is built (benchmarks: memory accounting)."""

    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.modeling.threads import configure_threads
    from grpo_core.train.algorithms import ALGORITHMS
    from grpo_core.train.callbacks import attach_trainer, round_callbacks
    from grpo_core.train.dynamic_sampling import dynamic_sampler
    from grpo_core.train.trainer_internals import configured_logprob_tile
    from grpo_core.train.trainer_setup import quiet_trainer, stop_at_text
    from grpo_core.train.vllm_engine import release_engine, seeded_engines

    threads = configure_threads()
    held_out: list[Problem] = []
    if cfg.in_round_eval.every:  # the in-round eval's slice is never trained on
        problems, held_out = split_held_out(problems, cfg.in_round_eval.problems, cfg.project.seed)
    check_round_size(len(problems), cfg)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = last_checkpoint(out) if resume else None
    tokenizer = load_tokenizer(model_path)  # left padding, pad = eos when it has none
    template = resolve_template(template, tokenizer)  # "auto": by this tokenizer
    model, save_dtype = load_for_training(model_path)
    funcs, weights = build_reward_funcs(cfg.rewards, cfg.grpo.max_completion_length)
    extra_rewards = list(extra_rewards or [])
    algo = ALGORITHMS[cfg.algorithm.name]
    args = algo.trl_args(cfg, str(out), report_to, round_no)
    args.reward_weights = weights + [w for _, w in extra_rewards]
    stops = stop_strings(template)  # as filter and eval stop (sampling.build_backend)
    args.generation_kwargs = {**trl_stop_kwargs(stops, args.use_vllm), **(args.generation_kwargs or {})}
    if not args.use_vllm:
        stop_at_text(model, tokenizer, stops)
    result = RoundResult(output_dir=str(out / "final"), steps=0)
    funcs = _watch_finite(funcs, result.nonfinite_rewards)
    callbacks = round_callbacks(cfg, result, round_no) + list(extra_callbacks or [])
    tracker = _in_round_eval(cfg, held_out, template, out, ckpt, save_dtype, result, callbacks)
    # TRL's colocated vLLM engine, if it builds one
    with seeded_engines(cfg.project.seed, cfg.rollout.cpu_kv_cache_gib, threads):
        trainer = algo.trainer(
            model=model,
            reward_funcs=funcs + [f for f, _ in extra_rewards],
            args=args,
            train_dataset=grpo_dataset(problems, template, tokenizer),
            processing_class=tokenizer,
            callbacks=callbacks,
            **lora.trainer_kwargs(cfg),  # model.peft: TRL wraps the model in LoRA adapters
        )
    attach_trainer(callbacks, trainer)
    quiet_trainer(trainer)
    trainer.rollout_sink = _watch_patterns(trainer, rollout_sink, cfg, result)
    trainer.stop_strings = stops
    trainer.skip_update_below = cfg.rounds.skip_update_below
    trainer.dynamic_sampling = dynamic_sampler(cfg, trainer)  # None when off
    algo.prepare(trainer, cfg)  # its models and refusals, before any step
    if trainer_hook is not None:
        trainer_hook(trainer)
    try:
        with configured_logprob_tile(cfg):  # for train() alone
            train_out = trainer.train(resume_from_checkpoint=ckpt)
        result.train_seconds = float(train_out.metrics.get("train_runtime", 0.0))
        result.steps = trainer.state.global_step
        if result.steps == 0:  # check_round_size should make this impossible: never save it
            raise RuntimeError(f"GRPO round trained 0 steps on {len(problems)} problems; not saved")
        if trainer.skipped_updates:
            result.findings.append(Finding.note(
                "skipped_updates", f"skipped {trainer.skipped_updates} updates: every reward "
                f"below {cfg.rounds.skip_update_below}", "info",
                skipped=trainer.skipped_updates, below=cfg.rounds.skip_update_below))
        _hand_on(trainer, result, tracker, out, model_path, save_dtype, tokenizer)
    finally:  # the colocated engine would outlive the round in this process otherwise
        release_engine(trainer)
    return result


def _in_round_eval(cfg: PipelineConfig, held_out: list[Problem], template: str, out: Path,
                   ckpt: str | None, save_dtype, result: RoundResult,
                   callbacks: list) -> BestTracker | None:
    """in_round_eval.every: the round's tracker, its callback appended to `callbacks`."""
    from grpo_core.train.callbacks import InRoundEval

    g = cfg.in_round_eval
    if not g.every:
        return None
    # A resumed round keeps the scores and best model recorded before the kill.
    if ckpt is None:
        shutil.rmtree(out / BEST_DIR, ignore_errors=True)
    tracker = load_tracker(out, g.patience) if ckpt else BestTracker(g.patience)
    evaluator = InRoundEvaluator(held_out, template, cfg.eval.max_new_tokens, cfg)
    result.in_round_protocol = evaluator.protocol_hash
    callbacks.append(InRoundEval(evaluator, g.every, tracker, out, save_dtype,
                                 result.findings))
    return tracker


def _hand_on(trainer, result: RoundResult, tracker: BestTracker | None, out: Path,
             model_path: str, save_dtype, tokenizer) -> None:
    """The round's model: the best in-round evaluation's, the last good checkpoint after an
    early stop, or the trained weights saved in the input checkpoint's stored dtype."""
    best = out / BEST_DIR
    if tracker is not None:
        result.in_round_evals = list(tracker.scores)
        result.findings.append(Finding.note("in_round_choice", tracker.choice(result.steps),
                                            "info", best_step=tracker.best_step))
    if tracker is not None and tracker.best_step not in (None, result.steps) \
            and (best / "config.json").is_file():
        # An earlier evaluation was better than the last one (or the round stopped without
        # evaluating its last weights): hand that model on.
        result.output_dir, result.best_step = str(best), tracker.best_step
    elif result.stopped_early:
        # Keep the last good checkpoint as the round's model, not the diverged weights.
        good = last_checkpoint(out)
        if good and lora.is_lora(trainer.model):  # an adapter-only checkpoint: merge it
            if trainer.is_world_process_zero():
                lora.merge_checkpoint(trainer.model, good, result.output_dir, save_dtype)
                tokenizer.save_pretrained(result.output_dir)
            good = result.output_dir
        result.output_dir = good or model_path
    else:
        result.best_step = tracker.best_step if tracker is not None else None
        trainer.save_dtype = save_dtype  # the input checkpoint's stored dtype
        trainer.save_model(result.output_dir)  # rank 0 only, under accelerate launch
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(result.output_dir)
