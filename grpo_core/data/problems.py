"""The canonical problem row that every dataset adapter produces and the store keeps."""
from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import asdict, dataclass, field


def normalise_text(text: str) -> str:
    """NFKC, lower case, collapsed whitespace: the form used for fingerprints and n-grams."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def fingerprint(problem: str, answer: str) -> str:
    """Content hash of a problem: equal text and gold answer mean the same problem."""
    key = normalise_text(problem) + "\x1f" + normalise_text(answer)
    # surrogatepass: a row holding invalid bytes still gets a fingerprint (and is quarantined)
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def text_key(problem: str) -> str:
    """Content hash of a problem's text alone: equal keys with different golds are near
    duplicates (the same problem, its answer written another way)."""
    return hashlib.sha256(normalise_text(problem).encode("utf-8", "surrogatepass")
                          ).hexdigest()[:16]


@dataclass
class Problem:
    """One verifiable math problem, whatever dataset it came from."""

    source: str  # dataset name: gsm8k, math, math500, aime24, synthetic:arith, or a file stem
    split: str  # train / test / eval
    problem: str  # the question shown to the model
    answer: str  # gold final answer, as text math-verify can parse
    solution: str = ""  # reference solution (for SFT traces), may be empty
    level: int | None = None  # difficulty 1-5 where the dataset has one
    subject: str | None = None
    id: str = ""  # stable id: "<source>/<split>/<index or dataset id>"
    fingerprint: str = field(default="")

    def __post_init__(self) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.problem, self.answer)

    def to_row(self) -> dict:
        return asdict(self)


PROBLEM_COLUMNS = [f for f in Problem.__dataclass_fields__]
