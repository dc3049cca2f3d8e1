"""A real pretrained model through both recipes on this machine's CPU: base -> [SFT] ->
each GRPO round -> final, every stage scored on the same held-out problems, with the paired
95% CI of each stage against its own input and against the base, under strict and
flexible extraction (grpo_core.eval.paired.paired_delta).

    GRPO_TORCH_THREADS=1 .venv/bin/python bench/real_model.py \\
        [--config configs/models/smollm2-135m-cpu.yaml] [--model PATH] [--set k=v ...] \\
        [--eval-n 200] [--gsm8k-n 50] [--seeds 0,1,2] [--arms band,pool] [--json out.json]

Replication (issue 33): `--seeds` runs each recipe's GRPO stage once per seed
(`project.seed`: the filter's sample, the prompt order, the rollouts) from the same input
(sft_grpo's SFT stage runs once), and `--arms band,pool` runs it once on prompts drawn from
the filter's band and once on prompts drawn from the whole pool, the same steps, prompts per
step and G (the pool arm skips the filter). The summary gives, per recipe and arm, each
seed's gain over the stage's input and the gain pooled over seeds (per problem the mean over
seeds, bootstrapped over problems), strict and flexible, the band-minus-pool difference
pooled the same way, and the share of zero-variance groups per step in each arm.
Resumable: a GRPO stage whose folder holds a model trained from the same inputs is reused,
and scored stages are cached by model content, so a rerun after a stop picks up where it was.

What runs is the config's: its model, template, synthetic levels (the held-out problems
are the synthetic task's eval split at the same levels, disjoint from training by
construction), its SFT and GRPO sections, `rounds.count`, its difficulty filter (run on the
policy each round starts from; its band share is printed), `project.recipes` (each with its
`project.recipe_overrides`) and `diagnosis.stop_on_collapsed_start` (a recipe whose filter
finds every group's accuracy equal is stopped before training, as the pipeline does). Stages
run in this process, one after another (grpo_core's functions, no Prefect/MLflow), so the
wall time of each is its own. Per stage it prints accuracy with its CI, the paired deltas,
wall seconds, and for GRPO seconds per step, generated tokens/s (the trainer's
throughput/* metrics) and peak RSS next to the memory plan's CPU figure. GSM8K test
(`--gsm8k-n` problems, 0 to skip) is scored for the base and each recipe's final model.
Every stage is appended to `--json` as it ends, so a run stopped early keeps its rows.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

from harness import ROOT, load, resolved_model

from grpo_core.config import load_config, recipe_config
from grpo_core.data.benchmarks import SYNTHETIC_EVAL_SEED, benchmark_problems, fingerprint
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.evaluation import greedy_records
from grpo_core.eval.metrics import bootstrap_ci
from grpo_core.eval.paired import paired_delta, pooled_paired_delta
from grpo_core.modeling.memory_plan import memory_plan
from grpo_core.train.diagnosis import CollapsedStart, start_collapse
from grpo_core.train.throughput import round_summary, rss_peak

EXTRACTIONS = {"strict": "greedy_accuracy", "flexible": "flexible/greedy_accuracy"}
FIELD = {"strict": "greedy_correct", "flexible": "greedy_correct_flexible"}


def accuracy(records: list[dict], mode: str) -> dict:
    flags = [float(bool(r[FIELD[mode]])) for r in records]
    mean, lo, hi = bootstrap_ci(flags, n_resamples=1000, seed=0)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(flags)}


def paired(a: list[dict], b: list[dict]) -> dict:
    return {mode: paired_delta(a, b, metric) for mode, metric in EXTRACTIONS.items()}


def pooled(pairs: list[tuple[list[dict], list[dict]]]) -> dict:
    return {mode: pooled_paired_delta(pairs, metric) for mode, metric in EXTRACTIONS.items()}


def content_key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def reused(folder: Path, key: str) -> dict | None:
    """What a stage saved in `folder` when it was trained from the same inputs (`key`)."""
    path = folder / "bench-stamp.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key and Path(saved["model"]).exists():
            return saved
    return None


def stamp(folder: Path, key: str, saved: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench-stamp.json").write_text(json.dumps({"key": key, **saved}, default=str))


def scored(path: str, problems: list, cfg, template: str, cache: Path) -> tuple[list[dict], float]:
    """Greedy records of `problems` under `path`, and the seconds it took (load included).
    Kept in `cache` by model content, problems, template and length: a rerun of the bench
    (other training settings) scores an unchanged model (the base) once."""
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import model_fingerprint

    key = hashlib.sha256(json.dumps([model_fingerprint(path), fingerprint(problems), template,
                                     cfg.eval.max_new_tokens]).encode()).hexdigest()[:16]
    hit = cache / f"{key}.json"
    if hit.is_file():
        saved = json.loads(hit.read_text())
        return saved["records"], saved["seconds"]
    t0 = time.perf_counter()
    backend, tok = build_backend(path, cfg)
    recs = greedy_records(backend, tok, problems, template, cfg.eval.max_new_tokens)
    backend.shutdown()
    seconds = time.perf_counter() - t0
    cache.mkdir(parents=True, exist_ok=True)
    hit.write_text(json.dumps({"model": path, "records": recs, "seconds": seconds}, default=str))
    return recs, seconds


def band_filter(path: str, pool: list, cfg, template: str):
    """The difficulty filter under the policy `path` (no store: estimated afresh)."""
    from grpo_core.eval.difficulty import filter_problems
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import load_tokenizer, model_fingerprint

    return filter_problems(lambda: build_backend(path, cfg)[0], pool, model_fingerprint(path),
                           cfg, template, load_tokenizer(path))


def ci(m: dict) -> str:
    return f"{m['mean']:.3f} [{m['lo']:.3f}, {m['hi']:.3f}]"


def delta(d: dict) -> str:
    return f"{d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


class Experiment:
    def __init__(self, cfg, model: str, template: str, eval_n: int, gsm8k_n: int,
                 out: Path, json_path: Path | None):
        self.cfg, self.model, self.template, self.out = cfg, model, template, out
        src = cfg.data.train[0]
        self.levels = src.levels
        self.held_out = generate_problems("eval", n=eval_n, seed=SYNTHETIC_EVAL_SEED,
                                          levels=self.levels)
        self.pool = generate_problems("train", n=src.limit or 800, seed=cfg.project.seed,
                                      levels=self.levels)
        self.gsm8k = (benchmark_problems("gsm8k", cfg, limit=gsm8k_n) if gsm8k_n else [])
        self.rows: list[dict] = []
        self.json_path = json_path
        self.records: dict[str, list[dict]] = {}
        self.inputs: dict[str, str] = {}          # recipe -> records key of its GRPO input
        self.finals: dict[tuple[str, str], list] = {}   # (recipe, arm) -> [(seed, records)]
        self.pooled_rows: list[dict] = []

    def emit(self, row: dict) -> None:
        self.rows.append(row)
        line = (f"{row.get('run') or row['recipe']:22s} {row['stage']:14s} strict {ci(row['strict'])}  "
                f"flexible {ci(row['flexible'])}  {row['seconds']:.0f} s")
        for vs in ("vs_input", "vs_base"):
            if row.get(vs):
                line += (f"\n{'':24s}{vs}: strict {delta(row[vs]['strict'])}  "
                         f"flexible {delta(row[vs]['flexible'])}")
        for key in ("train", "filter", "gsm8k"):
            if row.get(key):
                line += f"\n{'':24s}{key}: {json.dumps(row[key])}"
        print(f"{line}   (load {load()})", flush=True)
        if self.json_path:
            self.json_path.write_text(json.dumps(self.rows, indent=1))

    def evaluate(self, recipe: str, stage: str, path: str, seconds: float, input_key: str | None,
                 extra: dict | None = None, gsm8k: bool = False) -> None:
        recs, s = scored(path, self.held_out, self.cfg, self.template, self.out / 'records')
        key = f"{(extra or {}).get('run') or recipe}/{stage}"   # a seed's run keeps its own
        self.records[key] = recs
        row = {"recipe": recipe, "stage": stage, "model": path, "seconds": round(seconds, 1),
               "eval_seconds": round(s, 1), "truncated": sum(r["greedy_truncated"] for r in recs) / len(recs),
               "well_formatted": sum(r["greedy_well_formatted"] for r in recs) / len(recs),
               **{m: accuracy(recs, m) for m in EXTRACTIONS}, **(extra or {})}
        if input_key:
            row["vs_input"] = paired(recs, self.records[input_key])
            row["vs_base"] = paired(recs, self.records["base"])
        if gsm8k and self.gsm8k:
            g, gs = scored(path, self.gsm8k, self.cfg, self.template, self.out / 'records')
            row["gsm8k"] = {m: round(accuracy(g, m)["mean"], 3) for m in EXTRACTIONS}
            row["gsm8k"].update(n=len(g), seconds=round(gs, 1))
        self.emit(row)

    def base(self) -> None:
        self.evaluate("base", "base", self.model, 0.0, None, gsm8k=True)
        self.records["base"] = self.records["base/base"]

    def sft_key(self) -> str:
        """What the SFT stage's model depends on: input weights, traces, template, settings."""
        from grpo_core.modeling.loading import model_fingerprint

        return content_key(model_fingerprint(self.model), fingerprint(self.pool), self.template,
                           self.cfg.sft.model_dump(mode="json"),
                           self.cfg.sft_stage.model_dump(mode="json"), self.cfg.project.seed)

    def sft(self, recipe: str) -> tuple[str, str]:
        """The SFT stage, reused when its folder holds a model trained from the same inputs
        (a rerun with other GRPO settings)."""
        from grpo_core.train.sft import run_sft

        folder, key = self.out / recipe / "sft", self.sft_key()
        saved = reused(folder, key)
        if saved:
            self.evaluate(recipe, "sft", saved["model"], saved["seconds"], "base/base",
                          {"train": {**saved["train"], "reused": True}})
            return saved["model"], f"{recipe}/sft"
        t0 = time.perf_counter()
        with rss_peak() as peak:
            res = run_sft(self.model, self.pool, self.cfg, folder, self.template, report_to=[])
        losses = [h["loss"] for h in res.history if "loss" in h]
        train = {"steps": res.steps, "seconds": round(time.perf_counter() - t0, 1),
                 "loss_first_last": [round(losses[0], 3), round(losses[-1], 3)] if losses else None,
                 "peak_rss_gb": peak.peak_gb}
        stamp(folder, key, {"model": res.output_dir, "train": train, "seconds": train["seconds"]})
        self.evaluate(recipe, "sft", res.output_dir, time.perf_counter() - t0, "base/base",
                      {"train": train})
        return res.output_dir, f"{recipe}/sft"

    def grpo_round(self, recipe: str, n: int, path: str, input_key: str, last: bool,
                   run: str, arm: str) -> str:
        """Round `n` of run `run` (recipe, seed and arm) from `path`: the filter (band arm),
        the GRPO stage, its evaluation. Reused when its folder holds the same inputs' model."""
        from grpo_core.data.stage_split import prompts_per_update
        from grpo_core.modeling.loading import model_fingerprint
        from grpo_core.train.grpo import run_grpo_round

        folder = self.out / run / f"grpo-{n}"
        key = content_key(model_fingerprint(path), fingerprint(self.pool), self.template, arm,
                          self.cfg.model_dump(mode="json", exclude={"eval"}))
        saved = reused(folder, key)
        if saved:
            self.evaluate(recipe, f"grpo/round-{n}", saved["model"], saved["seconds"], input_key,
                          {**saved["extra"], "run": run, "reused": True}, gsm8k=last)
            return saved["model"]
        t0 = time.perf_counter()
        problems, filt = self.pool, None
        if arm == "band" and self.cfg.filter.enabled:
            rep = band_filter(path, self.pool, self.cfg, self.template)
            filt = {"considered": rep.considered, "kept": len(rep.kept),
                    "band_share": round(len(rep.kept) / max(rep.considered, 1), 3),
                    "seconds": round(rep.seconds, 1)}
            problems = rep.kept
            collapsed = start_collapse([r["pass_rate"] for r in rep.estimates], self.cfg, n)
            if collapsed is not None and collapsed.severity == "stop":
                raise CollapsedStart(collapsed.line())  # as the pipeline stops
            if len(problems) < prompts_per_update(self.cfg):
                # too few in band to fill one step: train on the pool, and say so
                filt["fallback"] = "too few in band: the round trains on the whole pool"
                problems = self.pool
        t1 = time.perf_counter()
        with rss_peak() as peak:
            res = run_grpo_round(path, problems, self.cfg, folder, self.template,
                                 report_to=[], round_no=n)
        steps = [h["step_time"] for h in res.history if "step_time" in h]
        tp = round_summary(res.history)
        plan = memory_plan(self.cfg.model_copy(update={"model": self.cfg.model.model_copy(
            update={"name_or_path": path})}), device="cpu")
        train = {"steps": res.steps, "seconds": round(time.perf_counter() - t1, 1),
                 "s_per_step": round(statistics.median(steps), 1) if steps else None,
                 "gen_tokens_per_s": tp.get("gen_tokens_per_s"), "gen_share": tp.get("gen_share"),
                 "train_tokens_per_s": tp.get("train_tokens_per_s"),
                 "peak_rss_gb": peak.peak_gb, "memory_plan_gb": plan.get("total_gb"),
                 "reward_first_last": [round(res.history[0].get("reward", float("nan")), 3),
                                       round(res.history[-1].get("reward", float("nan")), 3)],
                 # the share of groups whose G rewards were all equal, per step (TRL's metric)
                 "zero_std_per_step": [round(h["frac_reward_zero_std"], 2) for h in res.history
                                       if "frac_reward_zero_std" in h],
                 "findings": [f.line() for f in res.findings]}
        seconds = time.perf_counter() - t0
        extra = {"train": train, "filter": filt, "arm": arm, "seed": self.cfg.project.seed}
        stamp(folder, key, {"model": res.output_dir, "seconds": round(seconds, 1), "extra": extra})
        self.evaluate(recipe, f"grpo/round-{n}", res.output_dir, seconds, input_key,
                      {**extra, "run": run}, gsm8k=last)
        return res.output_dir

    def recipe(self, recipe: str, seeds: list[int], arms: list[str]) -> None:
        """The recipe's input once (SFT for sft_grpo, else the base), then its GRPO rounds
        once per seed and arm; the final records of each go to self.finals[(recipe, arm)]."""
        start, start_key = self.model, "base/base"
        if recipe == "sft_grpo":
            start, start_key = self.sft(recipe)
        self.inputs[recipe] = start_key
        base_cfg = self.cfg
        for arm in arms:
            for seed in seeds:
                self.cfg = base_cfg.model_copy(update={"project": base_cfg.project.model_copy(
                    update={"seed": seed})})
                run = f"{recipe}/{arm}/seed-{seed}"
                path, key = start, start_key
                for n in range(1, self.cfg.rounds.count + 1):
                    path = self.grpo_round(recipe, n, path, key, n == self.cfg.rounds.count,
                                           run, arm)
                    key = f"{run}/grpo/round-{n}"
                self.finals.setdefault((recipe, arm), []).append((seed, self.records[key]))
        self.cfg = base_cfg

    def summary(self) -> None:
        """Per recipe and arm: each seed's gain over the GRPO stage's input, the pooled gain,
        and band minus pool; strict and flexible (a markdown table, for the README)."""
        print("\n| recipe | arm | seed | gain strict | gain flexible | zero-std share per step |")
        print("|---|---|---|---|---|---|")
        for (recipe, arm), finals in self.finals.items():
            before = self.records[self.inputs[recipe]]
            for seed, recs in finals:
                row = next(r for r in self.rows if r.get("run") == f"{recipe}/{arm}/seed-{seed}"
                           and r["stage"] == f"grpo/round-{self.cfg.rounds.count}")
                d = paired(recs, before)
                zs = [z for r in self.rows if r.get("run") == row["run"]
                      for z in r["train"]["zero_std_per_step"]]
                print(f"| {recipe} | {arm} | {seed} | {delta(d['strict'])} | "
                      f"{delta(d['flexible'])} | {statistics.mean(zs) if zs else float('nan'):.2f} |")
            p = pooled([(recs, before) for _, recs in finals])
            print(f"| {recipe} | {arm} | pooled ({len(finals)}) | **{delta(p['strict'])}** | "
                  f"**{delta(p['flexible'])}** | |")
            self.pooled_rows.append({"recipe": recipe, "arm": arm, "seeds": [s for s, _ in finals],
                                     "pooled_vs_input": p})
        for recipe in {r for r, _ in self.finals}:
            band, pool = self.finals.get((recipe, "band")), self.finals.get((recipe, "pool"))
            if band and pool:
                pairs = [(b, q) for (_, b), (_, q) in zip(band, pool)]
                d = pooled(pairs)
                print(f"| {recipe} | band - pool | pooled ({len(pairs)}) | {delta(d['strict'])} "
                      f"| {delta(d['flexible'])} | |")
                self.pooled_rows.append({"recipe": recipe, "arm": "band - pool",
                                         "pooled": d, "seeds": len(pairs)})
        if self.json_path:
            self.json_path.with_suffix(".summary.json").write_text(
                json.dumps(self.pooled_rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/models/smollm2-135m-cpu.yaml"))
    ap.add_argument("--model", help="a model folder or name, resolved as `grpo run` does (a "
                    "fetched name, builtin:...); default: the config's model.name_or_path")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--recipes", help="comma-separated (default: the config's project.recipes)")
    ap.add_argument("--seeds", help="comma-separated GRPO seeds (default: project.seed)")
    ap.add_argument("--arms", default="band",
                    help="band (prompts from the filter's band), pool (from the whole pool), "
                         "or both comma-separated; pool applies to sft_grpo only")
    ap.add_argument("--eval-n", type=int, default=200)
    ap.add_argument("--gsm8k-n", type=int, default=50)
    ap.add_argument("--out", default=None, help="where the stages' models go")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cfg = load_config(a.config, a.overrides)
    model = resolved_model(a.model or cfg.model.name_or_path, cfg.project.workdir)
    recipes = a.recipes.split(",") if a.recipes else (cfg.project.recipes or [cfg.project.recipe])
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [cfg.project.seed]
    arms = a.arms.split(",")
    if not set(arms) <= {"band", "pool"}:
        ap.error(f"--arms: {a.arms!r}: band, pool or both")
    out = Path(a.out or os.environ.get("GRPO_WORKDIR", ".grpo")) / "bench-real-model"
    template = cfg.model.template
    print(f"real model bench: {model}, template {template}, levels {cfg.data.train[0].levels}, "
          f"recipes {recipes}, seeds {seeds}, arms {arms}, held-out {a.eval_n}, "
          f"GSM8K {a.gsm8k_n}, threads {os.environ.get('GRPO_TORCH_THREADS')}, load {load()}",
          flush=True)
    exp = Experiment(cfg, model, template, a.eval_n, a.gsm8k_n, out,
                     Path(a.json) if a.json else None)
    t0 = time.perf_counter()
    exp.base()
    for r in recipes:
        exp.cfg = recipe_config(cfg, r)  # its project.recipe_overrides (r1_zero: zero-RL reward)
        try:
            # the pool arm compares against the SFT input's band: sft_grpo's question
            exp.recipe(r, seeds, arms if r == "sft_grpo" else ["band"])
        except CollapsedStart as stop:
            print(f"{r}: stopped before training: {stop}", flush=True)
    exp.summary()
    print(f"total {time.perf_counter() - t0:.0f} s (load {load()})", flush=True)


if __name__ == "__main__":
    main()
