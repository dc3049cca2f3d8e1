"""After ingest the store is the pool (issue 25), for real: `grpo run` (SFT cold start,
filter, GRPO round, evals) in a subprocess on a JSONL training file, then the file is
deleted and the pipeline runs again: every stage is served from the cache, and a changed
SFT setting trains SFT, filters and trains GRPO again, each reading its rows from the store
(a real temporary Prefect server, MLflow on SQLite, a DuckDB file, a tiny random model)."""
import json
import re
import subprocess

import pytest
from pipeline_runs import GRPO, ROOT, run_env, write_config

from grpo_core.data.synthetic import generate_problems

pytest_plugins = ["fixtures_models"]
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _run(cfg, workdir, *extra):
    proc = subprocess.run([GRPO, "run", str(cfg), "--quiet", *extra], env=run_env(workdir),
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _stage_lines(log: str) -> dict[str, str]:
    """{stage: "computed" | "cached"} from the stage end lines of a `grpo run` log (an eval
    "reused from" another stage's is served from the cache)."""
    found = re.findall(r" - (\S+): (computed|cached|reused from \S+) in [0-9.]+ s", log)
    return {stage: "computed" if how == "computed" else "cached" for stage, how in found}


def test_source_deleted_after_ingest_run_completes_and_caches(tiny_model_path, tmp_path):
    source = tmp_path / "arith.jsonl"
    source.write_text("".join(
        json.dumps({"problem": p.problem, "solution": p.solution, "answer": p.answer,
                    "level": p.level}) + "\n"
        for p in generate_problems(n=60, levels=[1, 2], seed=3)))
    workdir = tmp_path / "ws"
    cfg = write_config(tmp_path, tiny_model_path, max_steps=2,
                       data={"train": [{"source": str(source)}]}, rounds={"count": 1},
                       sft_stage={"enabled": True, "max_examples": 16},
                       sft={"max_steps": 2, "per_device_train_batch_size": 4})
    first = _stage_lines(_run(cfg, workdir))
    assert first["data"] == first["sft"] == first["grpo/round-1"] == "computed", first

    source.unlink()  # from here on only the store holds the training problems
    again = _stage_lines(_run(cfg, workdir))
    assert set(again) == set(first), again
    # every stage from the cache ("model" only names the model's path: never cached)
    assert {s for s, how in again.items() if how != "cached"} == {"model"}, again

    # A new SFT model: SFT, the filter and the round compute, each reading the store.
    retrain = _stage_lines(_run(cfg, workdir, "--set", "sft.learning_rate=0.002"))
    assert retrain["data"] == "cached", retrain
    assert retrain["sft"] == retrain["filter/round-1"] == retrain["grpo/round-1"] == "computed", \
        retrain
