"""`grpo train` / `grpo sft` as a user runs them, in real subprocesses on the built-in tiny
model: one progress line per step with tokens/s on stderr, stdout only the result, no
library warnings or third-party progress bars, and SIGINT (even inherited ignored, as in a
shell's background job) or SIGTERM stops after the step under way with a checkpoint and the
model saved."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"^(grpo|sft) step (\d+)/(\d+)  [\d.]+ s/step  [\d,]+ tokens/s  loss ")
# what leaked before: transformers' FutureWarning, its "Loading weights" / "Writing model
# shards" tqdm bars
NOISE = re.compile(r"Warning|it/s\]|%\|")


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_TORCH_THREADS": "1",
            "PYTHONPATH": str(ROOT)}


def _grpo(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _steps(stderr: str, stage: str) -> list[int]:
    return [int(m.group(2)) for line in stderr.splitlines()
            if (m := STEP_LINE.match(line)) and m.group(1) == stage]


def _interrupted_train(workdir: Path, signum: int) -> dict:
    """`grpo train` for 200 steps, sent `signum` once step 2's line is out; SIGINT is
    inherited ignored, as a shell's `cmd &` leaves it."""
    proc = _grpo("train", "--workdir", str(workdir), "--set", "grpo.max_steps=200",
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    err_lines, sent = [], None
    for line in proc.stderr:
        err_lines.append(line)
        if sent is None and line.startswith("grpo step 2/"):
            proc.send_signal(signum)
            sent = time.monotonic()
    out = proc.stdout.read()
    proc.wait(timeout=120)
    return {"rc": proc.returncode, "stdout": out, "stderr": "".join(err_lines),
            "after_signal": time.monotonic() - sent if sent else None}


@pytest.fixture(scope="module")
def sigint_run(tmp_path_factory) -> tuple[dict, Path]:
    wd = tmp_path_factory.mktemp("train-sigint")
    return _interrupted_train(wd, signal.SIGINT), wd


def test_train_prints_one_line_per_step_on_stderr_and_no_library_noise(sigint_run):
    run, _ = sigint_run
    assert _steps(run["stderr"], "grpo")[:2] == [1, 2], run["stderr"]
    assert "tokens/s" in run["stderr"]
    assert not NOISE.search(run["stderr"]), run["stderr"]
    # stdout is the result only (what scripts read)
    assert [line.split(":")[0] for line in run["stdout"].splitlines()] == ["grpo", "model"]


def test_sigint_stops_after_the_step_with_checkpoint_and_model_saved(sigint_run):
    run, wd = sigint_run
    assert run["rc"] == 128 + signal.SIGINT, run["stderr"]
    steps = _steps(run["stderr"], "grpo")
    assert steps[-1] <= 4 and steps[-1] < 200  # the step under way, then stop
    assert f"stopped by SIGINT after step {steps[-1]}" in run["stderr"]
    round_dir = next((wd / "checkpoints").glob("*/grpo-round-1"))
    assert (round_dir / f"checkpoint-{steps[-1]}" / "model.safetensors").is_file()
    assert (round_dir / "final" / "model.safetensors").is_file()
    assert "Traceback" not in run["stderr"]


@pytest.mark.slow
def test_sigterm_stops_the_same_way(tmp_path):
    run = _interrupted_train(tmp_path, signal.SIGTERM)
    assert run["rc"] == 128 + signal.SIGTERM, run["stderr"]
    assert "stopped by SIGTERM" in run["stderr"]
    assert list((tmp_path / "checkpoints").glob("*/grpo-round-1/checkpoint-*/model.safetensors"))


def test_sft_prints_one_line_per_step_and_no_library_noise(tmp_path):
    proc = _grpo("sft", "--workdir", str(tmp_path), "--set", "sft.max_steps=3")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert _steps(err, "sft") == [1, 2, 3], err
    assert not NOISE.search(err), err
    assert out.splitlines()[0].startswith("sft: 3 steps")
