"""`grpo eval` does not hold the DuckDB store's write lock while it generates (issue 24
item 5): another process writes to the store while an eval runs, and the eval's results
still land at the end; the lock error names what does work (no `--db` on `grpo eval`).
Real DuckDB files, a real `grpo eval` process on a tiny random model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from grpo_core.data.records import read_eval_runs
from grpo_core.data.store import Store, StoreLockedError

pytest_plugins = ["fixtures_models"]
ROOT = Path(__file__).resolve().parents[1]
HOLD_LOCK = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
             "print('ready', flush=True); time.sleep(60)")


def _eval_argv(model: str, workdir: Path) -> list[str]:
    return ["eval", "--model", model, "--benchmark", "synthetic", "--limit", "12",
            "--samples", "4", "--workdir", str(workdir), "--json",
            "--set", "eval.max_new_tokens=48"]


def test_another_process_writes_while_eval_runs(tiny_model_path, tmp_path) -> None:
    workdir = tmp_path / "ws"
    db = workdir / "store.duckdb"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GRPO_TORCH_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *_eval_argv(tiny_model_path, workdir)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    writes = 0
    try:
        while proc.poll() is None:
            # The store file appears when eval first opens it; from then on, under the old
            # code, eval held the write lock until it exited.
            if db.exists():
                try:
                    with Store.open(db) as store:  # no wait: the lock is free or it is not
                        store.con.execute("CREATE TABLE IF NOT EXISTS other_writer (t DOUBLE)")
                        store.con.execute("INSERT INTO other_writer VALUES (?)", [time.time()])
                        # before the eval's results exist: while it loads and generates
                        writes += not read_eval_runs(store)
                except StoreLockedError:
                    pass
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert writes > 0, "the store stayed locked from the eval's first open to its results"
    result = json.loads(out)
    with Store.open(db, read_only=True) as store:
        runs = read_eval_runs(store)
        assert [r["run_id"] for r in runs] == [result["run_id"]]  # its results, written at the end
        assert store.con.execute("SELECT count(*) FROM other_writer").fetchone()[0] >= writes
    assert result["metrics"]["greedy_accuracy"] is not None


def test_lock_error_names_what_works(tiny_model_path, tmp_path) -> None:
    workdir = tmp_path / "ws"
    db = workdir / "store.duckdb"
    Store.open(db).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        res = CliRunner().invoke(app, _eval_argv(tiny_model_path, workdir))
    finally:
        holder.kill()
        holder.wait()
    assert res.exit_code == 1, res.output
    msg = res.output
    assert f"locked by another process (PID {holder.pid})" in msg
    assert "--workdir DIR or GRPO_WORKDIR" in msg and "another --db" not in msg
