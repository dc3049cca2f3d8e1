"""After ingest the store is the pool (issue 25), for real: `grpo run` in a subprocess on
a JSONL training file, then the file is deleted and the pipeline runs again: every
stage is served from the cache, and a changed GRPO setting trains again from the store
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
    """{stage: "computed" | "cached"} from the stage end lines of a `grpo run` log."""
    return dict(re.findall(r" - (\S+): (computed|cached) in [0-9.]+ s", log))


def test_source_deleted_after_ingest_run_completes_and_caches(tiny_model_path, tmp_path):
    source = tmp_path / "arith.jsonl"
    source.write_text("".join(
        json.dumps({"question": p.problem, "answer": p.answer, "level": p.level}) + "\n"
        for p in generate_problems(n=60, levels=[1, 2], seed=3)))
    workdir = tmp_path / "ws"
    cfg = write_config(tmp_path, tiny_model_path, max_steps=2,
                       data={"train": [{"source": str(source)}]}, rounds={"count": 1})
    first = _stage_lines(_run(cfg, workdir))
    assert first["data"] == "computed" and first["grpo/round-1"] == "computed", first

    source.unlink()  # from here on only the store holds the training problems
    again = _stage_lines(_run(cfg, workdir))
    assert set(again) == set(first), again
    # every stage from the cache ("model" only names the model's path: never cached)
    assert {s for s, how in again.items() if how != "cached"} == {"model"}, again

    retrain = _stage_lines(_run(cfg, workdir, "--set", "grpo.learning_rate=0.002"))
    assert retrain["data"] == retrain["filter/round-1"] == "cached", retrain
    assert retrain["grpo/round-1"] == "computed", retrain  # read its problems from the store
