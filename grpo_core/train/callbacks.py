"""The GRPO round's TrainerCallbacks. transformers hands a callback the model, not the
trainer: run_grpo_round builds these before the trainer (their order in the Trainer's
list is the order they run in) and binds them to it once it exists (attach_trainer)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from grpo_core.findings import Finding
from grpo_core.train.diagnosis import RoundMonitor, is_step_log
from grpo_core.train.in_round_eval import BEST_DIR, METRIC, STATE_FILE, BestTracker
from grpo_core.train.throughput import (
    cpu_matmul_tflops,
    cuda_device_name,
    peak_tflops,
    step_metrics,
)
from grpo_core.train.trainer_internals import (
    log_metric,
    skip_optimizer_step,
    step_time,
    take_step_counts,
)
from grpo_core.train.trl_args import kl_beta


class BoundCallback(TrainerCallback):
    """A callback that acts on its trainer; it does nothing until bound."""

    trainer = None

    def bind(self, trainer) -> None:
        self.trainer = trainer


def attach_trainer(callbacks: list, trainer) -> None:
    """Bind `trainer` to each of `callbacks` that acts on it (a BoundCallback)."""
    for cb in callbacks:
        if isinstance(cb, BoundCallback):
            cb.bind(trainer)


class KLSchedule(BoundCallback):
    """rounds.kl_schedule: the trainer's beta at each step."""

    def __init__(self, cfg, round_no: int):
        self.cfg, self.round_no = cfg, round_no

    def on_step_begin(self, args, state, control, **kw):
        if self.cfg.rounds.kl_schedule.kind != "constant" and self.trainer is not None:
            self.trainer.beta = kl_beta(state.global_step, state.max_steps, self.cfg, self.round_no)


class Monitor(BoundCallback):
    """The in-round rules (grpo_core.train.diagnosis.RoundMonitor: collapse note,
    divergence guard) on TRL's logged metrics, which it records as the round's history
    (`result`: a grpo_core.train.grpo.RoundResult)."""

    def __init__(self, cfg, result):
        self.rules = RoundMonitor(cfg)
        self.result = result

    def on_log(self, args, state, control, logs=None, **kw):
        logs = dict(logs or {})
        if not is_step_log(logs):
            return
        logs["step"] = state.global_step
        if self.trainer is not None:
            logs["beta"] = self.trainer.beta
        self.result.history.append(logs)
        notes, stop = self.rules.observe(logs, state.global_step)
        self.result.findings.extend(notes)
        if stop:
            self._stop(control, stop)

    def on_step_end(self, args, state, control, **kw):
        if self.result.nonfinite_rewards and not self.result.stopped_early:
            name, value = self.result.nonfinite_rewards[0]
            self._stop(control, RoundMonitor.reward_stop(name, value, state.global_step))

    def _stop(self, control, finding: Finding):
        self.result.findings.append(finding)
        self.result.stopped_early = True
        control.should_training_stop = True
        control.should_save = False  # keep the last good checkpoint as the last one


class FlushRollouts(BoundCallback):
    """Sinks that buffer (records.RolloutBuffer) write before each checkpoint and at
    the end. Before, not after (on_save): a kill between a complete checkpoint and the
    write would lose the steps since the last write, which the resumed round does not
    generate again. (Trainer decides to save in on_step_end, then saves.)"""

    def _flush(self):
        if self.trainer is not None and hasattr(self.trainer.rollout_sink, "flush"):
            self.trainer.rollout_sink.flush()

    def on_step_end(self, args, state, control, **kw):
        if control.should_save:
            self._flush()

    def on_train_end(self, args, state, control, **kw):
        self._flush()


class SkipUpdate(BoundCallback):
    """skip_update_below: the optimizer step of a hopeless batch does not happen. Weights
    and Adam's state stay exactly as they were, the KL term and momentum included."""

    def on_pre_optimizer_step(self, args, state, control, **kw):
        trainer = self.trainer
        if trainer is not None and trainer.skip_steps_left > 0:
            trainer.skip_steps_left -= 1
            trainer.skipped_updates += 1
            skip_optimizer_step(trainer)


class InRoundEval(BoundCallback):
    """in_round_eval.every: score the policy (`evaluate(model, tokenizer)`) at every `every`-th
    step and the last, keep the best model in out/best (with the tracker's state), stop
    after `patience` falls (grpo_core.train.in_round_eval)."""

    def __init__(self, evaluate, every: int, tracker: BestTracker, out: Path, save_dtype,
                 findings: list[Finding]):
        self.evaluate, self.every, self.tracker = evaluate, every, tracker
        self.best, self.save_dtype, self.findings = out / BEST_DIR, save_dtype, findings

    def on_step_end(self, args, state, control, **kw):
        step = state.global_step
        if self.trainer is None or (step % self.every and step < state.max_steps):
            return
        trainer, tracker = self.trainer, self.tracker
        model = trainer.accelerator.unwrap_model(trainer.model)
        score = float(self.evaluate(model, trainer.processing_class))
        log_metric(trainer, METRIC, score, "train")  # into this step's log
        is_best, stop = tracker.observe(step, score)
        if is_best:
            self._save_best(trainer)
        if trainer.is_world_process_zero():
            self.best.mkdir(parents=True, exist_ok=True)
            (self.best / STATE_FILE).write_text(json.dumps(tracker.to_json()))
        if stop:
            self.findings.append(Finding.note(
                "in_round_stopped", f"in-round eval fell {tracker.below} times in a row below "
                f"step {tracker.best_step}'s {tracker.best_score:.3f} (in_round_eval.patience): "
                f"stopped at step {step}", steps=[step], best_step=tracker.best_step,
                best_score=tracker.best_score))
            control.should_training_stop = True

    def _save_best(self, trainer) -> None:
        trainer.save_dtype = self.save_dtype  # the handed-on model: stored dtype
        try:
            trainer.save_model(str(self.best))
        finally:
            trainer.save_dtype = None  # checkpoints stay float32
        if trainer.is_world_process_zero():
            trainer.processing_class.save_pretrained(str(self.best))


class Throughput(BoundCallback):
    """Each optimizer step's throughput/* metrics (grpo_core.train.throughput: generation
    and training seconds, tokens per second, MFU on CUDA) into TRL's metrics of the step,
    from the trainer's counts and TRL's step_time. Measures only."""

    def __init__(self, peak_override: float | None = None):
        self.peak_override = peak_override
        self.peak = None
        self.params = 0
        self._t0 = None

    def bind(self, trainer) -> None:
        super().bind(trainer)
        # the training device (args.device: the model may be placed later, by DeepSpeed/FSDP)
        if trainer.args.device.type == "cuda":
            self.peak = peak_tflops(cuda_device_name(), self.peak_override)
        elif trainer.args.device.type == "cpu":  # this CPU's own matmul rate, measured once
            self.peak = self.peak_override or cpu_matmul_tflops(torch.get_num_threads())
        else:
            self.peak = self.peak_override
        # ds_numel: a parameter ZeRO-3 partitioned at load holds its full size there
        self.params = sum(getattr(p, "ds_numel", p.numel()) for p in trainer.model.parameters()
                          if p.requires_grad)

    def on_step_begin(self, args, state, control, **kw):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        if self.trainer is None:
            return
        counts = take_step_counts(self.trainer)
        seconds = step_time(self.trainer)
        if seconds is None:  # TRL logged none: the step's wall time
            seconds = time.perf_counter() - (self._t0 or time.perf_counter())
        for name, value in step_metrics(counts, seconds, self.params, self.peak).items():
            log_metric(self.trainer, name, value, "train")


class LossHistory(TrainerCallback):
    """SFT's history: each logged step with a loss."""

    def __init__(self, history: list[dict]):
        self.history = history

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.history.append({**logs, "step": state.global_step})


def round_callbacks(cfg, result, round_no: int) -> list:
    """The round's own callbacks, in the order they run (bind them to the trainer)."""
    return [KLSchedule(cfg, round_no), Throughput(cfg.train.peak_tflops), Monitor(cfg, result),
            FlushRollouts(), SkipUpdate()]
