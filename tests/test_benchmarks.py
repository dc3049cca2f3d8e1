"""A benchmark is always its evaluation split (grpo_core/data/benchmarks.py), whatever the
training sources are; every run decontaminates the pool against every eval set.

The pipeline test runs `grpo run` for real (Prefect, MLflow on SQLite, DuckDB, TRL steps
on a tiny random model) on the reference data under ../shared/data, with a training file
into which an evaluation problem of GSM8K test and one of MATH-500 are planted."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from pipeline_runs import GRPO, ROOT, mlflow_runs, run_env, write_config

from grpo_core.config import ConfigError, load_config
from grpo_core.data.adapters import resolve_source
from grpo_core.data.benchmarks import (
    BenchmarkError,
    benchmark_problems,
    check_benchmarks,
    fingerprint,
)
from grpo_core.data.records import stage_problems
from grpo_core.data.store import Store
from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]


def _cfg(data_dir, **eval_):
    return load_config(None, [f"data.data_dir={data_dir}", "data.train=[{source: gsm8k}]",
                              *(f"eval.{k}={v}" for k, v in eval_.items())])


def test_gsm8k_in_training_evaluates_the_test_split(shared_data, tmp_path):
    """The Qwen presets' layout: gsm8k in data.train. The old fallback returned the 7,473
    train rows from the store; now the 1,319 test problems, with their fingerprint."""
    cfg = _cfg(shared_data, benchmarks="[gsm8k]")
    test_rows = stage_problems("gsm8k", "test", data_dir=shared_data)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(resolve_source("gsm8k", split="train", data_dir=shared_data))
        assert len(store.problems("gsm8k", "train")) == 7473
        got = benchmark_problems("gsm8k", cfg, store)  # not stored yet: read from the files
        assert len(got) == 1319 and {p.split for p in got} == {"test"}
        assert fingerprint(got) == fingerprint(test_rows)
        store.ingest(resolve_source("gsm8k", split="test", data_dir=shared_data))
        stored = benchmark_problems("gsm8k", cfg, store)  # stored now: the same list
        assert fingerprint(stored) == fingerprint(test_rows)
        # No evaluation split anywhere: an error naming it, never the training rows.
        empty = tmp_path / "empty"
        empty.mkdir()
        with Store.open(tmp_path / "only-train.duckdb") as only_train:
            only_train.ingest(resolve_source("gsm8k", split="train", data_dir=shared_data))
            with pytest.raises(BenchmarkError, match="'gsm8k'.*evaluation split"):
                benchmark_problems("gsm8k", _cfg(empty, benchmarks="[gsm8k]"), only_train)


def test_user_benchmark_needs_an_eval_split(tmp_path):
    rows = "".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                   for i in range(1, 6))
    (tmp_path / "mine.jsonl").write_text(rows)
    cfg = load_config(None, ["eval.benchmarks=[mine]"])
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(resolve_source(str(tmp_path / "mine.jsonl"), split="train"))
        with pytest.raises(BenchmarkError, match="'mine'.*no evaluation split"):
            check_benchmarks(cfg, store)
        store.ingest(resolve_source(str(tmp_path / "mine.jsonl"), split="test"))
        check_benchmarks(cfg, store)
        assert [p.split for p in benchmark_problems("mine", cfg, store)] == ["test"] * 5


@pytest.mark.parametrize("train", ["[{source: math500}]", "[{source: gsm8k, split: test}]",
                                   "[{source: aime24}]", "[{source: synthetic:arith, split: eval}]"])
def test_training_on_an_eval_split_is_refused(train):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"data.train={train}"])
    assert err.value.field == "data" and "train.0" in str(err.value)
    assert "evaluation split" in str(err.value)
    load_config(None, [f"data.train={train}", "data.allow_eval_split_training=true"])


def test_primary_metric_names_the_extraction():
    assert load_config(None, ["eval.primary_metric=flexible/avg@4"]).eval.primary_metric \
        == "flexible/avg@4"
    assert load_config(None, ["eval.primary_metric=strict/avg@4"]).eval.primary_metric == "avg@4"
    with pytest.raises(ConfigError, match="primary_metric"):
        load_config(None, ["eval.primary_metric=loose/avg@4"])


def test_grpo_run_refuses_a_missing_eval_split(tmp_path):
    """Exit 2 naming the benchmark, before anything is written."""
    empty = tmp_path / "data"
    empty.mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"data_dir": str(empty)},
                                   "eval": {"benchmarks": ["synthetic", "aime24"]}}))
    out = subprocess.run([GRPO, "run", str(cfg)], env=run_env(tmp_path / "ws"), cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "eval.benchmarks" in out.stderr and "aime24" in out.stderr
    assert not (tmp_path / "ws").exists()


@pytest.mark.integration
def test_pipeline_stores_eval_sets_and_flags_planted_rows(shared_data, tiny_model_path, tmp_path):
    """A real run: the eval sets land in the store, the planted training rows are flagged
    and kept out of training, the data run and the report say so, and every eval run
    records the split and the fingerprint of its problem list."""
    gsm_test = [json.loads(line) for line in (shared_data / "gsm8k/test.jsonl").open()]
    gsm_train = [json.loads(line) for line in (shared_data / "gsm8k/train.jsonl").open()][:20]
    m500 = [json.loads(line) for line in (shared_data / "math500/test.jsonl").open()]
    planted = [{"question": "Warm-up first. " + gsm_test[7]["question"],
                "answer": gsm_test[7]["answer"]},
               {"question": m500[3]["problem"], "answer": "#### 1"}]
    train = tmp_path / "planted.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in gsm_train + planted))
    workdir = tmp_path / "ws"
    cfg = write_config(
        tmp_path, tiny_model_path, max_steps=2,
        data={"train": [{"source": str(train), "columns": {"problem": "question",
                                                          "answer": "answer"}}],
              "data_dir": str(shared_data)},
        eval={"benchmarks": ["gsm8k", "math500"], "limit": 3, "samples": 2,
              "max_new_tokens": 8, "bootstrap": 50})
    tree = yaml.safe_load(cfg.read_text())
    tree["rounds"]["count"] = 1
    cfg.write_text(yaml.safe_dump(tree))
    out = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=run_env(workdir), cwd=ROOT,
                         capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    with Store.open(workdir / "store.duckdb", read_only=True) as store:
        assert len(store.problems("gsm8k", "test", exclude_contaminated=False)) == 1319
        assert len(store.problems("math500", "test", exclude_contaminated=False)) == 500
        flagged = store.contamination()
    assert flagged == {("planted", "train"): {"gsm8k/test": 1, "math500/test": 1}}

    _, runs = mlflow_runs(workdir)
    by_name = {stage_of(r): r for r in runs}
    data = by_name["data"].data.metrics
    assert data["data/pool_size"] == 20
    for bench in ("gsm8k", "math500"):
        assert data[f"data/contamination/{bench}/flagged"] == 1
        assert data[f"data/contamination/{bench}/excluded"] == 1
    assert ("finding: data: contamination [warn]: 1 training problems reproduce gsm8k problems; "
            "1 excluded") in out.stdout
    final = by_name["eval/final"].data
    test3 = stage_problems("gsm8k", "test", data_dir=shared_data, limit=3)
    assert final.tags["gsm8k.split"] == "test"
    assert final.tags["gsm8k.problems_hash"] == fingerprint(test3)
    for key in ("gsm8k/greedy_accuracy", "gsm8k/flexible/greedy_accuracy",
                "gsm8k/flexible/avg_at_2", "gsm8k/scorer_errors"):
        assert key in final.metrics, sorted(final.metrics)
