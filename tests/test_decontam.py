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


def test_sql_index_flags_the_same_rows_as_the_python_index():
    """The DuckDB join (what the store runs) against the in-Python index on 400 training rows
    made here: verbatim, embedded, re-cased and re-spaced copies (tabs, newlines, \\v, full
    width letters and ligatures that only NFKC folds), one-word siblings around the
    threshold, short texts and rows sharing only stock phrases."""
    import random

    import duckdb

    from grpo_core.data.db import STORE_SQL
    from grpo_core.data.decontam_sql import contaminated_rows

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(300)] + ["apples", "pears", "total", "ﬁnd", "Ｆｉｎｄ"]
    evals = {f"{src}/test": [" ".join(rng.choices(vocab, k=rng.randint(3, 30)))
                             for _ in range(20)] for src in ("aime24", "amc23")}

    def variant(text: str, kind: int) -> str:
        words = text.split()
        if kind == 0:
            return text
        if kind == 1:
            return "Solve this: " + text.upper() + " Show your work."
        if kind == 2:
            return "\t".join(words[:3]) + "\n\x0b  " + " ".join(words[3:]) + "  "
        if kind == 3:  # one word changed: coverage just under or over the threshold
            words[rng.randrange(len(words))] = "changed"
            return " ".join(words)
        if kind == 4:
            return " ".join(words[: max(1, len(words) // 2)])  # half of it
        return text.replace("fi", "ﬁ").replace("F", "Ｆ")  # NFKC folds both back

    train = []
    for i in range(400):
        label = rng.choice(sorted(evals))
        text = rng.choice(evals[label]) if i % 4 else " ".join(rng.choices(vocab, k=12))
        train.append((("mine", "train", f"fp{i}"), variant(text, i % 6)))
    want = decontam.find_contaminated(train, [(label, t) for label, ts in evals.items()
                                             for t in ts])
    con = duckdb.connect()
    con.execute(STORE_SQL)
    rows = [(k[0], k[1], k[2], t) for k, t in train]
    rows += [(label.split("/")[0], "test", f"e{j}-{label}", t)
             for label, ts in evals.items() for j, t in enumerate(ts)]
    con.executemany("INSERT INTO problems (source, split, fingerprint, problem, answer) "
                    "VALUES (?, ?, ?, ?, '1')", rows)
    flags = contaminated_rows(con, "split = 'train'", "split = 'test'")
    got = {("mine", "train", fp): label for fp, label in
           zip(flags["fingerprint"].to_pylist(), flags["label"].to_pylist())}
    assert 150 < len(want) < 300, len(want)  # near-misses on both sides of the threshold
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())[:5]
    assert got == want  # and the labels (no eval text here is in both sets: no ties)
