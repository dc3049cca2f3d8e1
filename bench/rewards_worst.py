"""Worst-case latency of every reward, and of the evaluation scorer, over the hostile corpus
(tests/hostile_corpus.py).

    .venv/bin/python bench/rewards_worst.py [--threads 4] [--processes 2]

Each completion is scored alone (one call per completion), from the main thread, then from
a thread pool (there one scorer after another, each with cold answer caches), then from a
pool of spawned worker processes, and the slowest calls are printed per scorer: each
reward of grpo_core.verify.rewards.REWARDS plus `evaluation` (grpo_core.eval.evaluation's
scoring of a sample: extraction, verification, format flag, maj@k's vote_key). The bound to hold is
1 s per completion; no canary file may appear.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from harness import ROOT, machine_line  # noqa: E402 - also the repository root on sys.path

sys.path.insert(0, str(ROOT / "tests"))  # the hostile corpus the fuzz test uses

from hostile_corpus import (
    GOLDS,
    fuzz_jobs,
    hostile_completions,
    init_worker,
    scorer_names,
    time_chunk,
    timed_call,
)

from grpo_core.verify.answers import clear_caches
from grpo_core.verify.math_verify_adapter import warm_up


def run_pass(mode: str, jobs: list, canary: str, workers: int) -> list[float]:
    if mode in ("main", "threads"):  # one scorer at a time, each starting with cold caches
        times: list[float] = []
        with ThreadPoolExecutor(workers) as pool:
            for name in scorer_names():
                clear_caches()
                group = [j for j in jobs if j[0] == name]  # jobs are ordered by scorer
                if mode == "main":
                    times += [timed_call(n, c, g) for n, _, c, g in group]
                else:
                    times += pool.map(lambda j: timed_call(j[0], j[2], j[3]), group)
        return times
    clear_caches()
    times = [0.0] * len(jobs)
    chunks = 8 * workers  # only job indices and timings cross the process boundary
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker) as pool:
        for part in pool.map(time_chunk, [canary] * chunks, range(chunks), [chunks] * chunks):
            for i, t in part:
                times[i] = t
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--processes", type=int, default=2, help="worker processes (0: skip)")
    ap.add_argument("--top", type=int, default=3, help="slowest inputs shown per scorer")
    args = ap.parse_args()
    print(machine_line())
    warm_up()
    canary = Path(tempfile.mkdtemp()) / "CANARY"
    corpus = hostile_completions(str(canary))
    jobs = fuzz_jobs(str(canary))
    names = scorer_names()
    print(f"{len(corpus)} hostile completions x {len(names)} scorers, golds {GOLDS}")
    modes = [("main", "main thread", 1), ("threads", f"{args.threads} threads", args.threads)]
    if args.processes:
        modes.append(("processes", f"{args.processes} processes (spawn)", args.processes))
    for mode, title, workers in modes:
        start = time.perf_counter()
        times = run_pass(mode, jobs, str(canary), workers)
        print(f"\n== {title}: {time.perf_counter() - start:.1f} s in all")
        print(f"{'scorer':20} {'max s':>7} {'p99 s':>7} {'mean ms':>8}  slowest inputs")
        for name in names:
            rows = sorted(
                ((t, label) for t, (n, label, _, _) in zip(times, jobs) if n == name), reverse=True
            )
            ts = sorted(t for t, _ in rows)
            p99 = ts[int(0.99 * (len(ts) - 1))]
            slow = ", ".join(f"{label} {t:.2f}" for t, label in rows[: args.top])
            print(f"{name:20} {ts[-1]:7.3f} {p99:7.3f} {1000 * sum(ts) / len(ts):8.1f}  {slow}")
    print(f"\ncanary created: {canary.exists()}")


if __name__ == "__main__":
    main()
