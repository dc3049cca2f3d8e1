"""Scorer errors: an exception inside the checking of an answer, counted and logged once per
input, never read as a verdict (grpo_core/verify/answers.py's docstring says when)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("grpo.scorer")


class ScorerError(Exception):
    """The scorer itself failed on an input (not: the answer is wrong). `input_hash` is
    sha256(gold + NUL + prediction)[:12], the key of the log line."""

    def __init__(self, message: str, input_hash: str):
        super().__init__(message)
        self.input_hash = input_hash


class ScorerErrorCounter:
    """Thread-safe counts of scorer errors per label, and the first few input hashes."""

    KEEP = 10

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._hashes: dict[str, list[str]] = {}

    def add(self, label: str, input_hash: str) -> None:
        with self._lock:
            self._counts[label] = self._counts.get(label, 0) + 1
            kept = self._hashes.setdefault(label, [])
            if len(kept) < self.KEEP and input_hash not in kept:
                kept.append(input_hash)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def hashes(self, label: str) -> list[str]:
        with self._lock:
            return list(self._hashes.get(label, ()))

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._hashes.clear()


SCORER_ERRORS = ScorerErrorCounter()
_THREAD = threading.local()  # the label errors of this thread are counted under


@contextlib.contextmanager
def count_scorer_errors(label: str = "unlabelled") -> Iterator[ScorerErrorCounter]:
    """Count scorer errors raised in this thread inside the block under `label`."""
    previous = getattr(_THREAD, "label", None)
    _THREAD.label = label
    try:
        yield SCORER_ERRORS
    finally:
        _THREAD.label = previous


_LOGGED: set[str] = set()  # input hashes already logged: a recurring error logs once
_LOGGED_MAX = 4096


def record_scorer_error(gold: Any, predicted: Any, exc: BaseException) -> ScorerError:
    """Count and log (once per input) a scorer exception; the ScorerError to raise."""
    text = f"{gold}\x00{predicted}".encode("utf-8", "surrogatepass")
    input_hash = hashlib.sha256(text).hexdigest()[:12]
    label = getattr(_THREAD, "label", None) or "unlabelled"
    SCORER_ERRORS.add(label, input_hash)
    if input_hash not in _LOGGED:
        if len(_LOGGED) >= _LOGGED_MAX:
            _LOGGED.clear()
        _LOGGED.add(input_hash)
        log.warning("scorer error (%s) on input %s: %r", label, input_hash, exc, exc_info=exc)
    return ScorerError(f"scorer error on input {input_hash}: {exc!r}", input_hash)
