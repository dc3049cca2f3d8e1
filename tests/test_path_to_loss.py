"""The path from `grpo run` to the loss stays short (docs/layout.md, "From `grpo run` to the
loss"): a real `grpo run` of a tiny config, in a subprocess, stopped at the first
`Trainer.train()` with the project's frames on the stack written down."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pipeline_runs import ROOT, run_env, write_config

pytest_plugins = ["fixtures_models"]

# Patch Trainer.train to record the project frames above it, then stop the run.
PROBE = r"""
import json, os, sys, traceback
import transformers
root, out = sys.argv[1], sys.argv[2]

def train(self, *a, **k):
    frames = [f"{os.path.relpath(f.filename, root)}:{f.name}" for f in traceback.extract_stack()
              if f.filename.startswith(root + os.sep) and "/.venv" not in f.filename
              and "/tests/" not in f.filename]
    open(out, "w").write(json.dumps(frames))
    raise RuntimeError("frames recorded")  # the run fails and shuts its services down

transformers.Trainer.train = train
sys.argv = ["grpo", "run", *sys.argv[3:]]
from flows.cli import app
app()
"""


@pytest.mark.heavy
def test_grpo_run_reaches_train_in_six_project_frames(tmp_path, tiny_model_path):
    cfg = write_config(tmp_path, tiny_model_path, filter={"enabled": False})
    out = tmp_path / "frames.json"
    log = tmp_path / "run.log"
    with log.open("w") as sink:  # a file, not a pipe: a service process may outlive the run
        subprocess.run([sys.executable, "-c", PROBE, str(ROOT), str(out), str(cfg), "--quiet"],
                       env=run_env(tmp_path / "ws"), cwd=ROOT, stdout=sink, stderr=sink,
                       timeout=600)
    assert out.is_file(), log.read_text()[-3000:]
    frames = json.loads(out.read_text())
    assert frames[0] == "flows/cli_run.py:run", frames
    assert frames[-1] == "grpo_core/train/grpo.py:run_grpo_round", frames
    assert len(frames) <= 6, frames
