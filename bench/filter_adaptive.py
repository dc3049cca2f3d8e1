"""The adaptive difficulty filter against fixed k, side by side in one run (issue 15).

    GRPO_WORKDIR=.grpo .venv/bin/python bench/filter_adaptive.py [--problems 256] [--k 16]
        [--gsm8k 32] [--gsm8k-model builtin:tiny-arith] [--threads 1]

For each problem set, the synthetic task (--problems) and GSM8K train problems (--gsm8k,
read from --data-dir, default $GRPO_DATA_DIR or ../shared/data; skipped when absent):
1. fixed: every problem draws k samples (filter.k);
2. adaptive: filter.adaptive with k as the cap (filter.adaptive_start / _step /
   _confidence at their defaults unless given), drawn in rounds until the interval decides.
Same model (loaded once, not timed), seed, template and band; no store, and the answer
checker's caches are cleared before each side, so neither reuses the other's work.
Prints the samples each side drew, the per-problem agreement of the band decision
(too_easy / in_band / too_hard), the kept sets, the wall times, and checks that every
adaptive estimate's outcomes are the first ones of the fixed estimate's (same seeds).

Then a replay: because an adaptive estimate's samples are a prefix of the fixed one's,
the fixed outcomes give exactly what other adaptive settings (and other bands,
--replay-band: one that suits a weak model's low pass rates) would have drawn and
decided, without sampling again (the table under each set). The built-in models solve
few of these problems, so a last replay (--simulate N, no model) draws binomial outcomes
for N problems with pass rates spread uniformly over [0, 1]: the rule where many
problems sit inside or near the band.

Targets (issue 15): adaptive samples <= 50% of fixed; >= 90% of problems classified the
same. On a shared machine wall times move with the load: the load average is printed.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from common import ROOT, load, timed

REPLAY = [(4, 4, 0.8), (2, 2, 0.8), (4, 2, 0.8), (4, 4, 0.7), (4, 4, 0.9), (4, 4, 0.95)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--problems", type=int, default=256, help="synthetic problems (0: skip)")
    ap.add_argument("--gsm8k", type=int, default=32, help="GSM8K train problems (0: skip)")
    ap.add_argument("--gsm8k-model", default=None, help="default: --model")
    ap.add_argument("--data-dir", default=os.environ.get("GRPO_DATA_DIR")
                    or str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--band", type=float, nargs=2, default=(0.3, 0.7))
    ap.add_argument("--replay-band", type=float, nargs=2, action="append",
                    help="also replay under this band (repeatable) [default 0.05 0.3]")
    ap.add_argument("--start", type=int, default=None, help="filter.adaptive_start")
    ap.add_argument("--step", type=int, default=None, help="filter.adaptive_step")
    ap.add_argument("--confidence", type=float, default=None, help="filter.adaptive_confidence")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (one is fastest on a busy 2-core machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simulate", type=int, default=2000,
                    help="problems of the simulated replay (0: skip)")
    args = ap.parse_args()
    args.replay_band = [tuple(b) for b in (args.replay_band or [(0.05, 0.3)])]
    os.environ["GRPO_TORCH_THREADS"] = str(args.threads)  # read when the model loads

    from grpo_core.data.synthetic import generate_problems

    print(f"load average (1/5/15 min) at start {load()}; torch threads {args.threads}")
    sets = []
    if args.problems:
        sets.append(("synthetic:arith", args.model,
                     lambda: generate_problems("train", args.problems, seed=123)))
    data = Path(args.data_dir) / "gsm8k"
    if args.gsm8k and (data / "train.jsonl").is_file():
        sets.append(("gsm8k (train)", args.gsm8k_model or args.model,
                     lambda: _gsm8k(args.data_dir, args.gsm8k)))
    elif args.gsm8k:
        print(f"GSM8K skipped: no {data / 'train.jsonl'} (--data-dir or $GRPO_DATA_DIR)")
    for name, model, problems in sets:
        compare(name, model, problems(), args)
    if args.simulate:
        simulate(args)


def simulate(args) -> None:
    """Replays on binomial outcomes of pass rates drawn uniformly from [0, 1]."""
    import random

    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.simulate):
        p = rng.random()
        outcomes = "".join("1" if rng.random() < p else "0" for _ in range(args.k))
        rows.append({"outcomes": outcomes, "pass_rate": outcomes.count("1") / args.k})
    print(f"\n== simulated: {args.simulate} problems, pass rate ~ uniform[0, 1], k={args.k} "
          "binomial outcomes (no model)")
    for b in [tuple(args.band)] + [b for b in args.replay_band if b != tuple(args.band)]:
        replay(rows, b, args.k)


def _gsm8k(data_dir: str, n: int):
    from grpo_core.data.records import stage_problems

    return stage_problems("gsm8k", "train", data_dir=data_dir, limit=n)


def _config(args, adaptive: bool):
    from grpo_core.config import PipelineConfig

    cfg = PipelineConfig()
    cfg.rollout.backend = "hf"
    cfg.rollout.batch_size = args.batch_size
    if args.max_new_tokens:
        cfg.rollout.max_new_tokens = args.max_new_tokens
    cfg.project.seed = args.seed
    f = cfg.filter
    f.k, f.band, f.adaptive = args.k, tuple(args.band), adaptive
    for field, value in (("adaptive_start", args.start), ("adaptive_step", args.step),
                         ("adaptive_confidence", args.confidence)):
        if value is not None:
            setattr(f, field, value)
    return cfg


def compare(name: str, model: str, problems: list, args) -> None:
    from grpo_core.eval.difficulty import filter_problems
    from grpo_core.eval.passrate import classify
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
    from grpo_core.verify.answers import clear_caches
    from grpo_core.workspace import Workspace

    path = resolve_model_path(model, Workspace.at().models, progress=True)
    fixed_cfg, adaptive_cfg = _config(args, False), _config(args, True)
    backend, tokenizer = build_backend(path, fixed_cfg)
    fp = model_fingerprint(path)
    band = tuple(args.band)

    def side(cfg):
        clear_caches()  # cold answer checker: neither side scores with the other's verdicts
        return timed(lambda: filter_problems(backend, problems, fp, cfg, cfg.model.template,
                                             tokenizer))

    fixed, t_fixed = side(fixed_cfg)
    adapt, t_adapt = side(adaptive_cfg)
    a = adaptive_cfg.filter
    print(f"\n== {name}: {len(fixed.estimates)} problems, {model}, k={args.k}, band {band}, "
          f"max {fixed_cfg.rollout.max_new_tokens} new tokens; adaptive start {a.adaptive_start} "
          f"step {a.adaptive_step} confidence {a.adaptive_confidence}; load after {load()}")
    same = [classify(x["pass_rate"], band) == classify(y["pass_rate"], band)
            for x, y in zip(fixed.estimates, adapt.estimates)]
    prefix = sum(y["outcomes"] == x["outcomes"][: y["samples"]]
                 for x, y in zip(fixed.estimates, adapt.estimates))
    kf, ka = {p.id for p in fixed.kept}, {p.id for p in adapt.kept}
    rates = [x["pass_rate"] for x in fixed.estimates]
    print(f"fixed pass rates: mean {sum(rates) / max(1, len(rates)):.3f}, "
          f"{sum(r == 0 for r in rates)} at 0, {sum(r == 1 for r in rates)} at 1")
    print(f"{'side':<10} {'samples':>8} {'too_easy':>9} {'in_band':>8} {'too_hard':>9} "
          f"{'kept':>5} {'seconds':>8}")
    for label, rep, secs in (("fixed", fixed, t_fixed), ("adaptive", adapt, t_adapt)):
        c = rep.counts
        print(f"{label:<10} {rep.sampled:8d} {c['too_easy']:9d} {c['in_band']:8d} "
              f"{c['too_hard']:9d} {len(rep.kept):5d} {secs:8.1f}")
    n = max(1, len(same))
    print(f"adaptive / fixed: samples {adapt.sampled / max(1, fixed.sampled):.1%} "
          f"(target <= 50%), wall time {t_adapt / max(1e-9, t_fixed):.1%}; "
          f"classified the same {sum(same)}/{len(same)} = {sum(same) / n:.1%} (target >= 90%)")
    print(f"kept sets: fixed {len(kf)}, adaptive {len(ka)}, both {len(kf & ka)}; adaptive "
          f"outcomes a prefix of fixed: {prefix}/{len(same)}")
    for b in [band] + [b for b in args.replay_band if b != band]:
        replay(fixed.estimates, b, args.k)


def replay(rows: list[dict], band: tuple[float, float], k: int) -> None:
    """What other adaptive settings give on these fixed outcomes (exact: prefix)."""
    from grpo_core.eval.adaptive import StopPlan
    from grpo_core.eval.passrate import classify, z_for

    fixed_in = sum(classify(r["pass_rate"], band) == "in_band" for r in rows)
    print(f"replay, band {band} ({fixed_in} in band at k={k}): {'start':>5} {'step':>4} "
          f"{'conf':>5} {'samples':>8} {'same class':>10}")
    pad = len(f"replay, band {band} ({fixed_in} in band at k={k}): ") - 1
    for start, step, conf in REPLAY:
        plan = StopPlan(start, step, z_for(conf), band)
        used = agree = 0
        for r in rows:
            outcomes, n = [c == "1" for c in r["outcomes"]], 0
            while n < k:
                n = plan.next_count(n, k)
                if plan.decided(sum(outcomes[:n]), n):
                    break
            used += n
            agree += classify(sum(outcomes[:n]) / n, band) == classify(r["pass_rate"], band)
        print(f"{'':{pad}} {start:5d} {step:4d} {conf:5.2f} {used / (k * len(rows)):8.1%} "
              f"{agree / len(rows):10.1%}")


if __name__ == "__main__":
    main()
