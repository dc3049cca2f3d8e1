"""N-gram decontamination: unit behaviour, and the measured overlaps of the shared data."""
from __future__ import annotations

import json
import time

from grpo_core.data import decontam

EVAL = ("Every morning Aya goes for a 9-kilometer-long walk and stops at a coffee shop "
        "afterwards. Find the number of minutes the walk takes her.")


def test_ngram_keys_normalise_and_short_texts():
    assert decontam.ngram_keys("A  b C d e f g h", 8) == decontam.ngram_keys("a b c d E F G H", 8)
    assert len(decontam.ngram_keys(" ".join("abcdefghij"), 8)) == 3
    assert len(decontam.ngram_keys("Compute 2+2.", 8)) == 1  # short text: compared whole
    assert decontam.ngram_keys("   ", 8) == set()


def test_verbatim_and_embedded_eval_problem_is_flagged():
    other = ("Natalia sold clips to 48 of her friends in April, and then she sold half as "
             "many clips in May.")
    train = [("copy", EVAL.upper()),
             ("embedded", "Solve this problem carefully. " + EVAL + " Show your work."),
             ("other", other)]
    flags = decontam.find_contaminated(train, [(("aime24", "test", "fp"), EVAL)])
    assert flags == {"copy": "aime24/test", "embedded": "aime24/test"}


def test_stock_phrases_and_one_word_siblings_are_not_contamination():
    ev = "Determine the number of ways to arrange the letters of the word ELLIPSE."
    train = [("sibling", "Determine the number of ways to arrange the letters of the word CIRCLE."),
             ("stock", "What is 3/8 of 24? Express your answer as a decimal to the nearest tenth.")]
    evals = [("e", ev), ("f", "Find x. Express your answer as a decimal to the nearest tenth.")]
    assert decontam.find_contaminated(train, evals) == {}
    # The coverage threshold is the knob: at 0.8 the sibling (4 of 5 n-grams) is flagged.
    assert decontam.find_contaminated(train, evals, min_coverage=0.8) == {"sibling": "e"}


def test_short_problems_match_only_whole():
    evals = [("e", "Compute $\\dbinom{8}{4}$.")]
    assert decontam.find_contaminated([("t", "compute  $\\dbinom{8}{4}$.")], evals) == {"t": "e"}
    assert decontam.find_contaminated([("t", "Compute $\\dbinom{8}{5}$.")], evals) == {}


def test_eval_roles():
    assert decontam.is_eval("gsm8k", "test") and decontam.is_eval("math500", "test")
    assert decontam.is_eval("aime24", "train")  # an eval-only source whatever its split
    assert decontam.is_eval("mine", "eval") and not decontam.is_eval("gsm8k", "train")
    assert "split IN ('test', 'eval')" in decontam.eval_predicate()


def _overlap_counts(train, evals, thresholds=(0.0, 0.5, 0.8, decontam.DEFAULT_MIN_COVERAGE)):
    """How many training texts reach each coverage threshold (0.0: any shared n-gram)."""
    index = decontam.EvalIndex()
    for text in evals:
        index.add("eval", text)
    covs = [m[1] for m in map(index.best_match, train) if m]
    return {t: sum(c >= t and c > 0 for c in covs) for t in thresholds}


def _column(path, key):
    return [json.loads(line)[key] for line in path.read_text(encoding="utf-8").splitlines()]


def test_math_train4500_vs_math500_is_clean_and_fast(shared_data):
    train = _column(shared_data / "math" / "train4500.jsonl", "problem")
    evals = _column(shared_data / "math500" / "test.jsonl", "problem")
    t0 = time.perf_counter()
    flags = decontam.find_contaminated(enumerate(train), [("math500/test", e) for e in evals])
    seconds = time.perf_counter() - t0
    counts = _overlap_counts(train, evals)
    print(f"\nMATH train4500 vs MATH-500: {len(flags)} contaminated in {seconds:.2f}s; "
          f"training problems reaching coverage >= t: {counts}")
    assert len(flags) == 0
    # Measured: any shared 8-gram would flag 359 (stock phrases), coverage >= 0.5 flags 45.
    assert counts[0.0] == 359 and counts[0.8] == 18


def test_gsm8k_train_test_overlap_is_measured(shared_data):
    train = _column(shared_data / "gsm8k" / "train.jsonl", "question")
    evals = _column(shared_data / "gsm8k" / "test.jsonl", "question")
    flags = decontam.find_contaminated(enumerate(train), [("gsm8k/test", e) for e in evals])
    counts = _overlap_counts(train, evals)
    print(f"\nGSM8K train vs test: {len(flags)} contaminated; coverage >= t: {counts}")
    assert len(flags) == 0  # measured: no train problem reproduces a test problem
    assert counts[0.0] == 70 and counts[0.5] == 2
