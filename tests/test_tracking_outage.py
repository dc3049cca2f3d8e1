"""A real `mlflow server` dies in the middle of a GRPO round (real TRL steps on a tiny
random model): training goes on without waiting for it, and once it is back every
per-step point is there. When it is still down at the end of the round, the points go
to a local file, are reported, and the next run sends them."""
import shutil
import time
from pathlib import Path

import pytest
from mlflow_server import MlflowServer
from transformers import TrainerCallback

from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train.grpo import run_grpo_round
from tasks import tracking as T
from tasks.tracking.step_logger import StepLogger

pytest_plugins = ["fixtures_models"]


STEPS = 12


class Outage(TrainerCallback):
    """Kill the server after step `down`, start it again after step `up` (no waiting:
    the restart takes seconds, training must not notice). Records step durations."""

    def __init__(self, server: MlflowServer, down: int, up: int | None):
        self.server, self.down, self.up = server, down, up
        self.t_last = time.monotonic()
        self.durations: dict[int, float] = {}
        self.down_steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        self.durations[state.global_step] = now - self.t_last
        self.t_last = now
        if self.server.proc is None:
            self.down_steps.append(state.global_step)
        if state.global_step == self.down:
            self.server.kill()
        elif state.global_step == self.up:
            self.server.start()


def _round(model: str, out: Path, callbacks: list) -> None:
    cfg = config_from_dict({"grpo": {
        "max_steps": STEPS, "save_steps": 100, "max_completion_length": 8, "per_device_train_batch_size": 4,
        "num_generations": 2, "learning_rate": 1e-3}, "rewards": {"funcs": ["accuracy"]}})
    run_grpo_round(model, generate_problems("train", 16, levels=[1]), cfg, out, "r1_zero",
                   extra_callbacks=callbacks)


def _steps(client, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "reward"))


@pytest.mark.integration
def test_mlflow_server_killed_mid_round(tiny_model_path, tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "server.db"
    server = MlflowServer(tmp_path, db).start().wait_healthy()
    wd = tmp_path / "wd"
    try:
        client = T.connect(server.uri)
        exp = T.experiment_id(client, "outage")

        # 1. Down from step 3 to step 8, back before the round ends.
        run = client.create_run(exp, run_name="restarted").info.run_id
        logger = StepLogger(run, workspace=wd, close_timeout_s=180)
        outage = Outage(server, down=3, up=8)
        t0 = time.monotonic()
        _round(tiny_model_path, tmp_path / "r1", [logger, outage])
        print(f"round with outage: {time.monotonic() - t0:.1f} s, step durations "
              f"{ {k: round(v, 2) for k, v in outage.durations.items()} }, "
              f"shipper retries {logger.shipper.failures}")
        assert outage.down_steps == [4, 5, 6, 7, 8]  # training went on while it was down
        slowest = max(outage.durations[s] for s in outage.down_steps)
        assert slowest < 5.0, f"a step waited for MLflow: {slowest:.1f} s"
        assert logger.unsent == 0 and logger.finding() is None
        assert _steps(MlflowClient(server.uri), run) == list(range(1, STEPS + 1))

        # 2. Down from step 3 until after the round: the points go to a local file.
        run2 = client.create_run(exp, run_name="fallback").info.run_id
        logger2 = StepLogger(run2, workspace=wd, close_timeout_s=2)
        _round(tiny_model_path, tmp_path / "r2", [logger2, Outage(server, down=3, up=None)])
        assert logger2.unsent > 0 and logger2.unsent_file.is_file()
        assert str(logger2.unsent_file) in logger2.finding().summary
        kept = len(logger2.unsent_file.read_text().splitlines())
        assert kept == logger2.unsent
        server.start().wait_healthy()
        replayed = T.replay_unsent_metrics(wd, client)
        assert replayed == {run2: kept} and not logger2.unsent_file.exists()
        assert _steps(MlflowClient(server.uri), run2) == list(range(1, STEPS + 1))
    finally:
        server.stop()
        shutil.rmtree(tmp_path / "r1", ignore_errors=True)


def test_exit_with_the_server_down_takes_seconds(tmp_path):
    """MLflow's HTTP client retries a refused connection for minutes, and its asynchronous
    logging drains its queue when the process exits: with the retries cut to seconds
    (tasks.tracking.mlflow_client.FAIL_FAST) a process whose server is down spools its
    points and ends in seconds."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the block ends
    script = (f"from tasks.tracking.mlflow_client import connect\n"
              f"from tasks.tracking.spool import MetricSpool\n"
              f"c = connect('http://127.0.0.1:{port}')\n"
              f"s = MetricSpool('ab' * 16, c, {str(tmp_path)!r})\n"
              f"s.put([('reward', 0.5, 1000, i) for i in range(3)])\n"
              f"print('unsent', s.close(1.0))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unsent 3" in out.stdout
    assert len((tmp_path / f"{'ab' * 16}.jsonl").read_text().splitlines()) == 3
    assert took < 60, f"{took:.0f} s to end with the server down"
