"""Fuzz: no reward raises, runs code, or takes 1 s on a completion, in any thread.

A hand-written corpus of hostile completions (tests/hostile_corpus.py: injection attempts,
power towers, 10,000-deep nesting, megabyte strings, NUL/RTL/zero-width characters, fake
and nested tags) plus hypothesis-generated text and LaTeX-ish token soup.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hostile_corpus import hostile_completions, odd_completions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_core import answers
from grpo_core.rewards import REWARDS

LIMIT_S = 1.0
GOLDS = ["5", "\\frac{1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)"]


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    answers.warm_up()  # import + first-use costs, paid once outside any timing


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a relative `touch CANARY` would land here too
    path = tmp_path / "CANARY"
    yield path
    assert not path.exists(), "a reward executed model output"
    assert list(tmp_path.iterdir()) == [], "a reward wrote a file"


def score(name: str, completion, gold: str) -> float:
    """Call one reward on one completion; return the seconds it took. Raises on misuse."""
    start = time.perf_counter()
    out = REWARDS[name]([completion], answer=[gold], prompts=["Question: ... <think>"])
    took = time.perf_counter() - start
    assert isinstance(out, list) and len(out) == 1
    assert out[0] is None or isinstance(out[0], float)
    return took


def _jobs(canary: Path) -> list[tuple[str, str, str, str]]:
    corpus = hostile_completions(str(canary))
    return [
        (n, label, c, GOLDS[i % len(GOLDS)]) for n in REWARDS for i, (label, c) in enumerate(corpus)
    ]


def _check(jobs, times) -> None:
    slow = sorted(((t, n, label) for t, (n, label, _, _) in zip(times, jobs)), reverse=True)
    print(f"\nslowest: {[(n, label, round(t, 3)) for t, n, label in slow[:5]]}")
    over = [(i, t) for i, t in enumerate(times) if t >= LIMIT_S]
    # A GC pause or a busy machine can stretch one call; an unbounded input is slow twice.
    again = [
        (jobs[i][0], jobs[i][1], round(t, 3), round(score(jobs[i][0], jobs[i][2], jobs[i][3]), 3))
        for i, t in over
    ]
    print(f"over {LIMIT_S} s once, then re-measured: {again}")
    assert all(t2 < LIMIT_S for *_, t2 in again), f"calls over {LIMIT_S} s twice: {again}"


def test_corpus_is_large_enough(canary: Path) -> None:
    assert len(hostile_completions(str(canary))) >= 200


def test_hostile_corpus_main_thread(canary: Path) -> None:
    answers.clear_caches()
    jobs = _jobs(canary)
    _check(jobs, [score(n, c, g) for n, _, c, g in jobs])


def test_hostile_corpus_worker_threads(canary: Path) -> None:
    answers.clear_caches()  # every verdict recomputed off the main thread
    jobs = _jobs(canary)
    with ThreadPoolExecutor(4) as pool:
        times = list(pool.map(lambda j: score(j[0], j[2], j[3]), jobs))
    _check(jobs, times)


def test_odd_shapes_and_batches(canary: Path) -> None:
    odd = odd_completions()
    for name, fn in REWARDS.items():
        out = fn(
            odd,
            answer=["5"] * len(odd),
            prompts=[None] * len(odd),
            completion_ids=[None] * len(odd),
        )
        assert len(out) == len(odd), name
        # Whole hostile batch at once, as TRL calls it.
        batch = [c for _, c in hostile_completions(str(canary))[:64]]
        assert len(fn(batch, answer=["5"] * len(batch))) == len(batch)


LATEX_TOKENS = [
    "0",
    "1",
    "9",
    "99",
    "12345",
    ".",
    ",",
    "+",
    "-",
    "*",
    "**",
    "/",
    "^",
    "!",
    "=",
    "%",
    "\\%",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "\\{",
    "\\}",
    "x",
    "e",
    "i",
    "\\pi",
    "\\infty",
    " ",
    "\\frac",
    "\\dfrac",
    "\\sqrt",
    "\\boxed{",
    "\\fbox{",
    "\\sum_",
    "\\prod_",
    "\\int",
    "\\lim_",
    "\\binom",
    "\\left(",
    "\\right)",
    "\\text{",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "\\\\",
    "&",
    "$",
    "\\cdot",
    "\\times",
    "\\log",
    "\\sin",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "__import__('os')",
    "eval(",
    "\x00",
    "\u202e",
    "\u200b",
]
TEMPLATES = [
    "{}",
    "<think>x</think><answer>{}</answer>",
    "so \\boxed{{{}}}",
    "<answer>${}$</answer>",
    "The final answer is {}. I hope it is correct.",
]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=st.one_of(
        st.text(max_size=300),
        st.lists(st.sampled_from(LATEX_TOKENS), max_size=60).map("".join),
    ),
    template=st.sampled_from(TEMPLATES),
    gold=st.sampled_from(GOLDS),
)
def test_hypothesis_rewards_never_raise_and_stay_fast(body: str, template: str, gold: str) -> None:
    completion = template.format(body)
    for name in REWARDS:
        assert score(name, completion, gold) < LIMIT_S, (name, completion)
        assert score(name, [{"role": "assistant", "content": completion}], gold) < LIMIT_S


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    gold=st.one_of(
        st.text(max_size=200), st.lists(st.sampled_from(LATEX_TOKENS), max_size=40).map("".join)
    )
)
def test_hypothesis_hostile_golds(gold: str) -> None:
    # The gold parse shares the completion's time budget: still under the limit.
    assert score("accuracy", "<answer>5</answer>", gold) < LIMIT_S
