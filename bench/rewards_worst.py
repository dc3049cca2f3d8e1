"""Worst-case latency of every reward over the hostile corpus (tests/hostile_corpus.py).

    .venv/bin/python bench/rewards_worst.py [--threads 4]

Each completion is scored alone (one call per completion), from the main thread and then
from a thread pool, and the slowest calls are printed per reward. The bound to hold is
1 s per completion; no canary file may appear.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hostile_corpus import hostile_completions

from grpo_core.answers import clear_caches, warm_up
from grpo_core.rewards import REWARDS

GOLDS = ["5", "\\frac{1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)"]


def timed(name: str, completion: str, gold: str) -> float:
    start = time.perf_counter()
    REWARDS[name]([completion], answer=[gold], prompts=["Q: <think>"])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--top", type=int, default=3, help="slowest inputs shown per reward")
    args = ap.parse_args()
    warm_up()
    canary = Path(tempfile.mkdtemp()) / "CANARY"
    corpus = hostile_completions(str(canary))
    jobs = [
        (n, label, c, GOLDS[i % len(GOLDS)]) for n in REWARDS for i, (label, c) in enumerate(corpus)
    ]
    print(f"{len(corpus)} hostile completions x {len(REWARDS)} rewards, golds {GOLDS}")
    for mode in ("main thread", f"{args.threads} threads"):
        clear_caches()  # each pass recomputes every verdict
        start = time.perf_counter()
        if mode == "main thread":
            times = [timed(n, c, g) for n, _, c, g in jobs]
        else:
            with ThreadPoolExecutor(args.threads) as pool:
                times = list(pool.map(lambda j: timed(j[0], j[2], j[3]), jobs))
        print(f"\n== {mode}: {time.perf_counter() - start:.1f} s in all")
        print(f"{'reward':20} {'max s':>7} {'p99 s':>7} {'mean ms':>8}  slowest inputs")
        for name in REWARDS:
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
