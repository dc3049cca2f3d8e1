"""StepLogger: a TrainerCallback streaming a trainer's logs into an MLflow run through the
offline spool (what a log line becomes: grpo_core.train.step_points). Its own module: it
imports transformers, which the facade must not."""
from __future__ import annotations

import contextlib
import time

from mlflow.tracking import MlflowClient
from transformers import TrainerCallback

from grpo_core.findings import Finding
from grpo_core.train.step_points import errors_since, step_points, summary_tags
from grpo_core.verify.rewards import scorer_error_counts
from grpo_core.workspace import workdir_of
from tasks.tracking.mlflow_client import get_client, set_tags
from tasks.tracking.spool import MetricSpool, unsent_dir


class StepLogger(TrainerCallback):
    """Streams the trainer's logs into `run_id` (pass it with report_to=[]): each log line
    handed to MLflow's asynchronous logging, which batches them; at train end it waits up
    to `close_timeout_s`, and what is still unsent is kept (`unsent_file`)."""

    def __init__(self, run_id: str, client: MlflowClient | None = None, workspace=None,
                 close_timeout_s: float = 120.0):
        self.run_id, self.close_timeout_s, self.client = run_id, close_timeout_s, client
        self.summary: dict = {}
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
        ts, step = int(time.time() * 1000), int(state.global_step)
        summary, points = step_points(logs, args)
        self.summary.update(summary)
        points.update(errors_since(scorer_error_counts(), self.errors_at_start))
        self.shipper.put([(k, v, ts, step) for k, v in points.items()])

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> int:
        """Wait for MLflow to take the points (idempotent; call it in a `finally` too: a
        trainer that raises skips on_train_end)."""
        if not self.shipper.closed:
            self.unsent = self.shipper.close(self.close_timeout_s)
            if self.summary and not self.unsent:  # MLflow answered just now
                with contextlib.suppress(Exception):
                    set_tags(self.run_id, summary_tags(self.summary), self.client)
        return self.unsent

    def finding(self) -> Finding | None:
        return Finding.note("mlflow_unsent", f"MLflow unreachable at the end of the stage: "
                            f"{self.unsent} metric points kept in {self.unsent_file}") \
            if self.unsent else None
