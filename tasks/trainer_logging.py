"""Trainer-side MLflow logging: our StepLogger callback (metrics shipped off the training
thread, kept locally when MLflow is away) and the environment that points transformers'
own MLflowCallback at a run. Names are re-exported by tasks.tracking."""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import mlflow
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tasks.tracking import (
    _client,
    _log_metric_items,
    _workdir,
    current_uri,
    end_run,
    flatten_metrics,
    sanitize_key,
)

_step_logger_cls = None


def _send_points(client: MlflowClient | None):
    def send(run_id: str, points: list) -> None:
        _log_metric_items(run_id, [Metric(k, v, ts, step) for k, v, ts, step in points],
                          _client(client))
    return send


def replay_unsent_metrics(workspace, client: MlflowClient | None = None) -> dict[str, int]:
    """Send the metric points earlier runs kept locally while MLflow was unreachable."""
    from tasks.metric_shipper import replay_unsent

    return replay_unsent(_workdir(workspace), _send_points(client))


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

        from grpo_core.rewards import scorer_error_counts
        from tasks.metric_shipper import MetricShipper, unsent_dir

        class _StepLogger(TrainerCallback):
            def __init__(self, run_id, flush_every_s, client, workspace, close_timeout_s):
                self.run_id, self.every, self.close_timeout_s = run_id, flush_every_s, close_timeout_s
                self.buffer: list = []
                self.last_flush = time.monotonic()
                self.shipper = MetricShipper(run_id, _send_points(client),
                                             unsent_dir(_workdir(workspace)))
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
                for k, v in {**flatten_metrics(logs), **self.scorer_errors()}.items():
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
                return self.unsent

            def finding(self) -> str | None:
                if not self.unsent:
                    return None
                return (f"MLflow unreachable at the end of the stage: {self.unsent} metric "
                        f"points kept in {self.unsent_file}; the next run sends them")

        _step_logger_cls = _StepLogger
    return _step_logger_cls(run_id, flush_every_s, client, workspace, close_timeout_s)


def trl_env(run_id: str, uri: str | None = None, log_params: bool = False,
            client: MlflowClient | None = None) -> dict[str, str]:
    """Env vars that make transformers' own MLflowCallback (report_to=["mlflow"]) log into
    `run_id`, for a trainer in a subprocess (env=) or in-process (see `trl_mlflow_env`).

    What the callback does (transformers 5, integrations/integration_utils.py): at train
    begin it calls mlflow.set_experiment(MLFLOW_EXPERIMENT_NAME) then
    mlflow.start_run(run_name=args.run_name), which resumes MLFLOW_RUN_ID (and deletes that
    variable from os.environ: set it again before each trainer); it logs args + model
    config as params unless MLFLOW_MAX_LOG_PARAMS caps them (0 here by default: the parent
    already holds our config, and a resumed run that re-logs a changed value raises);
    metrics are logged asynchronously; at train end it calls mlflow.end_run(), which marks
    the run FINISHED but does not flush the async queue. The caller must therefore:
    leave TrainingArguments.run_name None (else the child run is renamed), call
    mlflow.flush_async_logging() after train(), mark the run FAILED itself when training
    raises (the callback's __del__ would end it FINISHED), and have no other fluent run
    active in that thread. `trl_mlflow_env` does all of that.
    """
    c = _client(client)
    uri = uri or current_uri()
    exp = c.get_experiment(c.get_run(run_id).info.experiment_id).name
    env = {"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": exp,
           "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_NESTED_RUN": "false",
           "MLFLOW_FLATTEN_PARAMS": "true", "HF_MLFLOW_LOG_ARTIFACTS": "false"}
    if not log_params:
        env["MLFLOW_MAX_LOG_PARAMS"] = "0"
    return env


@contextlib.contextmanager
def trl_mlflow_env(run_id: str, uri: str | None = None, log_params: bool = False) -> Iterator[dict]:
    """Around trainer.train() in this process, with report_to=["mlflow"]: sets the env of
    `trl_env`, then flushes the async metrics, ends the callback's fluent run (FAILED on an
    exception) and restores the environment. One trainer at a time per process."""
    from mlflow.tracking._tracking_service import utils as tracking_utils

    env = trl_env(run_id, uri, log_params)
    saved = {k: os.environ.get(k) for k in env}
    # A global URI set earlier in this process would beat the env var: set ours for the
    # duration (the callback uses the fluent API) and put the old one back after.
    prev_global = getattr(tracking_utils, "_tracking_uri", None)
    os.environ.update(env)
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    failed = False
    try:
        yield env
    except BaseException:
        failed = True
        raise
    finally:
        with contextlib.suppress(Exception):
            mlflow.flush_async_logging()
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            mlflow.end_run("FAILED" if failed else "FINISHED")
        elif failed:
            with contextlib.suppress(MlflowException):
                end_run(run_id, "FAILED")
        mlflow.set_tracking_uri(prev_global)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
