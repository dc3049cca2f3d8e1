"""MATH answer pairs for scoring benchmarks: every MATH test gold (MATH-500 and the other
4,500 of ../shared/data/math) against itself, against a format variant of itself and
against another gold, each prediction written as a completion `... $\\boxed{pred}$.`.

    pairs(n_golds) -> [(gold, completion, expected verdict or None)]

The expected verdict is True for self and variant pairs and None (unlabelled: two golds of
different problems can be equal) for the other-gold pairs.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shared_data() -> Path:
    raw = os.environ.get("GRPO_SHARED_DATA")
    return Path(raw) if raw else ROOT.parent / "shared" / "data"


def math_golds() -> list[str]:
    """MATH-500's golds, then the other 4,500 test problems' (last \\boxed{} of the solution)."""
    golds: list[str] = []
    path = shared_data() / "math500" / "test.jsonl"
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            golds += [json.loads(line)["answer"] for line in fh if line.strip()]
    path = shared_data() / "math" / "train4500.jsonl"
    if path.is_file():
        sys.path.insert(0, str(ROOT))
        from grpo_core.verify.extraction import gold_from_math_solution

        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    gold = gold_from_math_solution(json.loads(line)["solution"])
                    if gold:
                        golds.append(gold)
    return golds


def variant(gold: str) -> str:
    """The same answer written another way, as models write it."""
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\dfrac")
    if re.fullmatch(r"-?\d+", gold):
        return f"{gold}.0"
    if " " in gold and not re.search(r"\d \d", gold):
        return gold.replace(" ", "")
    if gold.startswith("(") and gold.endswith(")"):
        return f"\\left({gold[1:-1]}\\right)"
    return f" {gold} "


def completion(answer: str) -> str:
    return f"Working through the cases gives this. So the answer is $\\boxed{{{answer}}}$."


def pairs(n_golds: int | None = None) -> list[tuple[str, str, bool | None]]:
    golds = math_golds()[:n_golds]
    out: list[tuple[str, str, bool | None]] = []
    for i, g in enumerate(golds):
        other = golds[(i + 7) % len(golds)]
        out += [(g, completion(g), True), (g, completion(variant(g)), True),
                (g, completion(other), None)]
    return out
