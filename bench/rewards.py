"""Accuracy-reward throughput: ours against calling math-verify directly, side by side.

    .venv/bin/python bench/rewards.py [--gsm8k-prompts 200] [--math-prompts 100]
                                      [--math500-prompts 480]

For each prompt, a group of G=8 completions `<think>...</think><answer>...</answer>`:
3 correct answers written different ways and 5 wrong ones. "ours" is
`grpo_core.verify.rewards.accuracy` on the group (gold parsed once, plain numbers compared
exactly, verdicts cached, math-verify for the rest); "math-verify" is what a reward
function does without any of that: `verify(parse(gold), parse(answer))` per completion. Inputs come from ../shared/data when present (GSM8K test, MATH-500), else
synthetic ones. Each side runs in a fresh process, warmed up on 20 other prompts, then
timed with cold caches on the measured prompts.

Then the MATH-answer-pair row (bench/math_pairs.py: every MATH test gold against itself,
a format variant and another gold, each as a completion `... $\\boxed{pred}$.`), scored
one pair per call, each side in a fresh process, in CPU seconds (time.process_time, so a
busy machine slows every side alike): ours is `answers.is_correct(c, gold)` (strict);
the references are raw math-verify, `verify(parse("\\boxed{gold}"), parse(c))`, and the
hendrycks MATH normaliser `is_equiv(remove_boxed(last_boxed_only_string(c)), gold)` as
lm-eval ships it (lm_eval/tasks/hendrycks_math/utils.py; `bench` extra, n/a without it).
Each side's worst pair (CPU seconds) is printed beside its pairs/s.

Then the MATH-500 row of the evaluation scorer, `answers.is_correct` under each extraction
mode (strict, flexible): every MATH-500 gold (skipped when ../shared/data/math500 is absent)
with 8 completions written the ways models write them (answer tag, boxed, "The final
answer is ...", a GSM8K-style last line) and wrong ones (another problem's gold, the gold
with one digit changed). With code that predates the flexible mode, strict is scored as
`verify(parse_gold(gold), extract_answer(c))` (the same thing) and flexible is n/a.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

from harness import ROOT, machine_line  # noqa: E402 - also the repository root on sys.path

from grpo_core.verify import answers
from grpo_core.verify.gold import parse_gold
from grpo_core.verify.rewards import accuracy

G = 8


def shared_data() -> Path:
    raw = os.environ.get("GRPO_SHARED_DATA")
    return Path(raw) if raw else ROOT.parent / "shared" / "data"


def _rows(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def gsm8k_golds(n: int) -> tuple[list[str], str]:
    path = shared_data() / "gsm8k" / "test.jsonl"
    if path.is_file():
        return [answers.gold_from_gsm8k(r["answer"]) for r in _rows(path)][:n], "gsm8k/test.jsonl"
    rng = random.Random(0)
    return [str(rng.randint(1, 100_000)) for _ in range(n)], "synthetic integers"


def math_golds(n: int) -> tuple[list[str], str]:
    path = shared_data() / "math500" / "test.jsonl"
    if path.is_file():
        return [r["answer"] for r in _rows(path)][:n], "math500/test.jsonl"
    rng = random.Random(0)
    forms = [
        "\\frac{{{a}}}{{{b}}}",
        "{a}\\sqrt{{{b}}}",
        "({a}, {b})",
        "\\frac{{\\pi}}{{{b}}}",
        "{a}",
    ]
    return [
        rng.choice(forms).format(a=rng.randint(1, 99), b=rng.randint(2, 99)) for _ in range(n)
    ], "synthetic LaTeX"


def completion(answer: str) -> str:
    return f"<think>Let me work through it step by step. So we get this.</think>\n<answer>{answer}</answer>"


def gsm8k_group(golds: list[str], i: int) -> list[str]:
    g = golds[i]
    v = Fraction(g)
    correct = [g, f"{int(v):,}" if v.denominator == 1 else g, f"{g}.0"]
    wrong = [str(v + 1), str(v - 1), str(v * 2), str(v + 10), "0" if v else "1"]
    return [completion(a) for a in correct + wrong]


def math_group(golds: list[str], i: int) -> list[str]:
    g = golds[i]
    correct = [f"\\boxed{{{g}}}", f"${g}$", f"$ {g} $"]
    others = [h for h in golds[i + 1 :] + golds[:i] if h != g][:5]
    return [completion(a) for a in correct + [f"${h}$" for h in others]]


def math500_golds() -> list[str] | None:
    path = shared_data() / "math500" / "test.jsonl"
    return [r["answer"] for r in _rows(path)] if path.is_file() else None


def _one_digit_changed(g: str) -> str:
    for i, ch in enumerate(g):
        if ch.isdigit():
            return g[:i] + str((int(ch) + 1) % 10) + g[i + 1 :]
    return g + "+1"


def math500_modes_group(golds: list[str], i: int) -> list[str]:
    """4 right (tag, boxed, Minerva's "final answer", a last line) and 4 wrong completions."""
    g, other = golds[i], golds[(i + 1) % len(golds)]
    near = _one_digit_changed(g)
    think = "Let me work through it. With 3 cases and 5 options we get this."
    return [
        completion(g),
        f"{think} So the answer is $\\boxed{{{g}}}$.",
        f"{think}\nFinal Answer: The final answer is ${g}$. I hope it is correct.",
        f"{think}\nThe answer is {g}",
        completion(other),
        f"{think} So the answer is $\\boxed{{{near}}}$.",
        f"{think}\nThe answer is ${near}$.",
        f"{think} Hence {other}",
    ]


def score_modes(mode: str, groups: list[tuple[str, list[str]]]) -> list:
    if hasattr(answers, "is_correct"):
        return [answers.is_correct(c, g, extraction=mode) for g, group in groups for c in group]
    if mode != "strict":
        return []  # code from before the flexible extraction
    return [
        answers.verify(parse_gold(g), answers.extract_answer(c))
        for g, group in groups
        for c in group
    ]


def measure_modes(mode: str, n_prompts: int, warm_n: int = 20) -> dict:
    answers.warm_up()
    golds = math500_golds() or []
    groups = [(golds[i], math500_modes_group(golds, i)) for i in range(len(golds))]
    groups = groups[warm_n:][:n_prompts] + groups[:warm_n]  # warm on the last ones
    score_modes(mode, groups[-warm_n:])
    answers.clear_caches()
    start = time.perf_counter()
    verdicts = score_modes(mode, groups[:-warm_n])
    return {"seconds": time.perf_counter() - start, "verdicts": verdicts}


def ours(groups: list[tuple[str, list[str]]]) -> list:
    return [v for gold, group in groups for v in accuracy(group, answer=[gold] * len(group))]


def naive(groups: list[tuple[str, list[str]]]) -> list:
    """Per completion: parse the gold, parse the answer (found with the same extraction:
    math-verify alone does not read `<answer>18</answer>`), verify."""
    from math_verify import parse, verify

    out = []
    for gold, group in groups:
        for c in group:
            pred = answers.extract_answer(c) or ""
            out.append(1.0 if verify(parse(f"\\boxed{{{gold}}}"), parse(pred)) else 0.0)
    return out


def measure(side: str, kind: str, n_prompts: int, warm_n: int = 20) -> dict:
    """Time one side on one kind of answers (run in a fresh process: see main)."""
    answers.warm_up()
    golds, source = (gsm8k_golds if kind == "gsm8k" else math_golds)(n_prompts + warm_n)
    make = gsm8k_group if kind == "gsm8k" else math_group
    groups = [(golds[i], make(golds, i)) for i in range(len(golds))]
    fn = ours if side == "ours" else naive
    fn(groups[:warm_n])  # first-use costs of both libraries, on prompts not measured
    answers.clear_caches()
    start = time.perf_counter()
    verdicts = fn(groups[warm_n:])
    return {"seconds": time.perf_counter() - start, "verdicts": verdicts, "source": source}


def _hendrycks():
    """lm-eval's hendrycks_math utils (is_equiv, the boxed helpers), or None when absent.
    Loaded from its file: importing the lm_eval package pulls its whole task registry."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "tasks" / "hendrycks_math" / "utils.py"
    mod_spec = importlib.util.spec_from_file_location("hendrycks_math_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def pair_scorer(side: str):
    """One pair -> verdict, for `side` (ours, math-verify, hendrycks); None if unavailable."""
    if side == "ours":
        answers.warm_up()
        return lambda gold, c: answers.is_correct(c, gold)
    if side == "math-verify":
        from math_verify import parse, verify

        answers.warm_up()  # the same first-use costs paid outside the timing
        return lambda gold, c: verify(parse(f"\\boxed{{{gold}}}"), parse(c))
    h = _hendrycks()
    if h is None:
        return None

    def hendrycks(gold: str, c: str) -> bool:
        boxed = h.last_boxed_only_string(c)
        return bool(boxed) and h.is_equiv(h.remove_boxed(boxed), gold)

    return hendrycks


def measure_pairs(side: str, n_golds: int, warm_n: int = 200) -> dict:
    from math_pairs import pairs

    every = pairs(n_golds + warm_n)
    scored, warm = every[: 3 * n_golds], every[3 * n_golds :]
    score = pair_scorer(side)
    if score is None:
        return {"verdicts": []}
    for gold, c, _ in warm:  # first-use costs (imports, sympy caches) on other golds
        score(gold, c)
    answers.clear_caches()
    verdicts, worst, clock = [], 0.0, time.process_time
    start = clock()
    for gold, c, _ in scored:
        t = clock()
        verdicts.append(bool(score(gold, c)))
        worst = max(worst, clock() - t)
    seconds = clock() - start
    return {"seconds": seconds, "worst": worst, "verdicts": verdicts,
            "expected": [e for _, _, e in scored]}


def pairs_row(n_golds: int) -> None:
    """MATH answer pairs: ours against raw math-verify and the hendrycks normaliser."""
    from math_pairs import math_golds

    if not math_golds():
        print(f"\nMATH answer pairs: skipped (no MATH golds under {shared_data()})")
        return
    print("\nMATH answer pairs (bench/math_pairs.py), one pair per call; CPU time")
    print(f"{'scorer':38} {'pairs':>6} {'pairs/s':>9} {'worst s':>8} {'right on self/variant':>22}"
          f" {'agree w/ ours':>14}")
    res = {}
    for side in ("ours", "math-verify", "hendrycks"):
        cmd = [sys.executable, __file__, "--worker", side, "pairs", str(n_golds)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    for side, r in res.items():
        if not r["verdicts"]:
            print(f"{side:38} n/a (lm-eval not installed: the `bench` extra)")
            continue
        labelled = [v for v, e in zip(r["verdicts"], r["expected"]) if e]
        agree = sum(a == b for a, b in zip(r["verdicts"], res["ours"]["verdicts"]))
        n = len(r["verdicts"])
        print(f"{side:38} {n:6d} {n / r['seconds']:9.0f} {r['worst']:8.3f} "
              f"{sum(labelled) / len(labelled):22.4f} {agree / n:14.4f}")
    ours, mv = res["ours"], res["math-verify"]
    rate = len(ours["verdicts"]) / ours["seconds"]
    ratio = mv["seconds"] / ours["seconds"]
    print(f"target: ours >= 2,000 pairs/s and >= math-verify: "
          f"{'met' if rate >= 2000 and ratio >= 1 else 'NOT met'} ({rate:.0f} pairs/s, "
          f"{ratio:.1f}x math-verify)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gsm8k-prompts", type=int, default=200)
    ap.add_argument("--math-prompts", type=int, default=100)
    ap.add_argument("--math500-prompts", type=int, default=480)
    ap.add_argument("--pair-golds", type=int, default=2000,
                    help="MATH golds for the answer-pair row (3 pairs each)")
    ap.add_argument("--only-pairs", action="store_true", help="only the answer-pair row")
    ap.add_argument("--worker", nargs=3, metavar=("SIDE", "KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        side, kind, n = args.worker
        if kind == "pairs":
            out = measure_pairs(side, int(n))
        elif kind == "modes":
            out = measure_modes(side, int(n))
        else:
            out = measure(side, kind, int(n))
        print(json.dumps(out))
        return
    print(machine_line())
    if args.only_pairs:
        pairs_row(args.pair_golds)
        return
    # Each side runs in its own fresh process: sympy's global cache would otherwise let
    # whichever side runs second reuse the first side's work.
    print(f"accuracy reward, G={G} completions per prompt (3 right, 5 wrong); completions/s")
    print(
        f"{'answers (source)':38} {'n':>5} {'ours':>9} {'math-verify':>12} {'ratio':>7} {'agree':>6}"
    )
    ratios = []
    for kind, n, label in (
        ("gsm8k", args.gsm8k_prompts, "GSM8K-style"),
        ("math", args.math_prompts, "MATH-500-style"),
    ):
        res = {}
        for side in ("ours", "naive"):
            cmd = [sys.executable, __file__, "--worker", side, kind, str(n)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            res[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        a, b = res["ours"], res["naive"]
        total = len(a["verdicts"])
        agree = sum(x == y for x, y in zip(a["verdicts"], b["verdicts"])) / total
        ratios.append(b["seconds"] / a["seconds"])
        print(
            f"{label + ' (' + a['source'] + ')':38} {total:5d} {total / a['seconds']:9.0f} "
            f"{total / b['seconds']:12.0f} {ratios[-1]:6.1f}x {agree:6.3f}"
        )
    print(f"target >= 1.5x: {'met' if min(ratios) >= 1.5 else 'NOT met'} (min {min(ratios):.1f}x)")
    modes_row(args.math500_prompts)
    pairs_row(args.pair_golds)


def modes_row(n: int) -> None:
    """answers.is_correct per extraction mode on MATH-500, each in a fresh process."""
    if math500_golds() is None:
        print(f"\nMATH-500 by extraction mode: skipped ({shared_data() / 'math500'} not found)")
        return
    print("\nevaluation scorer (answers.is_correct), MATH-500, 8 completions per gold")
    print(f"{'extraction':38} {'n':>5} {'compl/s':>9} {'judged right':>13}")
    for mode in ("strict", "flexible"):
        cmd = [sys.executable, __file__, "--worker", mode, "modes", str(n)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        total = len(res["verdicts"])
        if not total:
            print(f"{mode:38} {'':>5} {'n/a':>9} (no {mode} extraction in this code)")
            continue
        right = sum(res["verdicts"]) / total
        print(f"{mode:38} {total:5d} {total / res['seconds']:9.0f} {right:13.3f}")


if __name__ == "__main__":
    main()
