"""`synthetic:arith`: generated arithmetic word problems with exact answers.

Difficulty levels 1-5 grow in digits, operands and operations. Train and eval are
disjoint by construction: each problem text is assigned to a split by a hash, so no eval
problem can ever be generated for training, whatever the seed or the counts (arithmetic
facts are shared, as they are between any two real math sets). Reproducible from the seed.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from grpo_core.data.problems import Problem

SOURCE = "synthetic:arith"
LEVELS = (1, 2, 3, 4, 5)
EVAL_SHARE = 10  # one expression in EVAL_SHARE hashes to the eval split

NAMES = ["Sam", "Ana", "Lee", "Mia", "Tom", "Zoe", "Raj", "Eva"]
ITEMS = ["apples", "coins", "books", "pens", "cards", "shells"]


@dataclass(frozen=True)
class Expr:
    """Operands and operators, evaluated left to right except * first (as written)."""

    nums: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def text(self) -> str:
        parts = [str(self.nums[0])]
        for op, n in zip(self.ops, self.nums[1:]):
            parts += [op, str(n)]
        return " ".join(parts)

    def steps(self) -> tuple[list[str], int]:
        """Worked steps, one operation each, and the value (only a leading * is allowed)."""
        value, lines = self.nums[0], []
        for op, n in zip(self.ops, self.nums[1:]):
            new = value * n if op == "*" else value + n if op == "+" else value - n
            lines.append(f"{value} {op} {n} = {new}")
            value = new
        return lines, value


def _draw(level: int, rng: random.Random) -> Expr:
    r = rng.randint
    if level == 1:
        return Expr((r(1, 9), r(1, 9)), ("+",))
    if level == 2:
        a, b = r(10, 99), r(1, 9)
        return Expr((a, b), (rng.choice("+-"),))
    if level == 3:
        a, b = r(10, 99), r(10, 99)
        if rng.random() < 0.5 and a > b:
            return Expr((a, b), ("-",))
        return Expr((a, b), ("+",))
    if level == 4:
        return Expr((r(10, 99), r(10, 99), r(1, 9)), ("+", rng.choice("+-")))
    if level == 5:
        return Expr((r(10, 99), r(2, 9), r(10, 99)), ("*", rng.choice("+-")))
    raise ValueError(f"level must be 1-5, got {level}")


def split_of(problem_text: str) -> str:
    digest = hashlib.sha256(problem_text.encode()).digest()
    return "eval" if digest[0] % EVAL_SHARE == 0 else "train"


def _wording(expr: Expr, rng: random.Random) -> str:
    """Plain 'What is ...?' or, for one-operation sums and differences, a word problem."""
    if len(expr.ops) == 1 and expr.ops[0] in "+-" and rng.random() < 0.4:
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        a, b = expr.nums
        if expr.ops[0] == "+":
            return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?"
        return f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?"
    return f"What is {expr.text}?"


def solution_text(expr: Expr) -> str:
    lines, value = expr.steps()
    return " ".join(f"{line}." for line in lines) + f" The answer is {value}."


def generate_problems(
    split: str = "train",
    n: int = 1000,
    levels: list[int] | tuple[int, ...] | None = None,
    seed: int = 0,
) -> list[Problem]:
    """n distinct problems of `split` ("train" or "eval"/"test"), levels cycled evenly."""
    want = "eval" if split in ("eval", "test") else "train"
    active = list(levels or LEVELS)
    rng = random.Random(f"{SOURCE}/{want}/{seed}")
    seen: set[str] = set()
    misses = {lv: 0 for lv in active}  # consecutive misses: level 1 has few distinct texts
    out: list[Problem] = []
    while len(out) < n:
        if not active:
            raise ValueError(f"cannot draw {n} distinct {want} problems at levels {levels}")
        level = active[len(out) % len(active)]
        expr = _draw(level, rng)
        text = _wording(expr, rng)
        if split_of(text) != want or text in seen:
            misses[level] += 1
            if misses[level] > 2000:  # this level's pool is exhausted
                active.remove(level)
            continue
        misses[level] = 0
        seen.add(text)
        _, value = expr.steps()
        out.append(
            Problem(
                source=SOURCE,
                split=want,
                problem=text,
                answer=str(value),
                solution=solution_text(expr),
                level=level,
                subject="arithmetic",
                id=f"{SOURCE}/{want}/{seed}/{len(out)}",
            )
        )
    return out


def arithmetic_facts(seed: int = 0, n_two_digit: int = 600) -> list[str]:
    """Arithmetic facts as a textbook states them ("7 + 5 = 12."): the general knowledge a
    base model brings from pretraining. No problem text, of either split, is in here."""
    rng = random.Random(f"{SOURCE}/facts/{seed}")
    facts = [f"{a} + {b} = {a + b}." for a in range(10) for b in range(10)]
    facts += [f"{a} - {b} = {a - b}." for a in range(10) for b in range(a + 1)]
    for _ in range(n_two_digit):
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        facts.append(f"{a} + {b} = {a + b}." if rng.random() < 0.5 else f"{a} - {b} = {a - b}.")
    rng.shuffle(facts)
    return facts
