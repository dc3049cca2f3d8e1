"""The difficulty filter unsharded against filter.shards workers, side by side in one run.

    GRPO_WORKDIR=.grpo .venv/bin/python bench/filter_shards.py [--problems 128] [--k 8] [--shards 2]

Every side starts from an empty store and estimates the same problems with the same seed:
1. unsharded: run_filter in this process, with torch's default of one thread per usable
   core (what the pipeline does without $GRPO_TORCH_THREADS), and with one thread;
2. sharded: the `sharded-filter` Prefect flow (flows/shards.py) on a process pool of
   --shards workers (cores // shards torch threads each), the Parquet files ingested in
   one transaction, then run_filter finding every estimate stored.
Each wall time includes loading the model (a worker also spawns, imports torch and
Prefect, and loads its own copy). Prefect's temporary local server is started before
timing and reported apart: a pipeline run starts it once, whatever the filter does.
Asserts that every side stored the same pass-rate rows (every column but created_at).

The built-in model is cached under $GRPO_WORKDIR/models (built once, ~2-3 min on 2 cores).
On a shared machine the numbers move with the load: the load average is printed.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

from harness import ROOT, load, resolved_model, timed  # noqa: F401 - also puts the repo root on sys.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--problems", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from flows import configure_prefect

    tmp = Path(tempfile.mkdtemp(prefix="bench-shards-"))
    atexit.register(shutil.rmtree, tmp, True)  # runs after Prefect stops its server (LIFO)
    configure_prefect(tmp)  # Prefect's home (and its temporary server's DB) in a temp folder

    from flows.shards import prefill_estimates, workers_share_the_api
    from grpo_core.config import PipelineConfig
    from grpo_core.data.records import read_pass_rates
    from grpo_core.data.store import Store
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter
    from grpo_core.eval.shards import usable_cores, worker_threads

    cores = usable_cores()
    path = resolved_model(args.model)
    problems = generate_problems("train", args.problems, seed=123)

    def cfg(shards: int) -> PipelineConfig:
        c = PipelineConfig()
        c.rollout.backend = "hf"
        c.rollout.batch_size = args.batch_size
        c.filter.k = args.k
        c.filter.shards = shards
        c.project.seed = args.seed
        return c

    def rows(db: Path) -> list[dict]:
        with Store.open(db) as store:
            return [{k: v for k, v in r.items() if k != "created_at"}
                    for r in read_pass_rates(store)]

    def unsharded(db: Path, threads: int):
        os.environ["GRPO_TORCH_THREADS"] = str(threads)  # applied when the model loads
        with Store.open(db) as store:
            return run_filter(path, problems, cfg(1), store=store)

    def sharded(db: Path):
        c = cfg(args.shards)
        fresh = prefill_estimates(c, path, problems, lambda: Store.open(db), tmp)
        with Store.open(db) as store:
            return run_filter(path, problems, c, store=store, fresh=fresh)

    def start_server():
        with workers_share_the_api():  # starts Prefect's temporary server
            pass

    print(f"model {args.model} ({path}); {len(problems)} problems x k={args.k}, "
          f"max {cfg(1).rollout.max_new_tokens} new tokens, batch {args.batch_size}")
    print(f"usable cores {cores}; load average (1/5/15 min) at start {load()}")
    _, t_server = timed(start_server)
    print(f"Prefect temporary server start: {t_server:.1f} s (not counted below)")

    per_worker = worker_threads(args.shards, cores)
    sides = [(f"unsharded, {cores} threads", str(cores), lambda db: unsharded(db, cores))]
    if cores > 1:
        sides.append(("unsharded, 1 thread", "1", lambda db: unsharded(db, 1)))
    sides.append((f"{args.shards} shards (process pool)", f"{args.shards}x{per_worker}",
                  sharded))
    results = []
    for i, (label, threads, fn) in enumerate(sides):
        t0 = time.perf_counter()
        db = tmp / f"side-{i}.duckdb"
        report = fn(db)
        secs = time.perf_counter() - t0
        results.append((label, threads, report, secs, rows(db), load()))

    print()
    print(f"{'difficulty filter':<32} {'seconds':>8} {'estimated':>10} {'reused':>7} "
          f"{'threads':>8}  load after")
    for label, threads, report, secs, _, after in results:
        print(f"{label:<32} {secs:8.2f} {report.estimated:10d} {report.reused:7d} "
              f"{threads:>8}  {after}")
    t_sharded, expected = results[-1][3], results[0][4]
    for label, _, _, secs, _, _ in results[:-1]:
        print(f"{label} / sharded: {secs / t_sharded:.2f}x wall time")
    same = all(r[4] == expected for r in results)
    print(f"identical rows on every side: {same}; counts {results[-1][2].counts}")
    assert same, "sharded rows differ from the unsharded ones"
    for _, _, report, _, _, _ in results:
        assert (report.estimated, report.reused) == (len(expected), 0)
        assert report.counts == results[0][2].counts


if __name__ == "__main__":
    main()
