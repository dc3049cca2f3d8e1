"""No memory crosses a stage or a round (issue 23 item 3): with train.stage_process=always a
two-round `grpo run` (a real subprocess: temporary Prefect server, MLflow on SQLite, DuckDB,
TRL steps on a tiny random model) runs every stage that holds a model in a process of its
own, started by tasks/launch.py. Each of those processes has exited when the run ends (their
pids, from <workspace>/logs/stage-processes.jsonl, are gone; exit codes 0), and the pipeline
process's own RSS after round 2 (system/pipeline_rss_gb on the parent run, step = round) is
within RSS_MARGIN_GB of its RSS after round 1. And where a stage runs changes nothing it
computes: a filter and an eval in their own process store what the in-process ones store."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import test_shards
from pipeline_runs import GRPO, ROOT, mlflow_runs, run_env, write_config

from grpo_core.config import ConfigError, PipelineConfig, config_from_dict
from tasks.launch import launch_plan

pytest_plugins = ["fixtures_models"]

# What the pipeline process may grow by between rounds: Prefect's and MLflow's bookkeeping
# of one more round (task runs, run ids, the stage cache's entries), never a model. The tiny
# model's trainer alone costs ~250 MB in a process that holds it (FIELD-NOTES: ~560 MiB RSS
# for a GRPO step against ~300 MB for the libraries).
RSS_MARGIN_GB = 0.05


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is gone for memory's sake; /proc says which
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_stage_process_is_validated_by_name():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"train": {"stage_process": "sometimes"}})
    assert "train.stage_process" in str(err.value)


def test_own_process_turns_an_in_process_stage_into_a_launch():
    assert launch_plan(0, 1).mode == "in-process"
    assert launch_plan(0, 1, own_process=True).mode == "launch"
    assert launch_plan(1, 1, own_process=False).mode == "in-process"
    assert launch_plan(1, 1, own_process=True).mode == "launch"
    # what the hardware forces is kept: pinned stays pinned, a refusal stays a refusal
    assert launch_plan(2, 1, own_process=True).mode == "pinned"
    assert launch_plan(1, 2, own_process=True).mode == "refuse"


def test_two_rounds_with_a_process_per_stage_leave_nothing_behind(tiny_model_path, tmp_path):
    workdir = tmp_path / "ws"
    cfg = write_config(tmp_path, tiny_model_path, max_steps=2,
                       train={"stage_process": "always"},
                       filter={"k": 2, "max_problems": 8, "refilter_each_round": False})
    r = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=run_env(workdir), cwd=ROOT,
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    log = workdir / "logs" / "stage-processes.jsonl"
    procs = [json.loads(line) for line in log.read_text().splitlines()]
    # eval/base, filter/round-1, grpo/round-1, eval/round-1, probe/round-1 (the start model
    # and the round's, each scored in an eval process), grpo/round-2, eval/round-2,
    # probe/round-2 (eval/final is eval/round-2's, cached: same model, same protocol)
    probe = ["eval", "eval"]
    assert [p["stage"] for p in procs] == ["eval", "filter", "grpo", "eval", *probe,
                                           "grpo", "eval", *probe]
    for p in procs:
        assert p["exit_code"] == 0, p
        assert p["rank0_pid"] == p["launcher_pid"], p  # one plain process, no launcher
        assert not _alive(p["launcher_pid"]) and not _alive(p["rank0_pid"]), p
    assert len({p["rank0_pid"] for p in procs}) == len(procs)  # a new process each time

    client, runs = mlflow_runs(workdir)
    parent = next(x for x in runs if "mlflow.parentRunId" not in x.data.tags)
    rss = {m.step: m.value for m in client.get_metric_history(parent.info.run_id,
                                                                "system/pipeline_rss_gb")}
    assert set(rss) == {1, 2}, rss
    print(f"pipeline RSS after round 1 {rss[1]:.3f} GB, after round 2 {rss[2]:.3f} GB")
    assert abs(rss[2] - rss[1]) <= RSS_MARGIN_GB, rss


def test_a_stage_process_peak_counts_in_the_pipeline_stage():
    """A stage's own process reports its CUDA peak (tasks/launch.py): the pipeline's
    stage_memory block keeps it, though this process never touched CUDA (here: the CPU)."""
    from grpo_core.modeling.gpu import report_child_peak, stage_memory

    with stage_memory() as outer:
        with stage_memory() as inner:
            report_child_peak(1.5)
        report_child_peak(None)  # a CPU stage process reports nothing
    assert inner.peak_gb == 1.5 and outer.peak_gb == 1.5
    with stage_memory() as alone:
        pass
    assert alone.peak_gb is None


def _own(cfg: PipelineConfig, stage_process: str, workdir) -> PipelineConfig:
    cfg.train.stage_process = stage_process
    cfg.project.workdir = str(workdir)
    return cfg


@pytest.mark.integration
def test_filter_and_eval_in_their_own_process_give_the_in_process_results(
        shard_flows, tiny_model_path, tmp_path):
    """Where a stage runs changes nothing it computes: the filter's stored estimates and an
    evaluation's records and metrics are those of the in-process stage; the process that
    computed them is logged, exited 0 and gone; this process stays the only DuckDB writer."""
    from flows.prefill import prefill_sharded
    from grpo_core.data.records import read_pass_rates
    from grpo_core.data.store import Store
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter
    from grpo_core.eval.evaluation import evaluate_benchmark

    problems = generate_problems("train", 6, seed=5)
    rows = lambda store: [{k: v for k, v in r.items() if k != "created_at"}
                          for r in read_pass_rates(store)]
    ws = tmp_path / "ws"
    # test_shards' configs (one shard): sharding and stage processes share the worker path
    here, own = (_own(test_shards._cfg(1), mode, ws) for mode in ("never", "always"))
    ev_here, ev_own = (_own(test_shards._eval_cfg(1, ws), mode, ws) for mode in ("never", "always"))
    with Store.open(tmp_path / "one.duckdb") as store:
        one = run_filter(tiny_model_path, problems, here, store=store)
        expected = rows(store)
        ev_one = evaluate_benchmark(tiny_model_path, "synthetic", ev_here, store=store, limit=6)
    db = tmp_path / "two.duckdb"
    fresh = prefill_sharded(own, tiny_model_path, lambda: problems, lambda: Store.open(db), ws,
                            own_process=True)
    assert len(fresh) == 6
    with Store.open(db) as store:
        two = run_filter(tiny_model_path, problems, own, store=store, fresh=fresh)
        assert rows(store) == expected
        ev_two = evaluate_benchmark(tiny_model_path, "synthetic", ev_own, store=store, limit=6,
                          scorer=shard_flows.eval_scorer(ws))
    assert two.counts == one.counts and two.estimated == 6
    assert ev_two.per_problem == ev_one.per_problem and ev_two.metrics == ev_one.metrics
    procs = [json.loads(line) for line in
             (ws / "logs" / "stage-processes.jsonl").read_text().splitlines()]
    assert [p["stage"] for p in procs] == ["filter", "eval"]
    assert all(p["exit_code"] == 0 and not _alive(p["rank0_pid"]) for p in procs), procs
