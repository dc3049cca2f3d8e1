"""One GRPO round with TRL's GRPOTrainer, plus what TRL lacks: a KL schedule, a collapse
monitor, a divergence guard, optional skipped updates, and a record of every completion
with its per-function rewards and advantage."""
from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.config import PipelineConfig
from grpo_core.data.problems import Problem
from grpo_core.modeling.loading import load_for_training
from grpo_core.prompts import render_prompt, stop_strings
from grpo_core.train import lora
from grpo_core.train.diagnosis import RoundMonitor, is_step_log
from grpo_core.train.in_round_eval import (
    BEST_DIR,
    BestTracker,
    InRoundEvaluator,
    in_round_eval_callback,
    load_tracker,
    split_held_out,
)
from grpo_core.train.trl_args import kl_beta, trl_grpo_args
from grpo_core.verify.rewards import build_reward_funcs

RolloutSink = Callable[[int, list[dict]], None]  # (global step, one dict per completion)


@dataclass
class RoundResult:
    output_dir: str  # the trained model (tokenizer included)
    steps: int
    history: list[dict] = field(default_factory=list)  # TRL's logged metrics per step
    findings: list[str] = field(default_factory=list)  # rules that fired (collapse, NaN, KL)
    stopped_early: bool = False
    train_seconds: float = 0.0  # TRL's train_runtime: the training loop alone
    nonfinite_rewards: list = field(default_factory=list)  # (reward name, value) seen
    best_step: int | None = None  # grpo.eval_every: the step whose model output_dir holds
    in_round_evals: list = field(default_factory=list)  # (step, held-out greedy accuracy)
    in_round_protocol: str | None = None  # the protocol hash of those numbers


def prompts_per_update(cfg: PipelineConfig) -> int:
    """Prompts one optimizer step consumes. TRL generates for a whole optimizer step at
    once (its generation batch: per_device_train_batch_size x processes x accumulation
    completions = prompts_per_step x GA prompts) and drops an incomplete last batch."""
    return cfg.grpo.prompts_per_step * cfg.grpo.gradient_accumulation_steps


def check_round_size(n_problems: int, cfg: PipelineConfig) -> None:
    """Refuse a round that cannot fill one optimizer step: it would train 0 steps."""
    need = prompts_per_update(cfg)
    if n_problems < need:
        g = cfg.grpo
        raise ValueError(
            f"GRPO round has {n_problems} problems; one optimizer step needs grpo.prompts_per_step "
            f"x grpo.gradient_accumulation_steps = {g.prompts_per_step} x "
            f"{g.gradient_accumulation_steps} = {need} (TRL drops an incomplete batch: nothing "
            "would train). Add problems, widen filter.band, or lower those fields")


def trl_stop_kwargs(stops: tuple[str, ...], use_vllm: bool) -> dict:
    """generation_kwargs that stop TRL's vLLM rollouts at the template's closing tag (vLLM
    matches text, however many tokens the tag is, and keeps it). The transformers path
    cannot take a stopping criterion through GenerationConfig: stop_at_text puts it on
    the policy's generate instead. Either way _generate_single_turn cuts the ids."""
    return {"stop": list(stops), "include_stop_str_in_output": True} if stops and use_vllm else {}


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


def _callbacks(cfg: PipelineConfig, result: RoundResult, trainer_ref: list, round_no: int):
    from transformers import TrainerCallback

    g = cfg.grpo

    class KLSchedule(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if g.kl_schedule.kind != "constant" and trainer_ref:
                trainer_ref[0].beta = kl_beta(state.global_step, state.max_steps, cfg, round_no)

    class Monitor(TrainerCallback):
        """The in-round rules (grpo_core.train.diagnosis.RoundMonitor: collapse note,
        divergence guard) on TRL's logged metrics, which it records as the history."""

        def __init__(self):
            self.rules = RoundMonitor(g)

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if not is_step_log(logs):
                return
            logs["step"] = state.global_step
            if trainer_ref:
                logs["beta"] = trainer_ref[0].beta
            result.history.append(logs)
            notes, stop = self.rules.observe(logs, state.global_step)
            result.findings.extend(notes)
            if stop:
                self._stop(control, stop)

        def on_step_end(self, args, state, control, **kw):
            if result.nonfinite_rewards and not result.stopped_early:
                name, value = result.nonfinite_rewards[0]
                self._stop(control, RoundMonitor.reward_stop(name, value, state.global_step))

        def _stop(self, control, finding: str):
            result.findings.append(finding)
            result.stopped_early = True
            control.should_training_stop = True
            control.should_save = False  # keep the last good checkpoint as the last one

    class FlushRollouts(TrainerCallback):
        """Sinks that buffer (records.RolloutBuffer) write before each checkpoint and at
        the end. Before, not after (on_save): a kill between a complete checkpoint and the
        write would lose the steps since the last write, which the resumed round does not
        generate again. (Trainer decides to save in on_step_end, then saves.)"""

        def _flush(self):
            if trainer_ref and hasattr(trainer_ref[0].rollout_sink, "flush"):
                trainer_ref[0].rollout_sink.flush()

        def on_step_end(self, args, state, control, **kw):
            if control.should_save:
                self._flush()

        def on_train_end(self, args, state, control, **kw):
            self._flush()

    class SkipUpdate(TrainerCallback):
        """skip_update_below: the optimizer step of a hopeless batch does not happen. With
        the gradients not synced, accelerate's optimizer (and scaler, and scheduler) skip
        their step; the Trainer then zeroes the gradients. Weights and Adam's state stay
        exactly as they were, the KL term and momentum included."""

        def on_pre_optimizer_step(self, args, state, control, **kw):
            trainer = trainer_ref[0] if trainer_ref else None
            if trainer is not None and trainer.skip_steps_left > 0:
                trainer.skip_steps_left -= 1
                trainer.skipped_updates += 1
                # The Trainer sets it again before each micro-batch.
                trainer.accelerator.gradient_state._set_sync_gradients(False)

    return [KLSchedule(), Monitor(), FlushRollouts(), SkipUpdate()]


def saving_in_dtype(trainer_cls):
    """`trainer_cls` whose save_model writes the weights in `save_dtype` when that is set
    (the final model; checkpoints stay float32 so a resumed round loses nothing)."""
    import json

    class SavingInDtype(trainer_cls):
        save_dtype = None

        def _save(self, output_dir=None, state_dict=None):
            if self.save_dtype is None:
                return super()._save(output_dir, state_dict)
            if lora.is_lora(self.accelerator.unwrap_model(self.model)):  # merged + adapter/
                return lora.save_merged(self.accelerator.unwrap_model(self.model),
                                        output_dir or self.args.output_dir, self.save_dtype,
                                        state_dict)
            if state_dict is None:
                state_dict = self.accelerator.unwrap_model(self.model).state_dict()
            cast: dict = {}  # by storage: tied weights stay one tensor
            state_dict = {k: cast.setdefault((v.data_ptr(), v.shape), v.to(self.save_dtype))
                          if v.is_floating_point() else v for k, v in state_dict.items()}
            super()._save(output_dir, state_dict)
            config = Path(output_dir or self.args.output_dir) / "config.json"
            if self.args.should_save and config.is_file():
                # save_pretrained records the in-memory (float32) dtype; the file holds save_dtype
                tree = json.loads(config.read_text())
                tree["dtype"] = str(self.save_dtype).removeprefix("torch.")
                config.write_text(json.dumps(tree, indent=2, sort_keys=True) + "\n")

    return SavingInDtype


# grpo.algorithm -> the module of its training path. Each has trl_args(cfg, output_dir,
# report_to, round_no) (TRL's config), trainer_class() (a RecordingGRPOTrainer subclass) and
# prepare(trainer, cfg) (after construction, before training). grpo is this module's.
ALGORITHM_MODULES = {"ppo": "grpo_core.train.ppo", "rloo": "grpo_core.train.rloo",
                     "grpo_vhead": "grpo_core.train.vhead"}


def algorithm_module(name: str):
    """The module of grpo.algorithm `name`'s training path; None for plain GRPO."""
    import importlib

    return importlib.import_module(ALGORITHM_MODULES[name]) if name in ALGORITHM_MODULES else None


def recording_trainer_class(base=None):
    """RecordingGRPOTrainer over `base` (TRL's GRPOTrainer by default; grpo.algorithm rloo
    passes RLOOTrainer, which has the same generate/score/log methods)."""
    if base is None:
        from trl import GRPOTrainer as base

    class RecordingGRPOTrainer(saving_in_dtype(base)):
        """Hands every scored completion to a sink; optionally skips hopeless batches.
        `rebaseline` is the algorithms' hook (grpo.algorithm): it may replace TRL's
        advantages before they are recorded and trained on."""

        rollout_sink: RolloutSink | None = None
        stop_strings: tuple[str, ...] = ()  # the template's closing tag
        skip_update_below: float | None = None
        skipped_updates: int = 0  # optimizer steps skipped
        skip_steps_left: int = 0  # optimizer steps still to skip on the current batch
        dynamic_sampling = None  # grpo_core.train.dynamic_sampling.DynamicSampler when on

        def _generate_single_turn(self, *args, **kwargs):
            """Completions end at the first stop string: what follows it is cut (a row of a
            batch keeps its padding; vLLM may overshoot inside a token) and eos is appended,
            so TRL scores text ending in </answer> and counts the row as terminated, not
            clipped (mask_truncated_completions would drop it from the loss)."""
            from grpo_core.generation.rollout import stop_index

            res = super()._generate_single_turn(*args, **kwargs)
            # GRPOTrainer returns (ids, logprobs); RLOOTrainer the ids alone
            completion_ids, logprobs = res if isinstance(res, tuple) else (res, None)
            eos = self._tokenizer.eos_token_id
            if not self.stop_strings or eos is None:
                return res
            for i, ids in enumerate(completion_ids):
                k = stop_index(self._tokenizer, list(ids), self.stop_strings)
                if k is None:
                    continue
                completion_ids[i] = list(ids[:k]) + [eos]
                if logprobs is not None:  # vLLM: no sampled logprob for the added eos
                    logprobs[i] = list(logprobs[i][:k]) + [None]
            return (completion_ids, logprobs) if isinstance(res, tuple) else completion_ids

        def rebaseline(self, out: dict, rewards) -> list[float] | None:
            """grpo.algorithm's advantages: replace out["advantages"] (this process's rows)
            given `rewards`, the (N,) weighted rewards of every process's rows (NaN where
            unscorable), and return the N per-row advantages to record; None keeps TRL's."""
            return None

        def _generate_and_score_completions(self, inputs):
            ds = self.dynamic_sampling
            if ds is not None and self.model.training and not ds.in_pass:
                return ds.fill(self, inputs)  # calls this method back once per generation pass
            out = super()._generate_and_score_completions(inputs)
            # TRL's logs hold this step's rows gathered from every process; `out` holds
            # this process's slice. Record them all, once, on the main process.
            logs = self._logs
            n = len(out["advantages"]) * self.accelerator.num_processes
            rewards = {name: list(vals)[-n:] for name, vals in logs["rewards"].items()}
            if type(self).rebaseline is not RecordingGRPOTrainer.rebaseline:
                self._rebaseline_logged(out, rewards, n)
            weights = self.reward_weights.tolist()
            totals = [sum(w * (r[i] if r[i] == r[i] else 0.0) for w, r in zip(weights, rewards.values()))
                      for i in range(n)]
            advantages = list(logs["advantages"])[-n:]
            if self.skip_update_below is not None and totals and max(totals) < self.skip_update_below:
                # No signal: every optimizer step on this batch is skipped (SkipUpdate).
                # Every rank sees the same gathered rewards, so every rank skips.
                out["advantages"] = out["advantages"] * 0.0
                advantages = [0.0] * n
                self.skip_steps_left = self.num_iterations
            if self.rollout_sink is not None:
                meta = [(x.get("problem_id"), x.get("answer")) for x in inputs]
                if self.accelerator.num_processes > 1:  # collective: every rank calls it
                    from accelerate.utils import gather_object

                    meta = gather_object(meta)
                if self.accelerator.is_main_process:
                    self.rollout_sink(self.state.global_step,
                                      _rollout_rows(logs, rewards, totals, advantages, meta, n))
            return out

        def _rebaseline_logged(self, out: dict, rewards: dict, n: int) -> None:
            """Run `rebaseline` and put its advantages in TRL's logs (completions table,
            rollout rows) in place of TRL's."""
            import torch

            from grpo_core.train.dynamic_sampling import weighted_rewards

            per_func = torch.tensor(list(rewards.values()), dtype=torch.float32).T
            recorded = self.rebaseline(out, weighted_rewards(per_func, self.reward_weights.cpu()))
            if recorded is not None:
                logged = self._logs["advantages"]
                for _ in range(n):
                    logged.pop()
                logged.extend(recorded)

    return RecordingGRPOTrainer


def _rollout_rows(logs, rewards: dict, totals: list, advantages: list, meta: list,
                  n: int) -> list[dict]:
    prompts, completions = list(logs["prompt"])[-n:], list(logs["completion"])[-n:]
    rows = []
    for i in range(n):
        c = completions[i]
        rows.append({
            "prompt": prompts[i],
            "completion": c if isinstance(c, str) else c[-1]["content"],
            "problem_id": meta[i][0] if i < len(meta) else None,
            "answer": meta[i][1] if i < len(meta) else None,
            "rewards": {k: v[i] for k, v in rewards.items()},
            "reward": totals[i],
            "advantage": advantages[i] if i < len(advantages) else None,
        })
    return rows


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


def grpo_dataset(problems: list[Problem], template: str, tokenizer):
    from datasets import Dataset

    return Dataset.from_list([
        {"prompt": render_prompt(p.problem, template, tokenizer), "answer": p.answer, "problem_id": p.id}
        for p in problems
    ])


def quiet_trainer(trainer) -> None:
    """With disable_tqdm, transformers prints every log dict to stdout (PrinterCallback):
    the metrics go to MLflow and the history instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest *complete* checkpoint: a process killed while saving leaves a folder
    without trainer_state.json (written last), which must not be resumed from."""
    ckpts = sorted((p for p in Path(output_dir).glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                   key=lambda p: int(p.name.split("-")[1]))
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
    killed round picks up where it stopped). grpo.algorithm picks the baseline (see
    ALGORITHM_MODULES). extra_rewards: (TRL reward function or reward-model path, weight)
    pairs scored after cfg.rewards'; trainer_hook(trainer) runs once the trainer is built
    (benchmarks: memory accounting)."""
    from grpo_core.modeling.loading import configure_threads, load_tokenizer
    from grpo_core.train.dynamic_sampling import dynamic_sampler

    configure_threads()
    g = cfg.grpo
    held_out: list[Problem] = []
    if g.eval_every:  # the in-round eval's slice is never trained on
        problems, held_out = split_held_out(problems, g.eval_problems, cfg.project.seed)
    check_round_size(len(problems), cfg)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = last_checkpoint(out) if resume else None
    tokenizer = load_tokenizer(model_path)  # left padding, pad = eos when it has none
    model, save_dtype = load_for_training(model_path)
    funcs, weights = build_reward_funcs(cfg.rewards, cfg.grpo.max_completion_length)
    algo = algorithm_module(g.algorithm)  # None: plain GRPO, this module's
    args = (algo.trl_args if algo else trl_grpo_args)(cfg, str(out), report_to, round_no)
    args.reward_weights = weights + [w for _, w in extra_rewards or []]
    stops = stop_strings(template)  # as filter and eval stop (sampling.build_backend)
    args.generation_kwargs = {**trl_stop_kwargs(stops, args.use_vllm), **(args.generation_kwargs or {})}
    if not args.use_vllm:
        stop_at_text(model, tokenizer, stops)
    result = RoundResult(output_dir=str(out / "final"), steps=0)
    funcs = _watch_finite(funcs, result.nonfinite_rewards)
    trainer_ref: list = []
    callbacks = _callbacks(cfg, result, trainer_ref, round_no) + list(extra_callbacks or [])
    tracker = None
    if g.eval_every:
        # A resumed round keeps the scores and best model recorded before the kill.
        if ckpt is None:
            shutil.rmtree(out / BEST_DIR, ignore_errors=True)
        tracker = load_tracker(out, g.eval_patience) if ckpt else BestTracker(g.eval_patience)
        evaluator = InRoundEvaluator(held_out, template, cfg.eval.max_new_tokens, cfg)
        result.in_round_protocol = evaluator.protocol_hash
        callbacks.append(in_round_eval_callback(evaluator, g.eval_every, tracker, out,
                                                trainer_ref, save_dtype, result.findings))
    cls = algo.trainer_class() if algo else recording_trainer_class()
    trainer = cls(
        model=model,
        reward_funcs=funcs + [f for f, _ in extra_rewards or []],
        args=args,
        train_dataset=grpo_dataset(problems, template, tokenizer),
        processing_class=tokenizer,
        callbacks=callbacks,
        **lora.trainer_kwargs(cfg),  # model.peft: TRL wraps the model in LoRA adapters
    )
    trainer_ref.append(trainer)
    quiet_trainer(trainer)
    trainer.rollout_sink = rollout_sink
    trainer.stop_strings = stops
    trainer.skip_update_below = cfg.grpo.skip_update_below
    trainer.dynamic_sampling = dynamic_sampler(cfg, trainer)  # None when off
    if algo is not None:
        algo.prepare(trainer, cfg)  # its models and refusals, before any step
    if trainer_hook is not None:
        trainer_hook(trainer)
    train_out = trainer.train(resume_from_checkpoint=ckpt)
    result.train_seconds = float(train_out.metrics.get("train_runtime", 0.0))
    result.steps = trainer.state.global_step
    if result.steps == 0:  # check_round_size should make this impossible: never save it
        raise RuntimeError(f"GRPO round trained 0 steps on {len(problems)} problems; not saved")
    if trainer.skipped_updates:
        result.findings.append(f"skipped {trainer.skipped_updates} updates: every reward below "
                               f"{cfg.grpo.skip_update_below}")
    best = out / BEST_DIR
    if tracker is not None:
        result.in_round_evals = list(tracker.scores)
        result.findings.append(tracker.choice(result.steps))
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
    return result
