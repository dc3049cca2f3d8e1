"""The difficulty filter as the recipes ran it before and as they run it now, side by side.

    GRPO_WORKDIR=.grpo .venv/bin/python bench/filter_speed.py [--model PATH] [--problems 600]
        [--repeats 2]

Both sides estimate the same synthetic problems (levels 1-3, as the recipes' pool) under the
same model, seed and sampling (configs/recipes/r1_zero.yaml's filter: k 8, T 1.0, band
[1/8, 7/8], 40 new tokens), each from an empty store, in this process:
1. before: fixed k, `rollout.batch_size` 64 (the default);
2. now: `filter.adaptive: exact` in rounds of 2 (a problem stops once no later sample could
   change its class) at `rollout.batch_size` 256, as configs/quickstart.yaml sets them.
The sides alternate --repeats times; printed: seconds, samples drawn, kept, the ratio of
the medians, and whether both kept the same problems (asserted: the exact rule keeps what
fixed k keeps). --model takes a checkpoint folder: the saving grows with the share of
problems in band (the SFT model's 63% against the base's 15%). The load average is printed.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from harness import ROOT, load, resolved_model, timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--problems", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    from grpo_core.config import load_config
    from grpo_core.data.store import Store
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter

    path = resolved_model(args.model)
    problems = [p for p in generate_problems("train", 3 * args.problems, seed=123)
                if p.level <= 3][: args.problems]

    def cfg(now: bool):
        c = load_config(ROOT / "configs/recipes/r1_zero.yaml")
        c.rollout.backend = "hf"
        c.rollout.batch_size = 256 if now else 64
        c.filter.adaptive = "exact" if now else False
        c.filter.adaptive_start = c.filter.adaptive_step = 2
        return c

    tmp = Path(tempfile.mkdtemp(prefix="bench-filter-speed-"))
    sides = {"before: fixed k, batch 64": cfg(False), "now: exact, batch 256": cfg(True)}
    runs: dict[str, list] = {name: [] for name in sides}
    print(f"model {args.model} ({path}); {len(problems)} problems, levels 1-3; "
          f"load average at start {load()}")
    for rep in range(args.repeats):
        for name, c in sides.items():
            with Store.open(tmp / f"{rep}-{len(runs[name])}-{name[:3]}.duckdb") as store:
                report, secs = timed(lambda: run_filter(path, problems, c, store=store))
            runs[name].append((secs, report))
            print(f"  {name}: {secs:.1f} s, {report.sampled} samples, kept "
                  f"{len(report.kept)}; load {load()}")
    (before, b), (now, n) = runs.items()
    kept = {name: [p.id for p in reps[0][1].kept] for name, reps in runs.items()}
    same = kept[before] == kept[now]
    tb, tn = (statistics.median(s for s, _ in reps) for reps in (b, n))
    print("\n| side | median s | samples | kept |\n|---|---|---|---|")
    for name, reps in runs.items():
        secs = statistics.median(s for s, _ in reps)
        print(f"| {name} | {secs:.1f} | {reps[0][1].sampled} | {len(reps[0][1].kept)} |")
    print(f"before / now: {tb / tn:.2f}x wall, {b[0][1].sampled / n[0][1].sampled:.2f}x samples; "
          f"same kept problems: {same}; load {load()}")
    assert same, "the exact rule kept other problems than fixed k"


if __name__ == "__main__":
    main()
