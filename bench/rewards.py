"""Accuracy-reward throughput: ours against calling math-verify directly, side by side.

    .venv/bin/python bench/rewards.py [--gsm8k-prompts 200] [--math-prompts 100]

For each prompt, a group of G=8 completions `<think>...</think><answer>...</answer>`:
3 correct answers written different ways and 5 wrong ones. "ours" is
`grpo_core.rewards.accuracy` on the group (gold parsed once, plain numbers compared
exactly, verdicts cached, math-verify for the rest); "math-verify" is what a reward
function does without any of that: `verify(parse(gold), parse(answer))` per completion. Inputs come from ../shared/data when present (GSM8K test, MATH-500), else
synthetic ones. Each side runs in a fresh process, warmed up on 20 other prompts, then
timed with cold caches on the measured prompts.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_core import answers
from grpo_core.rewards import accuracy

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gsm8k-prompts", type=int, default=200)
    ap.add_argument("--math-prompts", type=int, default=100)
    ap.add_argument("--worker", nargs=3, metavar=("SIDE", "KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        side, kind, n = args.worker
        print(json.dumps(measure(side, kind, int(n))))
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


if __name__ == "__main__":
    main()
