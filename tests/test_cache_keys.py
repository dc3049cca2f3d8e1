"""Stage cache keys hold every input that changes a stage's result and nothing else.

For each config field: changing it changes exactly the keys of the stages it feeds
(tasks/stages.py ingest_key, filter_key, sft_key, grpo_key, eval_key); the code version
(grpo_core/ and tasks/ sources, recursively, plus the result packages' versions) feeds
them all. The end-to-end counterpart, a second `grpo run` served wholly from the cache,
is tests/test_pipeline.py; resume after SIGKILL (keys stable across processes) is
tests/test_crash_resume.py."""
import json
import subprocess
import sys

import pytest

from grpo_core.config import config_from_dict
from grpo_core.data.problems import Problem
from tasks import cache
from tasks.stage_keys import (
    data_files,
    eval_key,
    filter_key,
    grpo_key,
    ingest_key,
    problems_fingerprint,
    sft_key,
)

pytest_plugins = ["fixtures_models"]

STAGES = ("data", "filter", "sft", "grpo", "eval")
ALL = set(STAGES)
MODEL_FP, PROBLEMS_FP, ROUND = "m0", "p0", 1
BENCHMARKS, PROBLEM_SETS = ["synthetic"], {"synthetic": "s0"}


def keys(cfg, model_fp=MODEL_FP, problems_fp=PROBLEMS_FP, round_no=ROUND,
         problem_sets=PROBLEM_SETS) -> dict[str, str]:
    return {"data": ingest_key(cfg),
            "filter": filter_key(cfg, model_fp, problems_fp),
            "sft": sft_key(cfg, model_fp, problems_fp),
            "grpo": grpo_key(cfg, model_fp, problems_fp, round_no),
            "eval": eval_key(cfg, model_fp, BENCHMARKS, problem_sets)}


def changed(a: dict, b: dict) -> set[str]:
    return {s for s in STAGES if a[s] != b[s]}


@pytest.fixture(scope="module")
def base():
    cfg = config_from_dict({})
    return cfg, keys(cfg)


# (override, stages whose key must change; every other stage's key must not)
CASES = [
    # the project
    ("project.seed=1", ALL),
    ("project.name=other", set()),
    ("project.recipe=sft_grpo", set()),
    ("project.workdir=/tmp/elsewhere", set()),
    # the model: weights are the model fingerprint, the name is not
    ("model.template=chat", {"filter", "sft", "grpo", "eval"}),
    ("model.template=r1_zero", {"filter", "sft", "grpo", "eval"}),
    ("model.dtype=bfloat16", {"filter", "eval"}),
    ("model.gguf_file=w.gguf", {"filter", "eval"}),
    ("model.name_or_path=some/other-id", set()),
    ("model.hub_token=hf_secret", set()),
    ("model.peft.enabled=true", {"sft", "grpo"}),  # LoRA trains both
    ("model.peft.r=8", set()),  # LoRA off: its settings are unused
    # data
    ("data.train=[{source: 'synthetic:arith', limit: 50}]", {"data"}),
    ("data.decontaminate=false", {"data"}),
    ("data.decontam_ngram=10", {"data"}),
    ("data.max_problem_chars=500", {"data"}),
    ("data.store_lock_timeout=5", set()),
    ("eval.benchmarks=[synthetic, gsm8k]", {"data"}),  # ingested and decontaminated against
    # rollout settings of filter and eval sampling
    ("rollout.backend=hf", {"filter", "eval"}),
    ("rollout.batch_size=8", {"filter", "eval"}),
    ("rollout.max_new_tokens=32", {"filter"}),  # eval has eval.max_new_tokens
    ("rollout.tensor_parallel_size=2", {"filter", "eval"}),
    # the filter
    ("filter.k=4", {"filter"}),
    ("filter.temperature=0.7", {"filter"}),
    ("filter.top_p=0.9", {"filter"}),
    ("filter.band=[0.2, 0.8]", {"filter"}),
    ("filter.max_problems=10", {"filter"}),
    ("filter.shards=4", set()),
    ("filter.shard_runner=dask", set()),
    ("filter.refilter_each_round=false", set()),
    ("filter.adaptive=true", {"filter"}),
    ("filter.adaptive_start=2", set()),  # the adaptive rule counts only when it is on
    ("filter.rollout_evidence_weight=0.5", set()),  # only through the priors it weighs
    # SFT
    ("sft.learning_rate=0.01", {"sft"}),
    ("sft.max_steps=3", {"sft"}),
    ("sft.per_device_train_batch_size=8", {"sft"}),
    ("sft.warmup_steps=0", {"sft"}),  # any SFTConfig field
    ("sft.max_length=128", {"sft"}),
    ("sft_stage.enabled=true", set()),
    ("sft_stage.max_examples=10", {"sft"}),
    # GRPO and its rewards
    ("grpo.beta=0.1", {"grpo"}),
    ("grpo.num_generations=4", {"grpo"}),
    ("grpo.learning_rate=0.00001", {"grpo"}),
    ("grpo.max_steps=5", {"grpo"}),
    ("grpo.temperature=0.9", {"grpo"}),
    ("grpo.max_completion_length=32", {"grpo"}),
    ("grpo.top_entropy_quantile=0.5", {"grpo"}),  # any GRPOConfig field
    ("rounds.kl_schedule.kind=linear", {"grpo"}),
    ("rounds.skip_update_below=0.1", {"grpo"}),
    ("rounds.kl_ceiling=1.0", {"grpo"}),
    ("algorithm.name=rloo", {"grpo"}),
    ("rounds.kl_schedule.per=run", {"grpo"}),
    ("grpo.mask_truncated_completions=true", {"grpo"}),
    ("dynamic_sampling.enabled=true", {"grpo"}),
    ("in_round_eval.every=5", {"grpo"}),
    ("in_round_eval.problems=8", {"grpo"}),
    ("rewards.soft_overlong.penalty=-0.5", {"grpo"}),
    ("rounds.count=3", set()),  # round 1 of a 3-round run is round 1 of a 1-round run
    ("project.compute_match=true", set()),  # the comparison's order and r1_zero's max_steps
    ("rounds.rollback_on_regression=false", set()),  # decided after the round
    ("grpo.save_steps=5", set()),
    ("grpo.save_total_limit=4", set()),
    ("grpo.vllm_server_port=8123", set()),
    ("grpo.vllm_server_timeout=10", set()),
    ("diagnosis.window=8", set()),
    ("diagnosis.collapse_patience=2", set()),  # thresholds of findings, not of training
    ("rewards.format_reward=0.25", {"grpo"}),
    ("rewards.funcs=[accuracy]", {"grpo"}),
    # how training runs
    ("train.precision=bf16", {"sft", "grpo"}),
    ("train.main_process_port=29511", set()),
    # evaluation
    ("eval.samples=8", {"eval"}),
    ("eval.temperature=1.0", {"eval"}),
    ("eval.top_p=0.9", {"eval"}),
    ("eval.max_new_tokens=32", {"eval"}),
    ("eval.greedy=false", {"eval"}),
    ("eval.bootstrap=200", {"eval"}),
    ("eval.limit=5", {"eval"}),
    ("eval.shards=4", set()),
    ("eval.primary_metric=avg@4", set()),  # every metric is computed; this one decides
    # MLflow tracking: never part of a result
    ("tracking.flush_timeout_s=5", set()),
    ("tracking.experiment=other", set()),
    ("tracking.tracking_uri=http://127.0.0.1:5999", set()),
    ("tracking.register_model=false", set()),
]


@pytest.mark.parametrize("override,expected", CASES, ids=[c[0] for c in CASES])
def test_config_field_changes_exactly_its_stages(base, override, expected):
    before = base[1]
    after = keys(config_from_dict({}, [override]))
    assert changed(before, after) == expected


def test_round_count_and_eval_length_count_only_where_they_shape_the_round():
    """rounds.count is in the round's key when the KL schedule spans the run (its beta
    depends on it); eval.max_new_tokens is when the in-round eval picks the round's model."""
    def grpo(*overrides):
        return keys(config_from_dict({}, list(overrides)))["grpo"]

    per_run = ("rounds.kl_schedule.kind=linear", "rounds.kl_schedule.per=run")
    assert grpo(*per_run) != grpo(*per_run, "rounds.count=3")
    assert grpo("rounds.kl_schedule.kind=linear") == grpo("rounds.kl_schedule.kind=linear", "rounds.count=3")
    assert grpo("in_round_eval.every=5") != grpo("in_round_eval.every=5", "eval.max_new_tokens=32")


def test_adaptive_rule_and_rollout_evidence_change_the_filter_key():
    """With filter.adaptive on its settings shape the estimates; rollout evidence (the
    priors' digest, which holds the weight) is a filter input of its own."""
    on = ["filter.adaptive=true"]
    key = keys(config_from_dict({}, on))["filter"]
    for extra in ("filter.adaptive_start=2", "filter.adaptive_step=2",
                  "filter.adaptive_confidence=0.9"):
        assert keys(config_from_dict({}, on + [extra]))["filter"] != key, extra
    cfg = config_from_dict({})
    plain = filter_key(cfg, MODEL_FP, PROBLEMS_FP)
    assert filter_key(cfg, MODEL_FP, PROBLEMS_FP, None) == plain
    assert filter_key(cfg, MODEL_FP, PROBLEMS_FP, "e0") != plain
    assert filter_key(cfg, MODEL_FP, PROBLEMS_FP, "e1") != filter_key(cfg, MODEL_FP,
                                                                       PROBLEMS_FP, "e0")


def test_lora_settings_count_when_lora_is_on():
    on = ["model.peft.enabled=true"]
    key = keys(config_from_dict({}, on))
    for extra in ("model.peft.r=8", "model.peft.alpha=8", "model.peft.dropout=0.1",
                  "model.peft.target_modules=[q_proj, v_proj]"):
        assert changed(key, keys(config_from_dict({}, on + [extra]))) == {"sft", "grpo"}, extra


def test_stage_inputs_change_exactly_their_stages(base):
    cfg, before = base
    assert changed(before, keys(cfg, model_fp="m1")) == {"filter", "sft", "grpo", "eval"}
    assert changed(before, keys(cfg, problems_fp="p1")) == {"filter", "sft", "grpo"}
    assert changed(before, keys(cfg, round_no=2)) == {"grpo"}
    assert changed(before, keys(cfg, problem_sets={"synthetic": "s1"})) == {"eval"}


def test_code_and_package_versions_change_every_key(base, monkeypatch):
    cfg, before = base
    versions = dict(cache.package_versions())
    assert set(versions) >= {"torch", "transformers", "trl", "vllm"}
    monkeypatch.setattr(cache, "package_versions", lambda: {**versions, "trl": "0.0.1"})
    assert changed(before, keys(cfg)) == ALL
    monkeypatch.setattr(cache, "package_versions", lambda: {**versions, "vllm": "9.9.9"})
    assert changed(before, keys(cfg)) == ALL
    monkeypatch.undo()
    monkeypatch.setattr(cache, "_sources", lambda: "edited")
    assert changed(before, keys(cfg)) == ALL


def test_absent_package_is_none(monkeypatch):
    import importlib.metadata as md

    real = md.version

    def version(name):
        if name == "vllm":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(md, "version", version)
    assert cache.package_versions.__wrapped__()["vllm"] == "none"


def test_source_hash_covers_subpackages_and_both_roots(tmp_path):
    assert {p.name for p in cache.CODE_ROOTS} == {"grpo_core", "tasks"}
    root = tmp_path / "grpo_core"
    (root / "verify").mkdir(parents=True)
    (root / "config.py").write_text("A = 1\n")
    (root / "verify" / "rewards.py").write_text("B = 1\n")
    h0 = cache.source_hash(root)
    (root / "verify" / "rewards.py").write_text("B = 2\n")
    h1 = cache.source_hash(root)
    assert h1 != h0
    (root / "verify" / "__pycache__").mkdir()
    (root / "verify" / "__pycache__" / "rewards.cpython-311.pyc").write_bytes(b"\0")
    (root / "notes.txt").write_text("not code")
    assert cache.source_hash(root) == h1
    (root / "verify" / "rewards.py").rename(root / "verify" / "scores.py")
    assert cache.source_hash(root) != h1  # a moved module is a change too


def test_problems_fingerprint_is_content_not_ids():
    a = Problem(source="s", split="train", problem="1+1?", answer="2", id="s/train/0")
    b = Problem(source="s", split="train", problem="2+2?", answer="4", id="s/train/1")
    fp = problems_fingerprint([a, b])
    assert problems_fingerprint([b, a]) != fp
    edited = Problem(source="s", split="train", problem="1+1?", answer="2", id="s/train/0",
                     solution="1+1 is 2")  # SFT traces read the solution
    assert problems_fingerprint([edited, b]) != fp
    assert problems_fingerprint([a, b]) == fp


def test_ingest_key_sees_source_file_content(tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    cfg = config_from_dict({"data": {"train": [{"source": str(src)}]}})
    k0 = ingest_key(cfg)
    assert ingest_key(cfg) == k0
    src.write_text(json.dumps({"problem": "1+1?", "answer": "3"}) + "\n")
    assert ingest_key(cfg) != k0


def test_ingest_key_sees_preset_copies_in_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_DATA_DIR", raising=False)
    (tmp_path / "gsm8k").mkdir()
    test_file = tmp_path / "gsm8k" / "test.jsonl"
    test_file.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    cfg = config_from_dict({"data": {"data_dir": str(tmp_path)},
                            "eval": {"benchmarks": ["gsm8k"]}})
    files = data_files(cfg)
    assert str(test_file) in {str(p) for p in files}
    k0 = ingest_key(cfg)
    test_file.write_text('{"question": "1+1?", "answer": "#### 3"}\n')
    assert ingest_key(cfg) != k0
    # The data dir from the environment is the same data dir.
    monkeypatch.setenv("GRPO_DATA_DIR", str(tmp_path))
    from_env = config_from_dict({"eval": {"benchmarks": ["gsm8k"]}})
    assert ingest_key(from_env) == ingest_key(cfg)


def test_keys_stable_across_processes(base):
    """A killed run resumes under the same keys (same code version, another process)."""
    before = base[1]
    code = ("import json, sys; sys.path.insert(0, 'tests'); import test_cache_keys as t; "
            "from grpo_core.config import config_from_dict; "
            "print(json.dumps(t.keys(config_from_dict({}))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=cache.CODE_ROOTS[1].parent, timeout=300)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == before


@pytest.mark.integration
def test_unrelated_change_is_served_from_the_cache(tiny_model_path, tmp_path):
    """`grpo run` again with only an MLflow setting changed: no stage runs again (no new
    cache entry, no new rollout or evaluation in the store). The identical re-run and the
    MLflow side of it: tests/test_pipeline.py."""
    import time

    import duckdb
    from pipeline_runs import GRPO, ROOT, run_env, write_config

    cfg = write_config(tmp_path, tiny_model_path, max_steps=2)
    workdir = tmp_path / "ws"

    def run(*extra: str) -> float:
        t0 = time.time()
        proc = subprocess.run([GRPO, "run", str(cfg), "--quiet", *extra], env=run_env(workdir),
                              cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return time.time() - t0

    def state() -> tuple:
        with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
            counts = tuple(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                           for t in ("rollouts", "eval_results", "pass_rates"))
        return sorted(p.name for p in (workdir / "cache").glob("*.json")), counts

    first_s = run()
    before = state()
    assert len(before[0]) >= 5 and before[1][0] > 0  # data, eval, filter, grpo, ... entries
    second_s = run("--set", "tracking.flush_timeout_s=7", "--set", "tracking.register_model=false")
    assert state() == before
    print(f"first run {first_s:.1f} s, re-run with tracking changed {second_s:.1f} s")
