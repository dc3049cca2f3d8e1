"""SIGKILL `grpo run` at three points (during the difficulty filter, during a GRPO round
after a checkpoint, during an evaluation), re-run it each time, and compare with
an uninterrupted run of the same config and seed: the same DuckDB rows (no duplicates),
the same final metrics, one parent MLflow run. During the uninterrupted run a second
pipeline on the same store waits for `data.store_lock_timeout`, exits with a clear
message and changes nothing (the uninterrupted run's rows are the reference). Real processes, real Prefect/MLflow/DuckDB, a tiny random model."""
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from pipeline_runs import GRPO, ROOT, mlflow_runs, run_env, run_names, write_config

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

TIMEOUT = 900


def _start(cfg: Path, workdir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([GRPO, "run", str(cfg), "--quiet", *args], env=run_env(workdir),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, (out + err)[-4000:]
    return out


def _watch(proc: subprocess.Popen, workdir: Path, on_stage=None) -> dict[str, float]:
    """Run to the end, noting when each MLflow child run first appears (stage starts);
    `on_stage(name)` is called once per new stage."""
    seen: dict[str, float] = {}
    t0 = time.monotonic()
    while proc.poll() is None:
        for name in run_names(workdir) - seen.keys():
            seen[name] = time.monotonic() - t0
            if on_stage:
                on_stage(name)
        time.sleep(0.1)
    seen["end"] = time.monotonic() - t0
    return seen


def _kill_when(cfg: Path, workdir: Path, ready, delay: float) -> None:
    proc = _start(cfg, workdir)
    deadline = time.monotonic() + TIMEOUT
    try:
        while not ready():
            assert proc.poll() is None, f"run ended before the kill point: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(delay)
        assert proc.poll() is None, "run ended before the kill"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL


def _round_dirs(workdir: Path) -> list[Path]:
    return sorted((workdir / "checkpoints").glob("*/grpo-*"), key=lambda p: p.stat().st_ctime)


def _checkpoint_in_round_one(workdir: Path, step: int) -> bool:
    rounds = _round_dirs(workdir)
    return bool(rounds) and (rounds[0] / f"checkpoint-{step}" / "trainer_state.json").is_file()


def _parent_status(workdir: Path) -> str:
    with sqlite3.connect(f"file:{workdir / 'mlflow.db'}?mode=ro", uri=True) as con:
        return con.execute("SELECT status FROM runs r WHERE NOT EXISTS (SELECT 1 FROM tags t "
                           "WHERE t.run_uuid = r.run_uuid AND t.key = 'mlflow.parentRunId')"
                           ).fetchone()[0]


def _metric_count(workdir: Path, stage: str) -> int:
    with sqlite3.connect(f"file:{workdir / 'mlflow.db'}?mode=ro", uri=True) as con:
        return con.execute("SELECT count(*) FROM metrics m JOIN tags t ON m.run_uuid = t.run_uuid "
                           "WHERE t.key = 'grpo.stage' AND t.value = ?", [stage]).fetchone()[0]


def _store_rows(workdir: Path) -> dict[str, list]:
    """Every table's content, minus run ids and timestamps (they differ between runs)."""
    q = {
        "problems": "SELECT source, split, fingerprint, problem, answer FROM problems",
        "quarantine": "SELECT source, split, row_index, code FROM quarantine",
        "pass_rates": "SELECT model_fingerprint, problem_id, sampling_key, k, successes, "
                      "truncated FROM pass_rates",
        "rollouts": "SELECT round, step, idx, problem_id, completion, reward, advantage "
                    "FROM rollouts",
        "eval_results": "SELECT protocol_hash, model_fingerprint, problem_id, greedy_answer, "
                        "greedy_correct, sample_answers FROM eval_results",
        "eval_runs": "SELECT protocol_hash, benchmark, model_fingerprint, n_problems, metrics "
                     "FROM eval_runs",
    }
    with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert tables >= set(q), tables
        dup = con.execute("SELECT count(*) FROM (SELECT run_id, step, idx FROM rollouts "
                          "GROUP BY ALL HAVING count(*) > 1)").fetchone()[0]
        assert dup == 0, f"{dup} duplicated rollout rows in {workdir}"
        rows = {t: sorted(con.execute(sql).fetchall(), key=repr) for t, sql in q.items()}
    # the timing inside an eval's metrics differs run to run
    rows["eval_runs"] = [(*r[:4], _without_seconds(r[4])) for r in rows["eval_runs"]]
    return rows


def _without_seconds(metrics_json: str) -> str:
    m = json.loads(metrics_json)
    return json.dumps({k: v for k, v in m.items() if "second" not in k}, sort_keys=True)


def _final_metrics(workdir: Path) -> dict[str, float]:
    _, runs = mlflow_runs(workdir)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, f"{len(parents)} parent runs in {workdir}"
    assert parents[0].info.status == "FINISHED"
    return {k: v for k, v in parents[0].data.metrics.items() if k.startswith("final/")}


def test_sigkill_at_three_points_matches_an_uninterrupted_run(tiny_model_path, tmp_path):
    cfg = write_config(
        tmp_path, tiny_model_path, max_steps=4,
        filter={"k": 4, "max_problems": 32},
        rollout={"batch_size": 4, "max_new_tokens": 16},
        eval={"benchmarks": ["synthetic"], "limit": 48, "samples": 4, "max_new_tokens": 16,
              "bootstrap": 50})

    ref = tmp_path / "ref"
    # Once the reference run holds the store (its first stage has started), a second
    # pipeline on the same store starts; it must wait 3 s for the store, give up with a
    # clear message and change nothing. At the first stage, not later: the second process's
    # start-up (imports, Prefect's server) must end while the reference still runs, and on
    # a loaded machine the reference's last stages took less than that.
    other: dict = {}

    def contend(stage: str) -> None:
        if "proc" not in other:
            other["t0"] = time.monotonic()
            other["proc"] = subprocess.Popen(
                [GRPO, "run", str(cfg), "--quiet", "--set", "data.store_lock_timeout=3"],
                env=run_env(ref), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True)

    stages = _watch(proc := _start(cfg, ref), ref, contend)
    _finish(proc)
    out, err = other["proc"].communicate(timeout=TIMEOUT)
    print(f"second pipeline: exit {other['proc'].returncode}: {err.strip()}")
    assert other["proc"].returncode == 1 and "in use by another pipeline" in err, out + err
    assert str(ref / "store.duckdb") in err and f"pid {proc.pid}" in err and "Traceback" not in err
    filter_s = stages["grpo/round-1"] - stages["filter/round-1"]
    eval_s = stages["filter/round-2"] - stages["eval/round-1"]
    print(f"uninterrupted: {stages['end']:.0f} s, filter {filter_s:.1f} s, eval after round 1 {eval_s:.1f} s")

    wd = tmp_path / "killed"
    # 1. during the filter: it started, and it never finished (GRPO never started)
    _kill_when(cfg, wd, lambda: "filter/round-1" in run_names(wd), delay=filter_s * 0.4)
    assert "grpo/round-1" not in run_names(wd), "the kill came after the filter"
    # 2. during GRPO round 1, after its checkpoint-2 (of 4)
    _kill_when(cfg, wd, lambda: _checkpoint_in_round_one(wd, 2), delay=0.0)
    assert not (_round_dirs(wd)[0] / "final").exists(), "the kill came after round 1"
    # 3. during the evaluation after round 1: it started, and logged nothing. (Not
    # eval/final: it evaluates the round-2 model under eval/round-2's protocol, a cache hit.)
    _kill_when(cfg, wd, lambda: "eval/round-1" in run_names(wd), delay=min(0.5, eval_s / 4))
    assert _metric_count(wd, "eval/round-1") == 0, "the kill came after the evaluation"
    assert _parent_status(wd) == "RUNNING"

    _finish(_start(cfg, wd))  # the last re-run, to the end

    with duckdb.connect(str(wd / "store.duckdb")) as con:  # integrity: replays the WAL,
        con.execute("CHECKPOINT")  # rewrites every block; raises on a corrupt file
    with duckdb.connect(str(ref / "store.duckdb")) as con:  # the contended store too
        con.execute("CHECKPOINT")
    got, want = _store_rows(wd), _store_rows(ref)
    for table in want:
        assert len(got[table]) == len(want[table]), (table, len(got[table]), len(want[table]))
        assert got[table] == want[table], f"{table} differs from the uninterrupted run"
    assert _final_metrics(wd) == _final_metrics(ref)
    print({t: len(v) for t, v in want.items()})
