"""The sharded difficulty filter and evaluation: a deterministic split, an all-or-nothing
ingest, eval records that round-trip Parquet exactly, and the same pass-rate rows / eval
records and metrics as the unsharded stages through the real Prefect flows (two worker
processes, Prefect's temporary local server)."""
from __future__ import annotations

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from flows.prefill import prefill_sharded
from grpo_core.config import ConfigError, PipelineConfig
from grpo_core.data.db import PASS_RATE_SCHEMA
from grpo_core.data.records import problem_key, read_pass_rates, write_pass_rates
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.difficulty import run_filter
from grpo_core.eval.shards import (
    finished_shard,
    ingest_shards,
    read_records,
    split,
    work_key,
    worker_threads,
    write_records,
)

pytest_plugins = ["fixtures_models"]

# ----------------------------------------------------------------------------- split


@pytest.mark.parametrize("n_items,n", [(10, 3), (10, 1), (3, 5), (0, 2), (8, 8), (128, 2)])
def test_split_is_contiguous_balanced_and_deterministic(n_items, n):
    items = list(range(n_items))
    parts = split(items, n)
    assert parts == split(items, n)  # no randomness
    assert [x for part in parts for x in part] == items  # contiguous, in order
    assert len(parts) == min(n, n_items) and all(parts)  # no empty shard
    sizes = [len(p) for p in parts]
    assert sizes == sorted(sizes, reverse=True) and (not sizes or max(sizes) - min(sizes) <= 1)


def test_split_refuses_zero_shards_and_threads_share_the_cores():
    with pytest.raises(ValueError):
        split([1, 2], 0)
    assert worker_threads(2, cores=2) == 1 and worker_threads(3, cores=16) == 5
    assert worker_threads(4, cores=2) == 1  # never 0


def test_config_shards_fields():
    cfg = PipelineConfig()
    assert cfg.filter.shards == 1 and cfg.filter.shard_runner == "process"
    with pytest.raises(ValidationError):
        cfg.filter.shards = 0
    with pytest.raises(ValidationError):
        cfg.filter.shard_runner = "threads"
    assert cfg.eval.shards == 1
    with pytest.raises(ValidationError):
        cfg.eval.shards = 0


# ----------------------------------------------------------------------------- ingest


def _row(pid: str, successes: int, fp: str = "fp") -> dict:
    return {"model_fingerprint": fp, "problem_id": pid, "sampling_key": "sk", "input_hash": "ih",
            "source": "synthetic:arith", "level": 1, "k": 4, "successes": successes,
            "pass_rate": successes / 4, "wilson_lo": 0.0, "wilson_hi": 1.0, "truncated": 0,
            "mean_tokens": 3.0, "sampling": "{}"}


def _shard_file(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows, schema=PASS_RATE_SCHEMA), path)
    return str(path)


def test_ingest_writes_every_shard_in_one_transaction(tmp_path):
    a = _shard_file(tmp_path / "a.parquet", [_row("p1", 1), _row("p2", 2)])
    b = _shard_file(tmp_path / "b.parquet", [_row("p3", 3)])
    with Store.open(tmp_path / "s.duckdb") as store:
        write_pass_rates(store, [_row("p0", 0), _row("p1", 4)])  # p1 gets replaced
        assert ingest_shards(store, [a, b]) == ["p1", "p2", "p3"]
        got = {r["problem_id"]: r["successes"] for r in read_pass_rates(store)}
    assert got == {"p0": 0, "p1": 1, "p2": 2, "p3": 3}


@pytest.mark.parametrize("bad", ["corrupt", "missing"])
def test_ingest_failing_mid_way_leaves_the_table_unchanged(tmp_path, bad):
    good = _shard_file(tmp_path / "good.parquet", [_row("p1", 1), _row("p2", 2)])
    broken = tmp_path / "broken.parquet"
    if bad == "corrupt":
        broken.write_bytes(b"PAR1 not really parquet")
    later = _shard_file(tmp_path / "later.parquet", [_row("p3", 3)])
    with Store.open(tmp_path / "s.duckdb") as store:
        write_pass_rates(store, [_row("p0", 0), _row("p1", 4)])
        before = read_pass_rates(store)
        # The good file is inserted first, then reading the broken one fails.
        with pytest.raises((OSError, pa.ArrowException)):
            ingest_shards(store, [good, str(broken), later])
        assert read_pass_rates(store) == before  # created_at included: nothing touched
        assert ingest_shards(store, [good, later]) == ["p1", "p2", "p3"]  # still writable


def test_missing_runner_extra_is_one_line(shard_flows, monkeypatch):
    monkeypatch.setitem(sys.modules, "prefect_ray", None)  # import fails
    monkeypatch.setitem(sys.modules, "prefect_dask", None)
    for kind in ("ray", "dask"):
        with pytest.raises(ConfigError) as err:
            shard_flows.task_runner(kind, 2)
        msg = str(err.value)
        assert "\n" not in msg and f"pip install 'grpo-pipeline[{kind}]'" in msg
    assert type(shard_flows.task_runner("process", 2)).__name__ == "ProcessPoolTaskRunner"


# ----------------------------------------------------------------------------- end to end


def _cfg(shards: int) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.rollout.backend = "hf"
    cfg.rollout.batch_size = 8
    cfg.rollout.max_new_tokens = 12
    cfg.model.template = "r1_zero"
    cfg.filter.k = 4
    cfg.filter.band = (0.0, 1.0)
    cfg.project.seed = 7
    cfg.filter.shards = shards
    return cfg


def _rows(store) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created_at"} for r in read_pass_rates(store)]


@pytest.mark.integration
def test_sharded_filter_gives_the_unsharded_rows(shard_flows, tiny_model_path, tmp_path):
    problems = generate_problems("train", 12, seed=5)
    with Store.open(tmp_path / "one.duckdb") as store:
        one = run_filter(tiny_model_path, problems, _cfg(1), store=store)
        expected = _rows(store)
    assert one.estimated == 12 and len(expected) == 12

    db = tmp_path / "two.duckdb"
    with Store.open(db) as store:  # a third already stored: reuse stays
        run_filter(tiny_model_path, problems[:4], _cfg(1), store=store)
    cfg = _cfg(2)
    fresh = _prefill_in_a_flow(shard_flows, tiny_model_path, cfg, problems, db, tmp_path / "ws")
    assert fresh == [problem_key(p) for p in problems[4:]]  # only the missing, in order
    with Store.open(db) as store:
        two = run_filter(tiny_model_path, problems, cfg, store=store, fresh=fresh)
        assert _rows(store) == expected  # every column but created_at
    assert (two.estimated, two.reused) == (8, 4)
    assert two.counts == one.counts and [p.id for p in two.kept] == [p.id for p in one.kept]
    assert not list((tmp_path / "ws" / "shards").iterdir())  # shard files cleaned up

    # Everything stored now: no flow, no worker (through the prefill `grpo filter` and the
    # pipeline call).
    assert prefill_sharded(cfg, tiny_model_path, lambda: problems, lambda: Store.open(db),
                           tmp_path / "ws") == []


def test_prefill_without_shards_reads_nothing():
    def untouched():
        raise AssertionError("read without shards")

    assert prefill_sharded(_cfg(1), "builtin:tiny-arith", untouched, untouched, "/nowhere") == []


# ----------------------------------------------------------------------------- resuming


def test_work_key_is_the_inputs_and_nothing_else():
    problems = generate_problems("train", 6, seed=5)
    spec = {"k": 4, "seed": 7, "template": "r1_zero"}
    key = work_key("fp", spec, 2, problems)
    assert key == work_key("fp", dict(spec), 2, list(problems))  # same inputs, same folder
    edited = problems[:2] + [type(problems[2])(**{**problems[2].to_row(), "answer": "-1",
                                                  "fingerprint": ""})] + problems[3:]
    for other in (work_key("fp2", spec, 2, problems), work_key("fp", {**spec, "k": 8}, 2,
                                                                 problems),
                  work_key("fp", spec, 3, problems), work_key("fp", spec, 2, problems[::-1]),
                  work_key("fp", spec, 2, problems[:-1]), work_key("fp", spec, 2, edited),
                  work_key("fp", spec, 2, problems, chat_template="{{ messages }}")):
        assert other != key


def test_a_shard_file_is_reused_only_when_complete_and_for_the_same_problems(tmp_path):
    problems = generate_problems("train", 3, seed=5)
    rows = [{**_row(problem_key(p), 1), "sampling_key": "sk"} for p in problems]
    path = _shard_file(tmp_path / "shard-000.parquet", rows)
    assert finished_shard(path, problems, "fp", "sk")
    assert not finished_shard(path, problems[::-1], "fp", "sk")  # other order
    assert not finished_shard(path, problems[:2], "fp", "sk")  # other problems
    assert not finished_shard(path, problems, "fp2", "sk")  # other model
    assert not finished_shard(path, problems, "fp", "sk2")  # other sampling
    assert not finished_shard(tmp_path / "shard-001.parquet", problems, "fp", "sk")  # none
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 cut short")
    assert not finished_shard(tmp_path / "bad.parquet", problems, "fp", "sk")


class Killed(Exception):
    """Stands for a SIGKILL: the process ends between the shards and the ingest."""


@pytest.mark.integration
def test_a_killed_sharded_filter_resumes_with_the_shards_it_finished(shard_flows,
                                                                      tiny_model_path,
                                                                      tmp_path):
    problems = generate_problems("train", 8, seed=5)
    with Store.open(tmp_path / "one.duckdb") as store:
        run_filter(tiny_model_path, problems, _cfg(1), store=store)
        expected = _rows(store)
    cfg, db, ws = _cfg(2), tmp_path / "two.duckdb", tmp_path / "ws"
    root = ws / "shards"
    stale = root / "filter-0123456789abcdef"  # a killed run's, under other inputs
    stale.mkdir(parents=True)
    (stale / "shard-000.parquet").write_bytes(b"old")
    (root / "eval-other").mkdir()  # not the filter's: left alone

    opened = []

    def killed_at_ingest():
        opened.append(1)
        if len(opened) > 1:
            raise Killed  # both shards finished, nothing stored
        return Store.open(db)

    with pytest.raises(Killed):
        shard_flows.prefill_estimates(cfg, tiny_model_path, problems, killed_at_ingest, ws)
    work = sorted(root.glob("filter-*"))
    assert len(work) == 1 and work[0] != stale  # this run's folder stays; the stale one went
    work = work[0]
    done, lost = work / "shard-000.parquet", work / "shard-001.parquet"
    assert done.is_file() and lost.is_file()
    lost.unlink()  # as if killed while shard 1 sampled: only its half-written part is left
    (work / "shard-001.parquet.part").write_bytes(b"PAR1 half")
    before = os.stat(done)

    at_ingest = {}

    def watching():
        at_ingest.update({p.name: os.stat(p) for p in work.glob("*.parquet")})
        return Store.open(db)

    fresh = shard_flows.prefill_estimates(cfg, tiny_model_path, problems, watching, ws)
    # Shard 0's file was not written again (estimate_shard's os.replace gives a new inode
    # and mtime), shard 1 ran again.
    kept = at_ingest["shard-000.parquet"]
    assert (kept.st_ino, kept.st_mtime_ns, kept.st_size) == (before.st_ino,
                                                            before.st_mtime_ns,
                                                            before.st_size)
    assert "shard-001.parquet" in at_ingest
    assert fresh == [problem_key(p) for p in problems]
    with Store.open(db) as store:
        assert _rows(store) == expected  # every column but created_at
    assert not work.exists() and not list(root.glob("filter-*"))  # stored: folder removed
    assert (root / "eval-other").is_dir()


# ----------------------------------------------------------------------------- evaluation


def _eval_record(i: int, greedy: bool = True) -> dict:
    rec = {"problem_id": f"p{i}", "source": "synthetic:arith", "level": None if i else 3,
           "subject": None, "gold": str(i)}
    if greedy:
        rec.update(greedy_answer=None if i % 2 else "7", greedy_correct=bool(i % 2),
                   greedy_truncated=True, greedy_well_formatted=False,
                   greedy_completion="<think> ünïcode </think> <answer> 7")
    rec.update(sample_answers=["7", None], sample_correct=[True, False],
               sample_truncated=[False, True], sample_well_formatted=[True, True],
               sample_num_tokens=[3, 12], sample_completions=["a", ""])
    return rec


@pytest.mark.parametrize("greedy", [True, False])
def test_eval_records_round_trip_parquet_exactly(tmp_path, greedy):
    records = [_eval_record(i, greedy) for i in range(3)]
    back = read_records(write_records(records, tmp_path / "r.parquet"))
    assert back == records
    assert [list(r) for r in back] == [list(r) for r in records]  # same keys, same order
    types = lambda rs: [{k: (type(v), [type(x) for x in v] if isinstance(v, list) else None)
                         for k, v in r.items()} for r in rs]
    assert types(back) == types(records)  # bools stay bools, lists stay lists
    assert not list(tmp_path.glob("*.part"))


def test_eval_records_refuse_what_parquet_would_drop(tmp_path):
    with pytest.raises(ValueError, match="without a Parquet type"):
        write_records([{**_eval_record(0), "new_column": 1}], tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="different columns"):
        write_records([_eval_record(0), _eval_record(1, greedy=False)], tmp_path / "b.parquet")


def test_metrics_of_records_read_back_from_shards_are_the_same(tmp_path):
    """The random tiny model below answers nothing right; here the CIs are not all 0."""
    from grpo_core.eval.evaluation import score

    records = []
    for i in range(12):
        rec = _eval_record(i)
        rec.update(level=1 + i % 3, greedy_correct=i % 3 != 0, greedy_well_formatted=i % 2 == 0,
                   sample_correct=[i % 2 == 0, i % 5 == 0], sample_answers=[str(i % 4), "1/2"])
        records.append(rec)
    paths = [write_records(part, tmp_path / f"s{i}.parquet")
             for i, part in enumerate(split(records, 3))]
    back = [r for path in paths for r in read_records(path)]
    assert back == records
    cfg = PipelineConfig()
    cfg.eval.samples, cfg.eval.bootstrap = 2, 200
    metrics = score(records, cfg)
    assert 0 < metrics["greedy_accuracy"]["lo"] < metrics["greedy_accuracy"]["hi"] < 1
    assert _exact(score(back, cfg)) == _exact(metrics)


def _eval_cfg(shards: int, workdir) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.project.workdir = str(workdir)
    cfg.project.seed = 11
    cfg.rollout.backend = "hf"
    cfg.rollout.batch_size = 8  # 12 prompts batch as 8+4 here, 6 per shard: other shapes
    cfg.model.template = "r1_zero"
    cfg.eval.samples = 2
    cfg.eval.max_new_tokens = 10
    cfg.eval.bootstrap = 200
    cfg.eval.shards = shards
    return cfg



def _prefill_in_a_flow(shard_flows, model: str, cfg, problems, db, ws):
    """As in the pipeline: the sharded filter flow runs from inside a task of an outer flow."""
    from prefect import flow, task

    @task(name="filter")
    def filter_task():
        return shard_flows.prefill_estimates(cfg, model, problems, lambda: Store.open(db), ws)

    @flow(name="pipeline-like")
    def outer():
        return filter_task()

    return outer()


def _eval_in_a_flow(shard_flows, model: str, cfg, db, ws, limit: int):
    """As in the pipeline: the sharded eval flow runs from inside the evaluate task of a flow."""
    from prefect import flow, task

    from grpo_core.eval.evaluation import evaluate_benchmark

    @task(name="evaluate")
    def eval_task():
        with Store.open(db) as store:
            return evaluate_benchmark(model, "synthetic", cfg, store=store, limit=limit,
                            scorer=shard_flows.eval_scorer(ws))

    @flow(name="pipeline-like")
    def outer():
        return eval_task()

    return outer()


def _exact(value) -> str:
    """Every number to the last bit (repr), NaN included, in one comparable string."""
    return json.dumps(value, sort_keys=True)


@pytest.mark.integration
def test_sharded_eval_gives_the_unsharded_records_and_metrics(shard_flows, tiny_model_path,
                                                              tmp_path):
    from grpo_core.data.records import read_eval_results, read_eval_runs
    from grpo_core.eval.evaluation import evaluate_benchmark

    with Store.open(tmp_path / "one.duckdb") as store:
        one = evaluate_benchmark(tiny_model_path, "synthetic", _eval_cfg(1, tmp_path), store=store,
                       limit=12)
    assert len(one.per_problem) == 12
    # Not a vacuous comparison: every problem's sampled completions are its own.
    assert len({tuple(r["sample_completions"]) for r in one.per_problem}) == 12

    cfg, db = _eval_cfg(2, tmp_path), tmp_path / "two.duckdb"
    two = _eval_in_a_flow(shard_flows, tiny_model_path, cfg, db, tmp_path / "ws", limit=12)
    assert two.per_problem == one.per_problem  # every record, in order, types included
    assert _exact(two.per_problem) == _exact(one.per_problem)
    assert _exact(two.metrics) == _exact(one.metrics)  # every number, CIs included
    assert (two.protocol_hash, two.protocol) == (one.protocol_hash, one.protocol)
    assert two.model_fingerprint == one.model_fingerprint
    assert not list((tmp_path / "ws" / "shards").iterdir())  # shard files cleaned up

    # Stored alike: one run, its rows (but for the run id) and its metrics.
    drop = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]
    with Store.open(tmp_path / "one.duckdb", read_only=True) as a, \
            Store.open(db, read_only=True) as b:
        assert drop(read_eval_results(b)) == drop(read_eval_results(a))
        runs_a, runs_b = read_eval_runs(a), read_eval_runs(b)
    assert len(runs_b) == 1 and runs_b[0]["n_problems"] == 12
    assert _exact(runs_b[0]["metrics"]) == _exact(runs_a[0]["metrics"])
