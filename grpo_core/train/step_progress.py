"""One progress line per optimizer step for `grpo train` / `grpo sft`, so a long run on a CPU
says what it is doing (a 135M model takes about a minute a step):

    grpo step 3/20  41.2 s/step  112 tokens/s  loss 0.0123  reward 0.250  eta 11m
      gen 9.8 s (sample 7.9, score 0.3, logprobs 1.2)  train 31.4 s  0.021 TFLOP/s  MFU 14%

Written to stderr (stdout stays the command's result). tokens/s: the prompt + completion
tokens the trainer processed (TRL's cumulative `num_tokens`) over the wall time between
two logged steps; a step that is not logged (sft.logging_steps > 1) shows the last figure.
The second line (GRPO) is where the step's time went (grpo_core.train.throughput): sampling,
reward scoring, the old/reference log-prob forwards, the policy's forward and backward, and
its FLOP/s against this machine's measured matmul peak (on CPU) or the GPU's datasheet peak.
"""
from __future__ import annotations

import sys
import time

from transformers import TrainerCallback

from grpo_core.train import throughput as tp
from grpo_core.train.diagnosis import is_step_log


def _eta(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"


class StepProgress(TrainerCallback):
    """Prints `<stage> step N/M` lines; `stream` defaults to sys.stderr at print time."""

    def __init__(self, stage: str, stream=None):
        self.stage, self.stream = stage, stream
        self._step_start = self._log_time = 0.0
        self._log_tokens: float | None = None
        self._step_seconds = 0.0
        self.tokens_per_s: float | None = None

    def on_train_begin(self, args, state, control, **kw):
        self._log_time = time.perf_counter()
        self._log_tokens = None

    def on_step_begin(self, args, state, control, **kw):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self._step_seconds = time.perf_counter() - self._step_start
        if not control.should_log:  # no log follows this step: say it now
            self._say(state, {})

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or not is_step_log(logs):
            return
        now, tokens = time.perf_counter(), logs.get("num_tokens")
        if tokens is not None:
            if self._log_tokens is not None and now > self._log_time:
                self.tokens_per_s = (tokens - self._log_tokens) / (now - self._log_time)
            elif self._log_tokens is None and state.global_step == 1 and now > self._log_time:
                self.tokens_per_s = tokens / (now - self._log_time)  # the first step
            self._log_tokens, self._log_time = tokens, now
        self._say(state, logs)

    def _say(self, state, logs: dict) -> None:
        step, total = state.global_step, state.max_steps
        parts = [f"{self.stage} step {step}/{total}", f"{self._step_seconds:.1f} s/step"]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        for key in ("loss", "reward"):
            if isinstance(logs.get(key), (int, float)):
                parts.append(f"{key} {logs[key]:.4g}")
        if total and step < total:
            parts.append(f"eta {_eta(self._step_seconds * (total - step))}")
        split = where_the_step_went(logs)
        print("  ".join(parts) + (f"\n  {split}" if split else ""),
              file=self.stream or sys.stderr, flush=True)


def where_the_step_went(logs: dict) -> str:
    """`gen 9.8 s (sample 7.9, score 0.3, logprobs 1.2)  train 31.4 s  0.021 TFLOP/s  MFU 14%`
    from a step's throughput/* metrics; "" when the step logged none (SFT)."""
    gen, train = logs.get(tp.GEN_SECONDS), logs.get(tp.TRAIN_SECONDS)
    if not isinstance(gen, (int, float)) or not isinstance(train, (int, float)):
        return ""
    named = [(label, logs.get(tp.PREFIX + part)) for label, part in
             zip(("sample", "score", "logprobs"), tp.STEP_PARTS)]
    inner = ", ".join(f"{label} {v:.1f}" for label, v in named if isinstance(v, (int, float)))
    out = [f"gen {gen:.1f} s" + (f" ({inner})" if inner else ""), f"train {train:.1f} s"]
    if isinstance(logs.get(tp.TRAIN_TFLOPS), (int, float)):
        out.append(f"{logs[tp.TRAIN_TFLOPS]:.3f} TFLOP/s")
    if isinstance(logs.get(tp.MFU), (int, float)):
        out.append(f"MFU {logs[tp.MFU]:.0%}")
    return "  ".join(out)
