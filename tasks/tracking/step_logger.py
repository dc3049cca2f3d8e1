"""StepLogger: a TrainerCallback streaming a trainer's logs into an MLflow run through the
offline spool. Its own module: it imports transformers, which the facade must not."""
from __future__ import annotations

import contextlib
import time

from mlflow.tracking import MlflowClient
from transformers import TrainerCallback

from grpo_core.eval.metric_names import flatten_metrics, sanitize_key
from grpo_core.verify.rewards import scorer_error_counts
from grpo_core.workspace import workdir_of
from tasks.tracking.mlflow_client import get_client, set_tags
from tasks.tracking.spool import MetricSpool, unsent_dir
from tasks.tracking.trainer_logging import RUN_SUMMARY, chart_copies, summary_tags


def _zero_by_construction(args, key: str, value: float) -> bool:
    """TRL's clip_ratio/* with num_iterations 1: the importance ratio is exactly 1, they
    are 0 at every step (five flat charts). A non-zero value is always streamed."""
    return (key.startswith("clip_ratio/") and value == 0
            and getattr(args, "num_iterations", None) == 1)


class StepLogger(TrainerCallback):
    """Streams the trainer's logs into `run_id` (pass it with report_to=[]): points handed
    to a MetricSpool every `flush_every_s` seconds, at each save and at train end, where
    it waits up to `close_timeout_s`; what is still unsent is kept (`unsent_file`)."""

    def __init__(self, run_id: str, flush_every_s: float = 5.0,
                 client: MlflowClient | None = None, workspace=None,
                 close_timeout_s: float = 120.0):
        self.run_id, self.every, self.close_timeout_s = run_id, flush_every_s, close_timeout_s
        self.buffer: list = []
        self.summary: dict = {}
        self.client = client
        self.last_flush = time.monotonic()
        self.shipper = MetricSpool(run_id, get_client(client), unsent_dir(workdir_of(workspace)))
        self.unsent = 0
        # Reward scorer errors of this process, counted from here on (the counter is
        # process-wide and cumulative; rank 0's rewards are the ones seen here).
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
        """scorer_errors/<reward fn>: reward calls whose scoring raised (their reward was
        left out, not read as wrong), since this logger started."""
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
        """Hand over the last points and wait for MLflow (idempotent; call it in a
        `finally` too: a trainer that raises skips on_train_end)."""
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
