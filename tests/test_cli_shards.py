"""`grpo filter` and `grpo eval` honour filter.shards / eval.shards as `grpo run` does:
the same estimates and metrics as unsharded, computed by the sharded-filter / sharded-eval
Prefect flows (their runs are in the workspace's Prefect database). Real subprocesses,
Prefect's temporary local server, a tiny random model."""
import json
import subprocess

import pytest
from pipeline_runs import GRPO, prefect_flow_runs, run_env

# Slow: four CLI processes, two of them with two shard workers each (minutes on 2 cores);
# tests/test_shards.py shows the same equivalence in-process in the default run.
pytestmark = [pytest.mark.integration, pytest.mark.slow]
pytest_plugins = ["fixtures_models"]


def _grpo(workdir, *args) -> dict:
    proc = subprocess.run([GRPO, *map(str, args), "--workdir", workdir, "--json"], check=False,
                          env=run_env(workdir), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_filter_and_eval_commands_shard_like_the_pipeline(tiny_model_path, tmp_path):
    filt = ["filter", "--model", tiny_model_path, "--source", "synthetic:arith", "--k", 2,
            "--limit", 6, "--set", "rollout.max_new_tokens=6", "--set", "project.seed=3"]
    ev = ["eval", "--model", tiny_model_path, "--benchmark", "synthetic", "--limit", 5,
          "--samples", 2, "--set", "eval.max_new_tokens=6", "--set", "eval.bootstrap=20"]
    one, two = tmp_path / "one", tmp_path / "two"
    plain = _grpo(one, *filt)
    sharded = _grpo(two, *filt, "--set", "filter.shards=2")
    assert sharded["estimated"] == 6 and sharded["reused"] == 0  # stored by the workers
    for key in ("considered", "kept", "too_easy", "in_band", "too_hard", "histogram",
                "sampling_key", "model_fingerprint"):
        assert sharded[key] == plain[key], key

    plain_eval = _grpo(one, *ev)["metrics"]
    sharded_eval = _grpo(two, *ev, "--set", "eval.shards=2")["metrics"]
    for name in ("greedy_accuracy", "avg@2", "format_adherence"):
        assert sharded_eval[name] == plain_eval[name], name

    flows = prefect_flow_runs(two / "prefect")
    assert flows.get("sharded-filter") == ["COMPLETED"], flows
    assert flows.get("sharded-eval") == ["COMPLETED"], flows
