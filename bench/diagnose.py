"""Fault injection for the diagnosis rules: each injected fault fires its code, and healthy
rounds of the shipped recipe fire no warning, on short real GRPO rounds of the built-in model.

    .venv/bin/python bench/diagnose.py [--quick] [--steps 20] [--seeds 3] [--only NAME,...]
                                       [--cache DIR] [--save DIR]

Every run is the R1-Zero recipe (configs/recipes/r1_zero.yaml: builtin:tiny-arith, lr 1e-4,
beta 0, 8 prompts x G=8, 40 tokens, accuracy + format + tag_count) for --steps optimizer
steps on the pool its difficulty filter keeps (over the first --filter-problems problems of
its training data), with one thing broken:

    truncation            grpo.max_completion_length 6: every completion cut off
    reward_collapse_zero  level-5 problems only, no filter: nothing is ever solved
    reward_collapse_one   only problems the policy solves 8/8 (its filter's too-easy ones).
                          The base model has none, so the policy is one that has learned
                          16 level-1 problems (easy_setup), trained on those again
    no_diversity          grpo.temperature 0.05: the G completions of a prompt agree
    length_shrinking      the `length` reward with a negative weight (the wrong sign): its
                          penalty for being short of min_tokens becomes a bonus for brevity
    kl_rising             grpo.learning_rate 100x the recipe's, with grpo.beta 0.04
    nonfinite             a reward function that returns NaN when the answer is empty

Findings are `diagnose(result.history, cfg)` plus the round's own in-round stops and
notes (result.findings: the collapse note, the divergence stops). A fault passes when one of
its expected codes fires; "detected at step" is the first step k at which the rules over
steps 1..k (or the in-round guard) report it. A healthy run (--seeds seeds of the unchanged
recipe) passes with no warn or stop finding; info findings are listed, not counted.

--quick: truncation, nonfinite and one healthy seed, 12 steps, a 96-problem filter.
Measured on the 2-core dev machine, shared with other jobs: --quick 210 s; the full set
2117 s from nothing (filter 320 s, the two SFT models 484 + 164 s, load average 3-8), 266 s
with a warm --cache (the ten GRPO runs alone, 15-90 s each at load ~2).
--cache DIR keeps the filter's pool and the SFT models between runs (the full set builds
two SFT models: the sft_grpo recipe's cold start, then the too-easy policy). --save DIR
writes each run's history as JSON lines (`grpo diagnose --history FILE` reads them).
"""
from __future__ import annotations

import argparse
import atexit
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import ROOT, load, markdown_table, timed

RECIPE = ROOT / "configs" / "recipes" / "r1_zero.yaml"
SFT_RECIPE = ROOT / "configs" / "recipes" / "sft_grpo.yaml"


@dataclass(frozen=True)
class Case:
    name: str
    expected: tuple[str, ...]  # any of these counts as detected; () for a healthy run
    overrides: tuple[str, ...] = ()  # --set style, over the recipe
    pool: str = "band"  # band (the recipe's filter) | hardest | easiest (with its own policy)
    seed: int = 0


FAULTS = [
    Case("truncation", ("truncation",), ("grpo.max_completion_length=6",)),
    Case("reward_collapse_zero", ("reward_collapse_zero",), pool="hardest"),
    Case("reward_collapse_one", ("reward_collapse_one",), pool="easiest"),
    Case("no_diversity", ("no_diversity",), ("grpo.temperature=0.05",)),
    # The negative weight turns length's "too short" penalty (every completion here is
    # below min_tokens 200) into a bonus growing as the completion shrinks.
    Case("length_shrinking", ("length_shrinking",),
         ("rewards.funcs=[accuracy,format,tag_count,length]", "rewards.weights=[1.0,0.5,0.5,-1.0]")),
    Case("kl_rising", ("kl_rising", "kl_ceiling", "nonfinite"),
         ("grpo.learning_rate=0.01", "grpo.beta=0.04")),
    Case("nonfinite", ("nonfinite",),
         ("rewards.funcs=[accuracy,format,tag_count,digit_share]", "rewards.weights=[1.0,0.5,0.5,0.1]")),
]
QUICK = ("truncation", "nonfinite")


def digit_share(completions: list, **kwargs) -> list[float]:
    """A bench-local reward with a real bug: the share of digits in the answer, computed as
    0/0 = NaN (numpy semantics) when the answer is empty or missing."""
    import numpy as np

    from grpo_core.verify.extraction import extract_answer
    from grpo_core.verify.rewards import completion_text

    out = []
    for c in completions:
        answer = extract_answer(completion_text(c)) or ""
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(float(np.float64(sum(ch.isdigit() for ch in answer)) / np.float64(len(answer))))
    return out


def register_bench_rewards() -> None:
    """The nonfinite fault's reward must be in the registry before its config is built
    (RewardsConfig checks names against grpo_core.verify.rewards.REWARDS): registered here,
    in this process only; the library's registry is not changed on disk."""
    from grpo_core.verify import rewards

    rewards.REWARDS.setdefault("digit_share", digit_share)


# ------------------------------------------------------------------------ pools and models

def recipe_config(path: Path, overrides: list[str]):
    from grpo_core.config import load_config

    return load_config(path, overrides)


def band_pool(cfg, n: int, cache: Path, model: str) -> tuple[list, dict]:
    """The recipe's filter (k, temperature, band) over the first n problems of its training
    data: the problems a pipeline run would train on. Cached by what decides it."""
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter, sampling_key

    spec = cfg.data.train[0]
    problems = generate_problems("train", n, levels=list(spec.levels))
    key = f"{sampling_key(cfg, cfg.model.template)}-{n}-{'-'.join(map(str, spec.levels))}"
    path = cache / f"band-{key}.json"
    if path.is_file():
        info = {**json.loads(path.read_text()), "cached": True}
    else:
        report = run_filter(model, problems, cfg, models_cache=str(cache / "models"))
        info = {"kept": [p.id for p in report.kept], "counts": report.counts,
                "seconds": round(report.seconds, 1)}
        path.write_text(json.dumps(info))
    by_id = {p.id: p for p in problems}
    return [by_id[i] for i in info["kept"]], info


def sft(model: str, problems: list, out: Path, overrides: list[str]) -> float:
    """The sft_grpo recipe's SFT section (with overrides) on `problems`; out/final, once."""
    from grpo_core.train.sft import run_sft

    if (out / "final" / "config.json").is_file():
        return 0.0
    cfg = recipe_config(SFT_RECIPE, overrides)
    shutil.rmtree(out, ignore_errors=True)
    return timed(lambda: run_sft(model, problems, cfg, out, cfg.model.template))[1]


def easy_setup(base: str, cache: Path, n: int = 16) -> tuple[str, list, str]:
    """(policy, pool, note) for the too-easy fault. The built-in base model has no easy
    problem (its filter over level-1 problems: none solved 8/8, mean pass rate ~0.08), and
    the sft_grpo recipe's cold start has few (2 of 96 level-1 problems at 8/8, ~0.5 on the
    rest). So the policy first learns a small pool, as one has when a later round trains on
    a pool it already learned without re-filtering: the cold start, then the same SFT for
    150 steps on n level-1 problems; the pool is those its filter rates too easy (8/8)."""
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.difficulty import run_filter

    cold = recipe_config(SFT_RECIPE, [])
    spec = cold.data.train[0]
    t_cold = sft(base, generate_problems("train", spec.limit, levels=list(spec.levels)), cache / "sft", [])
    easy = generate_problems("train", n, levels=[1])
    t_easy = sft(str(cache / "sft" / "final"), easy, cache / "sft-easy", ["sft.max_steps=150"])
    model = str(cache / "sft-easy" / "final")
    path = cache / f"easy-{n}.json"
    if not path.is_file():
        report = run_filter(model, easy, recipe_config(RECIPE, []), models_cache=str(cache / "models"))
        path.write_text(json.dumps({"rates": [r["pass_rate"] for r in report.estimates],
                                    "seconds": round(report.seconds, 1)}))
    rates = json.loads(path.read_text())["rates"]  # in the order of `easy`
    ranked = sorted(range(n), key=lambda i: -rates[i])
    ones = [i for i in ranked if rates[i] >= 1.0]
    keep = ones if len(ones) >= 8 else ranked[:8]  # one optimizer step's prompts at least
    took = lambda t: f"{t:.0f} s" if t else "cached"
    note = (f"policy: sft_grpo cold start ({took(t_cold)}) + 150 SFT steps on {n} level-1 problems "
            f"({took(t_easy)}); its filter: {len(ones)} of {n} solved 8/8, "
            f"pool {len(keep)} (pass rates {min(rates[i] for i in keep):.3g}-1)")
    return model, [easy[i] for i in sorted(keep)], note


# ------------------------------------------------------------------------ one run

@dataclass
class Outcome:
    case: Case
    fired: list[tuple[str, str]] = field(default_factory=list)  # (code, severity), in rule order
    first: dict[str, int] = field(default_factory=dict)  # code -> step it was first detected at
    steps: int = 0
    stopped_early: bool = False
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)

    @property
    def detected(self) -> list[str]:
        return [c for c, _ in self.fired if c in self.case.expected]

    @property
    def alarms(self) -> list[tuple[str, str]]:
        return [f for f in self.fired if f[1] in ("warn", "stop")]

    @property
    def passed(self) -> bool:
        return bool(self.detected) if self.case.expected else not self.alarms


def first_detection(history: list[dict], cfg) -> dict[str, int]:
    """code -> the first step k at which the rules over steps 1..k report it: when a
    diagnosis run after step k would have caught the fault."""
    from grpo_core.train.diagnosis import diagnose

    first: dict[str, int] = {}
    for k in range(1, len(history) + 1):
        for f in diagnose(history[:k], cfg):
            first.setdefault(f.code, int(history[k - 1].get("step", k)))
    return first


def run_case(case: Case, steps: int, problems: list, model: str, work: Path) -> Outcome:
    from grpo_core.train.diagnosis import diagnose
    from grpo_core.train.grpo import run_grpo_round

    common = [f"grpo.max_steps={steps}", f"grpo.save_steps={steps}", f"project.seed={case.seed}"]
    cfg = recipe_config(RECIPE, common + list(case.overrides))
    out = work / f"{case.name}-{case.seed}"
    result, seconds = timed(lambda: run_grpo_round(model, problems, cfg, out, cfg.model.template))
    shutil.rmtree(out, ignore_errors=True)  # checkpoints: only the history is kept
    fired = [(f.code, f.severity) for f in diagnose(result.history, cfg)]
    first = first_detection(result.history, cfg)
    for note in result.findings:  # the round's own (grpo_core.findings.Finding)
        fired.append((note.code, note.severity))
        if note.steps:
            first[note.code] = min(min(note.steps), first.get(note.code, min(note.steps)))
    return Outcome(case, fired, first, result.steps, result.stopped_early, seconds, result.history)


# ------------------------------------------------------------------------ report

def _fmt(fired) -> str:
    return ", ".join(dict.fromkeys(f"{code}[{sev}]" for code, sev in fired)) or "-"


def detected_at(o: Outcome) -> str:
    steps = [o.first[c] for c in o.detected if c in o.first]
    return str(min(steps)) if steps else "-"


def history_line(o: Outcome) -> str:
    """The metrics the rules read, first and last step: was the fault really there?"""
    keys = {"acc": "rewards/accuracy/mean", "zero_std": "frac_reward_zero_std",
            "len": "completions/mean_length", "clipped": "completions/clipped_ratio", "kl": "kl",
            "entropy": "entropy"}
    h = o.history
    if not h:
        return "no steps logged"

    def v(row, k):
        x = row.get(keys[k])
        return "-" if x is None else f"{x:.3g}" if isinstance(x, float) and math.isfinite(x) else str(x)

    return "  ".join(f"{k} {v(h[0], k)} -> {v(h[-1], k)}" for k in keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK)} and one healthy seed")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (20; --quick 12)")
    ap.add_argument("--seeds", type=int, default=None, help="healthy runs of the recipe (3; --quick 1)")
    ap.add_argument("--filter-problems", type=int, default=None,
                    help="problems the recipe's filter estimates for the healthy pool (160; --quick 96)")
    ap.add_argument("--only", default=None, help="comma-separated fault names, and/or 'healthy'")
    ap.add_argument("--cache", type=Path, default=None, help="keep the filter's pool and the SFT model here")
    ap.add_argument("--save", type=Path, default=None, help="write each run's history here (JSON lines)")
    args = ap.parse_args()
    steps = args.steps or (12 if args.quick else 20)
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 3)
    n_filter = args.filter_problems or (96 if args.quick else 160)
    names = set(args.only.split(",")) if args.only else set(QUICK) | {"healthy"} if args.quick else None
    unknown = sorted((names or set()) - {c.name for c in FAULTS} - {"healthy"})
    if unknown:
        ap.error(f"--only: unknown {unknown}; known: {[c.name for c in FAULTS] + ['healthy']}")

    from flows.cli_common import quiet_libraries

    quiet_libraries()  # before transformers/TRL are imported: no warnings, no dataset bars
    register_bench_rewards()
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import resolve_model_path

    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    atexit.register(shutil.rmtree, tmp, True)
    cache = args.cache or tmp
    cache.mkdir(parents=True, exist_ok=True)
    base = resolve_model_path("builtin:tiny-arith", cache / "models")
    recipe = recipe_config(RECIPE, [])
    cases = [c for c in FAULTS if names is None or c.name in names]
    cases += [Case("healthy", (), seed=s) for s in range(seeds) if names is None or "healthy" in names]

    setups: dict[str, Callable[[], tuple[str, list]]] = {
        "hardest": lambda: (base, generate_problems("train", 64, levels=[5])),
    }
    if any(c.pool == "band" for c in cases):
        band, info = band_pool(recipe, n_filter, cache, base)
        print(f"pool: the recipe's filter kept {len(band)} of {n_filter} problems {info['counts']} "
              f"(band {list(recipe.filter.band)}, k={recipe.filter.k}; {info['seconds']} s"
              f"{', cached' if info.get('cached') else ''})")
        setups["band"] = lambda: (base, band)
    if any(c.pool == "easiest" for c in cases):
        easy_model, easy_pool, note = easy_setup(base, cache)
        print(f"easiest pool: {note}")
        setups["easiest"] = lambda: (easy_model, easy_pool)

    outcomes = []
    for case in cases:
        model, problems = setups[case.pool]()
        o = run_case(case, steps, problems, model, tmp)
        outcomes.append(o)
        print(f"  {case.name}{'' if case.expected else f' seed {case.seed}'}: {o.steps} steps "
              f"in {o.seconds:.0f} s{' (stopped early)' if o.stopped_early else ''}: {_fmt(o.fired)}", flush=True)
        print(f"    {history_line(o)}", flush=True)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps(r) + "\n" for r in o.history)
            (args.save / f"{case.name}-{case.seed}.jsonl").write_text(lines)

    faults = [o for o in outcomes if o.case.expected]
    healthy = [o for o in outcomes if not o.case.expected]
    print(f"\nFault injection, {steps} steps a run (builtin:tiny-arith, {RECIPE.relative_to(ROOT)})")
    print(markdown_table(
        ["fault", "expected", "fired (severity)", "detected at step", "result"],
        [[o.case.name, ", ".join(o.case.expected), _fmt(o.fired), detected_at(o),
          "pass" if o.passed else "FAIL"] for o in faults]))
    if healthy:
        print("\nHealthy runs of the recipe: warn-or-stop findings (false positives)")
        print(markdown_table(["run", "fired (severity)", "false positives", "result"],
                             [[f"seed {o.case.seed}", _fmt(o.fired), _fmt(o.alarms),
                               "pass" if o.passed else "FAIL"] for o in healthy]))
    detected = sum(o.passed for o in faults)
    false_pos = sum(len(o.alarms) for o in healthy)
    print(f"\ndetected {detected}/{len(faults)} faults by their code; {false_pos} warn-or-stop findings "
          f"on {len(healthy)} healthy runs; {time.perf_counter() - t0:.0f} s wall, load {load()}")
    raise SystemExit(0 if all(o.passed for o in outcomes) else 1)


if __name__ == "__main__":
    main()
