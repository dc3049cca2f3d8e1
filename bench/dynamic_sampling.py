"""Dynamic sampling (dynamic_sampling:, DAPO) on vs off on the R1-Zero recipe, side by
side in one run: for each seed, one GRPO round per arm from the built-in base model on the
same pool and the same number of optimizer steps, then the held-out eval (the recipe's
protocol: synthetic eval split, avg@8 at T=0.6, first --eval-limit problems).

By default the pool is the recipe's data unfiltered (the base model solves ~5% of it, so
most groups are uninformative: the case dynamic sampling is for, and the filter costs
minutes on 2 busy cores); --filter runs the recipe's difficulty filter first, as round 1
of the pipeline does. Steps and eval size are cut from the recipe's to fit ~10 minutes.

Prints per arm: the share of informative groups in the trained batch (mean over steps;
off: 1 - TRL's frac_reward_zero_std), completions generated per step, the round's wall
time; and the paired avg@8 change on minus off (per seed, and over problems averaged
across seeds) with its 95% paired-bootstrap CI, then a one-line verdict.

    .venv/bin/python bench/dynamic_sampling.py [--steps 20] [--seeds 0 1 2] [--eval-limit 100] [--filter]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import ROOT, load, timed

RECIPE = ROOT / "configs/recipes/r1_zero.yaml"


def training_pool(cfg, model: str, filtered: bool) -> tuple[list, str]:
    """The recipe's pool (its data.train source) through its difficulty filter under the
    base model, as the pipeline's round 1 gets it (the whole pool if the band keeps too few)."""
    from grpo_core.data.stage_split import prompts_per_update
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter

    src = cfg.data.train[0]
    pool = generate_problems("train", src.limit, levels=src.levels)
    if not filtered:
        return pool, f"{len(pool)} problems, unfiltered"
    report = run_filter(model, pool, cfg, models_cache=str(ROOT / ".grpo" / "models"))
    if len(report.kept) >= prompts_per_update(cfg):
        return report.kept, f"{len(report.kept)} of {report.considered} in band {list(report.band)}"
    return pool, f"band kept {len(report.kept)}: whole pool of {len(pool)}"


def step_stats(history: list[dict], cfg, on: bool) -> tuple[float, float]:
    """(mean informative share of the trained batch, mean completions generated) per step."""
    from grpo_core.config import generation_batch

    if on:
        share = [h["dynamic_sampling/informative_share"] for h in history]
        made = [h["dynamic_sampling/completions_generated"] for h in history]
    else:
        share = [1.0 - h["frac_reward_zero_std"] for h in history]
        made = [generation_batch(cfg)] * len(history)
    return statistics.fmean(share), statistics.fmean(made)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-limit", type=int, default=100)
    ap.add_argument("--filter", action="store_true", help="the recipe's difficulty filter first")
    ap.add_argument("--max-regenerations", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("GRPO_TORCH_THREADS", "1")  # tiny model, busy cores: no spin-waits

    from grpo_core.config import generation_batch, load_config
    from grpo_core.eval.evaluation import evaluate_benchmark
    from grpo_core.eval.paired import paired_bootstrap, paired_scores
    from grpo_core.modeling.loading import load_tokenizer, resolve_model_path
    from grpo_core.modeling.threads import configure_threads
    from grpo_core.prompts import resolve_template
    from grpo_core.train.grpo import run_grpo_round

    configure_threads()
    t_start = time.perf_counter()
    over = [f"grpo.max_steps={a.steps}", "grpo.save_steps=100000", f"eval.limit={a.eval_limit}",
            f"dynamic_sampling.max_regenerations={a.max_regenerations}"]
    base_cfg = load_config(RECIPE, over)
    metric = base_cfg.eval.primary_metric
    model = resolve_model_path(base_cfg.model.name_or_path, ROOT / ".grpo" / "models")
    template = resolve_template(base_cfg.model.template, load_tokenizer(model))
    (pool, pool_note), filter_s = timed(lambda: training_pool(base_cfg, model, a.filter))

    rows, scores = [], {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up (imports, first loads): not charged to whichever arm runs first
        warm = load_config(RECIPE, over + ["grpo.max_steps=1", "dynamic_sampling.enabled=true"])
        run_grpo_round(model, pool, warm, Path(tmp, "warm-up"), template)
        for k, seed in enumerate(a.seeds):
            # interleaved, order alternating: background load drifts alike on both arms
            for arm in (("off", "on") if k % 2 == 0 else ("on", "off")):
                cfg = load_config(RECIPE, over + [f"project.seed={seed}",
                                                  f"dynamic_sampling.enabled={arm == 'on'}"])
                result, wall = timed(lambda: run_grpo_round(model, pool, cfg, Path(tmp, f"{seed}-{arm}"),
                                                            template))
                ev = evaluate_benchmark(result.output_dir, "synthetic", cfg, limit=a.eval_limit)
                share, made = step_stats(result.history, cfg, arm == "on")
                rows.append({"seed": seed, "arm": arm, "steps": result.steps, "share": share,
                             "made": made, "wall": wall, "train": result.train_seconds,
                             "score": ev.metrics[metric]["mean"]})
                scores[arm].append(ev.per_problem)

    per_seed = []
    for i, seed in enumerate(a.seeds):  # scores[arm][i]: seed i in both arms (appended per seed)
        on, off = paired_scores(scores["on"][i], scores["off"][i], metric)
        per_seed.append((seed, paired_bootstrap(on, off, seed=seed), on, off))
    n = len(per_seed[0][2])
    mean_on = [statistics.fmean(s[2][j] for s in per_seed) for j in range(n)]
    mean_off = [statistics.fmean(s[3][j] for s in per_seed) for j in range(n)]
    pooled = paired_bootstrap(mean_on, mean_off)

    g = base_cfg.grpo
    print(f"R1-Zero recipe ({RECIPE.name}), {base_cfg.model.name_or_path}: {a.steps} optimizer steps "
          f"of {generation_batch(base_cfg) // g.num_generations} prompts x G={g.num_generations}, seeds {a.seeds}, "
          f"max_regenerations {a.max_regenerations}")
    print(f"training pool: {pool_note}{f' (filter {filter_s:.0f} s)' if a.filter else ''}; eval: synthetic, "
          f"{n} held-out problems, {metric}")
    print(f"{'seed':>4} {'arm':>4} {'steps':>5} {'informative':>12} {'completions':>12} "
          f"{'round s':>8} {'train s':>8} {metric:>8}")
    print(f"{'':>4} {'':>4} {'':>5} {'share/step':>12} {'/step':>12}")
    for r in rows:
        print(f"{r['seed']:>4} {r['arm']:>4} {r['steps']:>5} {r['share']:>12.3f} {r['made']:>12.1f} "
              f"{r['wall']:>8.1f} {r['train']:>8.1f} {r['score']:>8.4f}")
    for arm in ("off", "on"):
        sel = [r for r in rows if r["arm"] == arm]
        print(f"{'mean':>4} {arm:>4} {'':>5} {statistics.fmean(r['share'] for r in sel):>12.3f} "
              f"{statistics.fmean(r['made'] for r in sel):>12.1f} "
              f"{statistics.fmean(r['wall'] for r in sel):>8.1f} "
              f"{statistics.fmean(r['train'] for r in sel):>8.1f} "
              f"{statistics.fmean(r['score'] for r in sel):>8.4f}")
    wall = {arm: sum(r["wall"] for r in rows if r["arm"] == arm) for arm in ("off", "on")}
    print(f"round wall time on/off: {wall['on'] / wall['off']:.2f}x")
    for seed, d, _, _ in per_seed:
        print(f"seed {seed}: {metric} on - off = {d['delta']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}] "
              f"(paired over {d['n']} problems)")
    print(f"all seeds (per-problem mean over seeds): {metric} on - off = {pooled['delta']:+.4f} "
          f"[{pooled['lo']:+.4f}, {pooled['hi']:+.4f}] 95% CI")
    if pooled["lo"] > 0:
        verdict = "dynamic sampling raised held-out " + metric
    elif pooled["hi"] < 0:
        verdict = "dynamic sampling lowered held-out " + metric
    else:
        verdict = f"no significant {metric} change from dynamic sampling"
    share = {arm: statistics.fmean(r["share"] for r in rows if r["arm"] == arm) for arm in ("off", "on")}
    print(f"verdict: {verdict} ({pooled['delta']:+.4f}, CI [{pooled['lo']:+.4f}, {pooled['hi']:+.4f}]) at "
          f"{wall['on'] / wall['off']:.2f}x the round time; informative share {share['off']:.2f} -> "
          f"{share['on']:.2f} at equal optimizer steps")
    print(f"whole bench {time.perf_counter() - t_start:.0f} s; load average {load()}")


if __name__ == "__main__":
    main()
