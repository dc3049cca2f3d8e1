"""Trainer-side MLflow logging: our StepLogger callback (metrics shipped off the training
thread, kept locally when MLflow is away) and the replay of points kept locally. Names
are re-exported by tasks.tracking."""
from __future__ import annotations

import contextlib
import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from tasks.tracking.mlflow_client import (
    flatten_metrics,
    get_client,
    log_metric_items,
    sanitize_key,
    set_tags,
)
from tasks.tracking.tracking_store import workdir_of

_step_logger_cls = None


def _send_points(client: MlflowClient | None):
    def send(run_id: str, points: list) -> None:
        log_metric_items(run_id, [Metric(k, v, ts, step) for k, v, ts, step in points],
                         get_client(client))
    return send


def replay_unsent_metrics(workspace, client: MlflowClient | None = None) -> dict[str, int]:
    """Send the metric points earlier runs kept locally while MLflow was unreachable."""
    from tasks.tracking.metric_shipper import replay_unsent

    return replay_unsent(workdir_of(workspace), _send_points(client))


def _zero_by_construction(args, key: str, value: float) -> bool:
    """TRL's clip_ratio/* with one optimisation pass per generation (num_iterations 1):
    the importance ratio is then exactly 1, so they are 0 at every step, and the run
    page would open on their five flat charts. A non-zero value is always streamed."""
    return (key.startswith("clip_ratio/") and value == 0
            and getattr(args, "num_iterations", None) == 1)


# The trainer's end-of-training summary: one value per run, a one-dot chart as a metric;
# tags of the run instead (`trainer.<key>`, readable on its overview).
RUN_SUMMARY = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second",
                         "total_flos", "train_loss"})


# MLflow 3.17's run page groups charts by key prefix in alphabetical order, so a GRPO round
# opened on TRL's seven completions/* charts. The three curves that say whether the round
# learned are also sent under a prefix that sorts first (checked in Chromium by
# bench/mlflow_ui_check.py); their original keys stay for anyone who reads them by name.
HEADLINE_CURVES = {"reward": "0 headline/reward", "rewards/accuracy/mean": "0 headline/accuracy",
                   "completions/mean_length": "0 headline/mean_length",
                   # in_round_eval.every: the held-out points beside the training accuracy
                   "in_round_eval/accuracy": "0 headline/accuracy_in_round_eval"}

# GRPO's loss on a small model is mostly beta x KL, ~1e-8 per token: MLflow's chart axis
# rounds such values to "0 0 0 0". It is also sent multiplied by a fixed power of ten
# (fixed, so runs stay comparable; the factor is in the name): ~1e-8 reads 0.01.
SCALED = {"loss": ("loss_x1e6", 1e6)}


def chart_copies(flat: dict[str, float], grpo: bool = True) -> dict[str, float]:
    """The extra keys a point is also sent under: HEADLINE_CURVES (sorted first on the
    run's chart tab) and, for a GRPO trainer's points, SCALED (a readable axis; SFT's
    cross-entropy loss reads well as it is)."""
    out = {HEADLINE_CURVES[k]: v for k, v in flat.items() if k in HEADLINE_CURVES}
    if grpo:
        out.update({SCALED[k][0]: v * SCALED[k][1] for k, v in flat.items() if k in SCALED})
    return out


def summary_tags(summary: dict) -> dict[str, str]:
    """{"trainer.train_loss": "0.0123", ...}: 4 significant digits (no float noise)."""
    return {f"trainer.{k}": f"{v:.4g}" if isinstance(v, float) else str(v)
            for k, v in summary.items()}


def StepLogger(run_id: str, flush_every_s: float = 5.0, client: MlflowClient | None = None,
               workspace=None, close_timeout_s: float = 120.0):
    """A transformers TrainerCallback streaming the trainer's logs into `run_id`.

    Pass it in `callbacks=[...]` with report_to=[] (or "none"): no fluent MLflow state,
    works from any thread. Points are collected and handed every `flush_every_s` seconds,
    at each checkpoint save and at train end to a `MetricShipper`, whose thread writes
    them: a 0.1 s step does not pay a database write, and a tracking server that goes
    away mid-round does not stall training. At train end it waits up to
    `close_timeout_s` for MLflow; points still unsent are kept under
    <workdir>/runs/unsent/ (`unsent` and `unsent_file` say so) and sent by the next run.
    Built lazily: importing this module does not import transformers.
    """
    global _step_logger_cls
    if _step_logger_cls is None:
        from transformers import TrainerCallback

        from grpo_core.verify.rewards import scorer_error_counts
        from tasks.tracking.metric_shipper import MetricShipper, unsent_dir

        class _StepLogger(TrainerCallback):
            def __init__(self, run_id, flush_every_s, client, workspace, close_timeout_s):
                self.run_id, self.every, self.close_timeout_s = run_id, flush_every_s, close_timeout_s
                self.buffer: list = []
                self.summary: dict = {}
                self.client = client
                self.last_flush = time.monotonic()
                self.shipper = MetricShipper(run_id, _send_points(client),
                                             unsent_dir(workdir_of(workspace)))
                self.unsent = 0
                # Reward scorer errors of this process, counted from here on (the counter
                # is process-wide and cumulative; rank 0's rewards are the ones seen here).
                self.errors_at_start = scorer_error_counts()

            @property
            def unsent_file(self):
                return self.shipper.fallback_file if self.unsent else None

            def on_log(self, args, state, control, logs=None, **kwargs):
                if not state.is_world_process_zero or not logs:
                    return
                ts = int(time.time() * 1000)
                self.summary.update({k: v for k, v in logs.items() if k in RUN_SUMMARY})
                logs = {k: v for k, v in logs.items() if k not in RUN_SUMMARY}
                flat = flatten_metrics(logs)
                # a GRPO trainer's arguments say how many completions per prompt
                flat.update(chart_copies(flat, grpo=hasattr(args, "num_generations")))
                for k, v in {**flat, **self.scorer_errors()}.items():
                    if not _zero_by_construction(args, k, v):
                        self.buffer.append((sanitize_key(k), v, ts, int(state.global_step)))
                if time.monotonic() - self.last_flush >= self.every:
                    self.flush()

            def scorer_errors(self) -> dict[str, int]:
                """scorer_errors/<reward fn>: reward calls whose scoring raised (their
                reward was left out, not read as wrong), since this logger started."""
                now, start = scorer_error_counts(), self.errors_at_start
                return {f"scorer_errors/{label.removeprefix('reward/')}": n - start.get(label, 0)
                        for label, n in now.items() if label.startswith("reward/")}

            def flush(self):
                items, self.buffer = self.buffer, []
                self.shipper.put(items)
                self.last_flush = time.monotonic()

            def on_save(self, args, state, control, **kwargs):
                self.flush()

            def on_train_end(self, args, state, control, **kwargs):
                self.close()

            def close(self) -> int:
                """Hand over the last points and wait for MLflow (idempotent): call it in
                a `finally` too, since a trainer that raises skips on_train_end."""
                if not self.shipper.closed:
                    self.flush()
                    self.unsent = self.shipper.close(self.close_timeout_s)
                    if self.summary and not self.unsent:  # MLflow answered just now
                        with contextlib.suppress(Exception):
                            set_tags(self.run_id, summary_tags(self.summary), self.client)
                return self.unsent

            def finding(self) -> str | None:
                if not self.unsent:
                    return None
                return (f"MLflow unreachable at the end of the stage: {self.unsent} metric "
                        f"points kept in {self.unsent_file}; the next run sends them")

        _step_logger_cls = _StepLogger
    return _step_logger_cls(run_id, flush_every_s, client, workspace, close_timeout_s)

