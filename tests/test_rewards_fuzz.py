"""Fuzz: no reward and not the evaluation scorer raises, runs code, takes 1 s on a completion
or holds unbounded memory, from the main thread, worker threads or worker processes.

A hand-written corpus of hostile completions (tests/hostile_corpus.py: injection attempts,
power towers, 10,000-deep nesting, megabyte strings, NUL/RTL/zero-width characters, fake
and nested tags) plus hypothesis-generated text and LaTeX-ish token soup. "Scorers" are
every reward of grpo_core.verify.rewards.REWARDS plus the evaluation scorer
(grpo_core.eval.evaluation's `_record` + maj@k's `vote_key`; see hostile_corpus.timed_call),
and `answers.is_correct` under each extraction mode.
The corpus also causes no scorer error (answers.SCORER_ERRORS): hostile input is a wrong
answer or a refusal, not a failure of the scorer.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import pytest
from hostile_corpus import (
    EVAL_SCORER,
    GOLDS,
    fuzz_jobs,
    hostile_completions,
    init_worker,
    odd_completions,
    scorer_names,
    time_chunk,
    timed_call,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_core.verify import answers
from grpo_core.verify.gold import parse_gold
from grpo_core.verify.rewards import REWARDS

LIMIT_S = 1.0
SCORERS = scorer_names()  # every reward, then the evaluation scorer
MB = 1_000_000


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    answers.warm_up()  # import + first-use costs, paid once outside any timing


@pytest.fixture
def canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a relative `touch CANARY` would land here too
    path = tmp_path / "CANARY"
    yield path
    assert not path.exists(), "a scorer executed model output"
    assert list(tmp_path.iterdir()) == [], "a scorer wrote a file"


score = timed_call  # (scorer, completion, gold) -> seconds; raises on a malformed result


def _jobs(canary: Path) -> list[tuple[str, str, str, str]]:
    return fuzz_jobs(str(canary))


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
    assert EVAL_SCORER in SCORERS and set(REWARDS) < set(SCORERS)


def _per_scorer_cold(jobs, run) -> list[float]:
    """run(jobs of one scorer) -> times, with the answer caches cleared before each scorer:
    the evaluation scorer recomputes its verdicts rather than reuse accuracy's."""
    times: list[float] = []
    for name in SCORERS:
        answers.clear_caches()
        times += run([j for j in jobs if j[0] == name])
    assert len(times) == len(jobs)
    return times


def test_hostile_corpus_main_thread(canary: Path) -> None:
    jobs = _jobs(canary)  # ordered by scorer, as _per_scorer_cold returns the times
    answers.SCORER_ERRORS.reset()
    _check(jobs, _per_scorer_cold(jobs, lambda js: [score(n, c, g) for n, _, c, g in js]))
    # Hostile input is a wrong answer or a refusal, never a failure of the scorer itself.
    assert answers.SCORER_ERRORS.counts() == {}


def test_hostile_corpus_worker_threads(canary: Path) -> None:
    jobs = _jobs(canary)  # every verdict recomputed off the main thread
    with ThreadPoolExecutor(4) as pool:
        times = _per_scorer_cold(
            jobs, lambda js: list(pool.map(lambda j: score(j[0], j[2], j[3]), js))
        )
    _check(jobs, times)


@pytest.mark.parametrize("extraction", answers.EXTRACTIONS)
def test_hostile_corpus_is_correct(canary: Path, extraction: str) -> None:
    """The scripts' entry point, each extraction mode: bounded, never raising."""
    corpus = hostile_completions(str(canary))
    answers.clear_caches()
    answers.SCORER_ERRORS.reset()
    times = []
    for i, (label, completion) in enumerate(corpus):
        start = time.perf_counter()
        verdict = answers.is_correct(completion, GOLDS[i % len(GOLDS)], extraction=extraction)
        times.append((time.perf_counter() - start, label))
        assert isinstance(verdict, bool), (label, verdict)
    slow = [(round(t, 3), label) for t, label in times if t >= LIMIT_S]
    assert len(slow) <= 1, slow  # one GC pause or busy moment, not a pattern
    assert answers.SCORER_ERRORS.counts() == {}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_hostile_corpus_worker_processes(canary: Path, method: str) -> None:
    """Two worker processes (as DataLoader or a reward server would run them): a forked
    worker inherits the deadline watchdog's state (reset at fork), a spawned one imports
    everything afresh. Workers rebuild the corpus from the canary path; only job indices
    and timings cross the process boundary. Worker cwd is tmp_path (inherited)."""
    jobs = _jobs(canary)
    chunks = 16  # interleaved slices: every chunk holds every scorer, cheap and costly
    times: list[float | None] = [None] * len(jobs)
    ctx = multiprocessing.get_context(method)
    with ProcessPoolExecutor(2, mp_context=ctx, initializer=init_worker) as pool:
        parts = pool.map(time_chunk, [str(canary)] * chunks, range(chunks), [chunks] * chunks)
        for part in parts:  # a worker's exception is re-raised here
            for i, t in part:
                times[i] = t
    assert None not in times, "a job was not run"
    _check(jobs, times)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


# Bounds on the memory one call may take above what it was given, in bytes per byte of
# the completion (sys.getsizeof) plus a constant. A reward may hold a couple of copies of
# the text (strip, lower, the split remainder) plus bounded working sets: 50,000 words for
# repetition, 200,000 chars for keywords, a <= 512-char answer for math-verify (all < 4 MB).
# The evaluation scorer also canonicalises the extracted answer for maj@k (vote_key), a
# regex substitution that builds ~10 bytes of pieces per char of a whitespace-dense answer;
# eval completions are capped by eval.max_new_tokens, so that is kilobytes in practice.
PER_BYTE = {EVAL_SCORER: 12.0}
PER_BYTE_REWARDS = 3.0  # length and repetition split the whole text before the fix: 20
CONSTANT_MB = 5.0


def test_memory_stays_bounded(canary: Path) -> None:
    jobs = _jobs(canary)
    # 1. Per call, the largest inputs: tracemalloc's peak above the call's starting point.
    big = [j for j in jobs if sys.getsizeof(j[2]) >= 100_000]
    assert len({j[1] for j in big}) >= 20, len(big)  # the megabyte text bombs and more
    peaks = []
    tracemalloc.start()
    try:
        for name, label, completion, gold in big:
            tracemalloc.reset_peak()
            start = tracemalloc.get_traced_memory()[0]
            score(name, completion, gold)
            peak = tracemalloc.get_traced_memory()[1] - start
            size = sys.getsizeof(completion)
            bound = PER_BYTE.get(name, PER_BYTE_REWARDS) * size + CONSTANT_MB * MB
            peaks.append((peak / MB, size / MB, bound / MB, name, label))
    finally:
        tracemalloc.stop()
    peaks.sort(reverse=True)
    top = [tuple(round(x, 2) if isinstance(x, float) else x for x in p) for p in peaks[:6]]
    print(f"\nlargest peaks (MB peak, MB input, MB bound, scorer, input): {top}")
    over = [p for p in peaks if p[0] > p[2]]
    assert not over, f"calls over their memory bound: {over}"

    # 2. The whole corpus, twice: resident memory settles (LRU caches, sympy's caches) and
    # does not grow with the number of calls.
    if not Path("/proc/self/statm").exists():
        pytest.skip("resident memory is read from /proc (Linux)")
    rss = [_rss_mb()]
    for _ in range(2):
        answers.clear_caches()
        for n, _, c, g in jobs:
            score(n, c, g)
        rss.append(_rss_mb())
    print(f"RSS MB: start {rss[0]:.0f}, +{rss[1] - rss[0]:.1f} after one pass of "
          f"{len(jobs)} calls, +{rss[2] - rss[1]:.1f} after a second")
    assert rss[1] - rss[0] < 200, rss
    assert rss[2] - rss[1] < 30, rss  # a leak of 10 kB a call would show as 40 MB


def test_capped_word_counts_change_no_reward(canary: Path) -> None:
    """length and repetition stop splitting where their result can no longer change (the
    memory bound above): same rewards as splitting the whole text."""
    from grpo_core.verify.rewards import MAX_REPETITION_TOKENS, length_penalty, repetition_score

    texts = [c for _, c in hostile_completions(str(canary))]
    texts += [" ".join(["ab", "cd", "ef"] * k) for k in (0, 1, 266, 267, 268, 533, 534, 20_000)]
    got = REWARDS["length"](texts, min_tokens=200, max_tokens=800, penalty=-0.5)
    assert got == [length_penalty(len(t.split()), 200, 800, -0.5) for t in texts]
    for t in texts:
        words = t.split()[:MAX_REPETITION_TOKENS]
        full = repetition_score(" ".join(words), 3, -0.5)
        assert repetition_score(t, 3, -0.5) == pytest.approx(full, abs=1e-12)


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
def test_hypothesis_scorers_never_raise_and_stay_fast(body: str, template: str, gold: str) -> None:
    completion = template.format(body)
    for name in SCORERS:
        assert score(name, completion, gold) < LIMIT_S, (name, completion)
    for name in REWARDS:  # TRL's conversational shape (eval completions are text)
        assert score(name, [{"role": "assistant", "content": completion}], gold) < LIMIT_S


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    gold=st.one_of(
        st.text(max_size=200), st.lists(st.sampled_from(LATEX_TOKENS), max_size=40).map("".join)
    )
)
def test_hypothesis_hostile_golds(gold: str) -> None:
    # The reward's gold parse shares the completion's time budget: still under the limit.
    assert score("accuracy", "<answer>5</answer>", gold) < LIMIT_S
    # Evaluation parses a problem's gold once (GOLD_DEADLINE_S), before its completions.
    parse_gold(gold)
    assert score(EVAL_SCORER, "<answer>5</answer>", gold) < LIMIT_S
