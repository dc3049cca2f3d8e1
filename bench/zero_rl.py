"""Can R1-Zero start? Reward candidates under the base model, before any training: for each,
the share of zero-variance groups (TRL's frac_reward_zero_std) and the difficulty filter's
in-band share, on the same completions.

    GRPO_WORKDIR=/work/models-cache GRPO_TORCH_THREADS=1 .venv/bin/python bench/zero_rl.py \\
        [--config configs/models/smollm2-135m-cpu.yaml] [--recipe r1_zero] [--templates chat,r1_zero] \\
        [--problems 32] [--set k=v ...] [--cache DIR] [--json out.json] \\
        [--train CANDIDATE --steps N]

The completions are the filter's own: `filter_problems` of the config (filter.k samples per
problem at filter.temperature, rollout.max_new_tokens, the filter's seeds) over its
`--problems` first considered problems of the training pool, drawn once per template and
replayed for every candidate (a candidate changes how completions are scored, never what
is sampled). Per candidate (`CANDIDATES`: --set overrides over the config as --recipe runs
it, with its project.recipe_overrides) and template:

    zero_std        groups of G = filter.k whose total reward (TRL's weighted nansum of the
                    candidate's rewards.funcs) has zero std: TRL's frac_reward_zero_std
    zero_std@grpo   the same with each completion cut to grpo.max_completion_length tokens
                    (what a GRPO step of the config generates; shorter than the filter's)
    acc_zero_std    groups whose accuracy alone is constant: a group with varying format
                    reward but constant accuracy has an advantage that teaches no answer
    acc             mean accuracy (the candidate's rewards.extraction)
    in_band         the filter's kept share (filter.band) under the candidate's scoring
    signal          problems with a pass rate in (0, 1): the pipeline trains on those when
                    the band keeps too few (flows/pipeline.training_prompts)

Completions are kept in --cache (default $GRPO_WORKDIR/bench-zero-rl), keyed by model, template
and the filter's sampling, so another run (other candidates) only scores. `--train NAME
--steps N` then runs N GRPO steps of that candidate (first template) from the base on the
problems its filter kept and prints TRL's own frac_reward_zero_std per step.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path

from common import ROOT, load

from grpo_core.config import config_from_dict, load_config, recipe_config
from grpo_core.data.records import problem_key
from grpo_core.generation.rollout import Completion
from grpo_core.generation.sampling import build_backend, sample_seeded

# name -> --set overrides over the recipe's config (its own rewards for "as configured").
CANDIDATES = {
    "as configured": [],
    "strict + format 0.2 (R1)": ["rewards.extraction=strict", "rewards.funcs=[accuracy,format]",
                                 "rewards.weights=[1.0,0.2]"],
    "strict accuracy alone": ["rewards.extraction=strict", "rewards.funcs=[accuracy]",
                              "rewards.weights=[1.0]"],
    "flexible accuracy alone": ["rewards.extraction=flexible", "rewards.funcs=[accuracy]",
                                "rewards.weights=[1.0]"],
    "flexible + format 0.2": ["rewards.extraction=flexible", "rewards.funcs=[accuracy,format]",
                              "rewards.weights=[1.0,0.2]"],
    "flexible + tag_count 0.2": ["rewards.extraction=flexible",
                                 "rewards.funcs=[accuracy,tag_count]", "rewards.weights=[1.0,0.2]"],
}


class Replay:
    """A rollout backend that samples through `real` once per (prompt, seed) and replays
    the same completions afterwards (the filter calls it once per candidate)."""

    def __init__(self, make_real, saved: dict | None = None):
        self.make_real, self.real = make_real, None
        self.saved: dict[str, list[Completion]] = saved or {}
        self.batch_size = 64
        self.sampled_s = 0.0

    @staticmethod
    def key(prompt: str, seed: int) -> str:
        return hashlib.sha256(f"{seed}\x1f{prompt}".encode()).hexdigest()[:20]

    def sample_seeded(self, prompts: list[str], n: int, params, seeds: list[int]):
        todo = [(p, s) for p, s in zip(prompts, seeds) if len(self.saved.get(self.key(p, s), [])) < n]
        if todo:
            if self.real is None:
                self.real = self.make_real()
                self.batch_size = getattr(self.real, "batch_size", 64)
            t0 = time.perf_counter()
            outs = sample_seeded(self.real, [p for p, _ in todo], n, params, [s for _, s in todo])
            self.sampled_s += time.perf_counter() - t0
            for (p, s), comps in zip(todo, outs):
                self.saved[self.key(p, s)] = comps
        return [self.saved[self.key(p, s)][:n] for p, s in zip(prompts, seeds)]

    def groups(self, prompts: list[str], seeds: list[int]) -> list[list[Completion]]:
        return [self.saved[self.key(p, s)] for p, s in zip(prompts, seeds)]


def group_rewards(cfg, prompt: str, gold: str, texts: list[str]) -> tuple[list[float], list]:
    """(TRL's total reward per completion, the accuracy per completion) under cfg.rewards."""
    from grpo_core.verify.rewards import build_reward_funcs

    funcs, weights = build_reward_funcs(cfg.rewards, cfg.grpo.max_completion_length)
    n = len(texts)
    per_fn = {f.__name__: f(texts, answer=[gold] * n, prompts=[prompt] * n) for f in funcs}
    total = [sum(w * v for w, v in zip(weights, vals) if v is not None and not math.isnan(v))
             for vals in zip(*per_fn.values())]
    acc = per_fn.get("accuracy") or [None] * n
    return total, acc


def zero_std(values: list) -> bool:
    xs = [0.0 if v is None else float(v) for v in values]
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / max(1, len(xs) - 1)) <= 1e-8


def cut(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def measure(cfg, template: str, replay: Replay, path: str, tokenizer, pool) -> dict:
    from grpo_core.eval.difficulty import filter_problems, problem_seed
    from grpo_core.modeling.loading import model_fingerprint
    from grpo_core.prompts import render_prompt

    report = filter_problems(replay, pool, model_fingerprint(path), cfg, template, tokenizer)
    by_key = {r["problem_id"]: r for r in report.estimates}
    sampled = [p for p in pool if problem_key(p) in by_key]
    prompts = [render_prompt(p.problem, template, tokenizer) for p in sampled]
    groups = replay.groups(prompts, [problem_seed(cfg.project.seed, p) for p in sampled])
    stats = {"zero_std": 0, "zero_std@grpo": 0, "acc_zero_std": 0, "acc": [], "truncated": 0,
             "tokens": 0}
    for p, prompt, comps in zip(sampled, prompts, groups):
        texts = [c.text for c in comps]
        total, acc = group_rewards(cfg, prompt, p.answer, texts)
        short = [cut(tokenizer, t, cfg.grpo.max_completion_length) for t in texts]
        total_short, _ = group_rewards(cfg, prompt, p.answer, short)
        stats["zero_std"] += zero_std(total)
        stats["zero_std@grpo"] += zero_std(total_short)
        stats["acc_zero_std"] += zero_std(acc)
        stats["acc"] += [a or 0.0 for a in acc]
        stats["truncated"] += sum(c.truncated for c in comps)
        stats["tokens"] += sum(c.num_tokens for c in comps)
    n, m = len(sampled), max(1, len(stats["acc"]))
    signal = sum(0.0 < r["pass_rate"] < 1.0 for r in report.estimates)
    return report, {"groups": n, "G": cfg.filter.k,
            "zero_std": round(stats["zero_std"] / n, 3),
            "zero_std@grpo": round(stats["zero_std@grpo"] / n, 3),
            "acc_zero_std": round(stats["acc_zero_std"] / n, 3),
            "acc": round(sum(stats["acc"]) / m, 3),
            "in_band": round(len(report.kept) / max(1, report.considered), 3),
            "kept": len(report.kept), "considered": report.considered,
            "signal": round(signal / max(1, n), 3), "truncated": round(stats["truncated"] / m, 3),
            "mean_tokens": round(stats["tokens"] / m, 1)}


def recipe_cfg(path: str, recipe: str | None, sets: list[str]):
    """The config `recipe` runs (its project.recipe_overrides merged in), then `sets`."""
    cfg = load_config(path)
    if recipe:
        cfg = recipe_config(cfg, recipe)
    tree = cfg.model_dump(mode="json", exclude={"model": {"hub_token"}})
    tree["project"]["recipe_overrides"] = {}
    return config_from_dict(tree, sets)


def completions_cache(cache: Path, path: str, template: str, cfg, n: int) -> Path:
    from grpo_core.eval.difficulty import sampling_spec
    from grpo_core.modeling.loading import model_fingerprint

    spec = sampling_spec(cfg, template)
    spec.pop("extraction", None)  # how completions are scored: never what is sampled
    key = hashlib.sha256(json.dumps([model_fingerprint(path), template, n, spec],
                                    sort_keys=True).encode()).hexdigest()[:16]
    return cache / f"completions-{key}.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/models/smollm2-135m-cpu.yaml"))
    ap.add_argument("--recipe", default="r1_zero",
                    help="whose project.recipe_overrides apply ('' for none)")
    ap.add_argument("--templates", default="chat,r1_zero")
    ap.add_argument("--problems", type=int, default=32, help="filter.max_problems")
    ap.add_argument("--candidates", help="comma-separated names of CANDIDATES (default: all)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--cache", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--train", help="then train this candidate (of the first template) ...")
    ap.add_argument("--steps", type=int, default=0, help="... this many GRPO steps from the base")
    a = ap.parse_args()

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import load_tokenizer, resolve_model_path
    from grpo_core.workspace import Workspace

    base = recipe_cfg(a.config, a.recipe, a.overrides + [f"filter.max_problems={a.problems}"])
    path = resolve_model_path(base.model.name_or_path, Workspace.at(base.project.workdir).models)
    tokenizer = load_tokenizer(path, base.model.gguf_file)
    src = base.data.train[0]
    pool = generate_problems("train", n=src.limit or 800, seed=base.project.seed, levels=src.levels)
    cache = Path(a.cache or Path(os.environ.get("GRPO_WORKDIR", ".grpo")) / "bench-zero-rl")
    cache.mkdir(parents=True, exist_ok=True)
    names = a.candidates.split(",") if a.candidates else list(CANDIDATES)
    print(f"zero-RL bench: {base.model.name_or_path}, {a.problems} problems x G={base.filter.k}, "
          f"T={base.filter.temperature}, {base.rollout.max_new_tokens} tokens (grpo "
          f"{base.grpo.max_completion_length}), band {list(base.filter.band)}, threads "
          f"{os.environ.get('GRPO_TORCH_THREADS')}, load {load()}", flush=True)
    rows, to_train = [], None
    head = (f"{'candidate':26s} {'template':8s} {'zero_std':>8s} {'@grpo':>6s} {'acc_zero':>8s} "
            f"{'acc':>6s} {'in_band':>8s} {'signal':>6s}")
    for template in a.templates.split(","):
        t0 = time.perf_counter()
        cfg0 = recipe_cfg(a.config, a.recipe, a.overrides + [f"filter.max_problems={a.problems}",
                                                             f"model.template={template}"])
        file = completions_cache(cache, path, template, cfg0, a.problems)
        saved = ({k: [Completion(**c) for c in v] for k, v in json.loads(file.read_text()).items()}
                 if file.is_file() else {})
        replay = Replay(lambda cfg=cfg0: build_backend(path, cfg)[0], saved)
        print(head, flush=True)
        for name in names:
            cfg = recipe_cfg(a.config, a.recipe, a.overrides + CANDIDATES[name] + [
                f"filter.max_problems={a.problems}", f"model.template={template}"])
            report, row = measure(cfg, template, replay, path, tokenizer, pool)
            row = {"candidate": name, "template": template, **row}
            rows.append(row)
            if (name, template) == (a.train, a.templates.split(",")[0]):
                to_train = (cfg, report.kept)
            print(f"{name:26s} {template:8s} {row['zero_std']:8.3f} {row['zero_std@grpo']:6.3f} "
                  f"{row['acc_zero_std']:8.3f} {row['acc']:6.3f} {row['in_band']:8.3f} "
                  f"{row['signal']:6.3f}", flush=True)
            file.write_text(json.dumps({k: [c.__dict__ for c in v] for k, v in replay.saved.items()}))
        print(f"template {template}: {time.perf_counter() - t0:.0f} s (sampling "
              f"{replay.sampled_s:.0f} s), truncated {rows[-1]['truncated']:.2f}, mean "
              f"{rows[-1]['mean_tokens']:.0f} tokens, load {load()}", flush=True)
        if replay.real is not None:
            getattr(replay.real, "shutdown", lambda: None)()
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if to_train is not None and a.steps:
        train(*to_train, path, a.steps, cache)


def train(cfg, kept: list, path: str, steps: int, cache: Path) -> None:
    """`steps` GRPO steps of `cfg` from the base on the problems its filter kept: TRL's own
    frac_reward_zero_std per step (the table's estimate, from the trainer itself)."""
    import shutil

    from grpo_core.train.grpo import run_grpo_round

    cfg = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update={"max_steps": steps})})
    out = cache / "grpo-check"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = run_grpo_round(path, kept, cfg, out, cfg.model.template, report_to=[])
    keys = ("frac_reward_zero_std", "reward", "reward_std", "rewards/accuracy/mean", "loss",
            "grad_norm", "completions/clipped_ratio")
    print(f"GRPO check: {steps} steps on {len(kept)} kept problems, "
          f"{time.perf_counter() - t0:.0f} s, load {load()}")
    for h in res.history:
        if "reward" in h:
            print("  step", h.get("step"), "  ".join(f"{k} {h[k]:.3g}" for k in keys if k in h))
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
