"""Decontamination: flag training problems that reproduce an evaluation problem.

Texts are compared as sets of word n-grams (n=8 by default, words of `normalise_text`,
hashed). A training problem is contaminated by an eval problem when the n-grams they
share cover at least `min_coverage` of the eval problem's n-grams: the eval problem
appears in the training text, near-verbatim, possibly inside a longer text. Problems
shorter than n words are compared whole.

Why coverage and not "any shared 8-gram": math problem sets reuse long stock phrases.
Measured on shared/data, a single shared 8-gram flags 359 of MATH's 4500 training
problems against MATH-500 ("express your answer as a decimal to the nearest tenth", ...)
and 70 GSM8K train problems against GSM8K test, although these sets are disjoint. MATH
also holds templated siblings that differ in one number or word ("... letters of the word
CIRCLE" / "ELLIPSE"); their coverage reaches 0.92, hence the default of 0.95.
Lower `min_coverage` to catch looser rephrasings at the price of flagging siblings.

The store runs this test as a DuckDB join (grpo_core.data.decontam_sql: no Python loop over
a million training rows). `find_contaminated` here is the test written plainly, kept as
that join's reference: tests/test_decontam.py checks both flag the same rows, and the
measured overlaps above come from it. Nothing in the pipeline calls it.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from grpo_core.data.problems import normalise_text

DEFAULT_N = 8
DEFAULT_MIN_COVERAGE = 0.95
EVAL_SOURCES = ("math500", "aime24", "aime25", "amc23")  # eval sets whatever the split
EVAL_SPLITS = ("test", "eval")  # any source's split with this name is an eval set


def is_eval(source: str, split: str) -> bool:
    return split in EVAL_SPLITS or source in EVAL_SOURCES


def eval_predicate() -> str:
    """SQL twin of `is_eval` over columns `source` and `split`."""
    splits = ", ".join(f"'{s}'" for s in EVAL_SPLITS)
    sources = ", ".join(f"'{s}'" for s in EVAL_SOURCES)
    return f"(split IN ({splits}) OR source IN ({sources}))"


def ngram_keys(text: str, n: int = DEFAULT_N) -> set[int]:
    """Hashes of the word n-grams of `text` (the whole text when it has fewer words)."""
    words = normalise_text(text).split()
    if len(words) < n:
        return {hash(tuple(words))} if words else set()
    return {hash(g) for g in zip(*(words[i:] for i in range(n)))}


class EvalIndex:
    """Inverted index n-gram hash -> eval problems holding it."""

    def __init__(self, n: int = DEFAULT_N):
        self.n = n
        self.postings: dict[int, list[int]] = {}
        self.labels: list[str] = []
        self.sizes: list[int] = []

    def add(self, label: str, text: str) -> None:
        keys = ngram_keys(text, self.n)
        if not keys:
            return
        doc = len(self.labels)
        self.labels.append(label)
        self.sizes.append(len(keys))
        for k in keys:
            self.postings.setdefault(k, []).append(doc)

    def best_match(self, text: str) -> tuple[str, float] | None:
        """The eval set of the most-covered eval problem sharing an n-gram, and coverage."""
        postings = self.postings
        shared = [k for k in ngram_keys(text, self.n) if k in postings]
        if not shared:
            return None
        counts = Counter(doc for k in shared for doc in postings[k])
        doc, cov = max(((d, c / self.sizes[d]) for d, c in counts.items()), key=lambda x: x[1])
        return self.labels[doc], cov


def find_contaminated(train: Iterable[tuple[Hashable, str]],
                      evals: Iterable[tuple[tuple[str, str, str] | str, str]],
                      n: int = DEFAULT_N,
                      min_coverage: float = DEFAULT_MIN_COVERAGE) -> dict[Hashable, str]:
    """{train key: eval set label} for the training texts that reproduce an eval problem.

    `train` holds (key, text); `evals` holds (label or (source, split, ...), text); a
    tuple label becomes "source/split".
    """
    index = EvalIndex(n)
    for label, text in evals:
        index.add(label if isinstance(label, str) else f"{label[0]}/{label[1]}", text)
    if not index.labels:
        return {}
    flagged = {}
    for key, text in train:
        match = index.best_match(text)
        if match and match[1] >= min_coverage:
            flagged[key] = match[0]
    return flagged

