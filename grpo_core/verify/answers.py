"""Final answers: equivalence checking safe on model output, and scorer errors counted.

    is_correct(completion, gold, extraction="flexible")      # scripts: one call
    verify(parse_gold("0.5"), extract_answer(completion))   # the parts, gold parsed once

Extraction (`strict` / `flexible`) and the reading of plain numbers live in
grpo_core/verify/extraction.py and are re-exported here.
Plain numbers (GSM8K, AIME, AMC, most of MATH) are compared exactly with `Fraction`;
everything else goes through math-verify (LaTeX -> sympy via an ANTLR parser; nothing is
ever `eval`ed). Golds are parsed once and cached, so the G completions of a group share one
parse. Every math-verify call (grpo_core.verify.math_verify_adapter) is bounded by
`grpo_core.verify.safe_eval` (input limits plus a per-call deadline that works in any thread).

Before either comparison both answers are cleaned by `extraction.clean_answer`: MATH's
spellings of one value made one (matrix row separators kept, thousands separators
`11,\\! 111` / `11{,}111` joined, `\\frac \\pi4` braced, mixed numbers `1 1/2`, `1.2e3`). `1 2`
is not 12: whitespace between digits is refused as ambiguous.

Rules where MATH's own grader (string match after normalisation) is stricter than
math-verify, decided once for every benchmark (GSM8K, AIME and AMC golds are integers, so
only the percent rule can ever apply to them):

- percent is a unit, as in MATH and PRM800K: `10\\%` matches 10, `10\\%`, `10 percent`;
  it does not match 0.1 (nor does a gold 0.1 match `10\\%`). math-verify accepts both.
- `x \\leq 5` equals `5 \\geq x`: the same relation written the other way round (as
  math-verify; MATH's string match would reject it). `x < 5` is not `x \\leq 5`.
- a bare comma list `10, 4, -2` is a set ("enter all solutions, separated by commas"):
  any order (and repeats) match; a list of several values never matches one of them.
  A bracketed tuple or point `(10, 4, -2)` is ordered (a bare list answering it is read
  in order), and intervals keep their ends.
- an interval gold `(3, \\infty)` is not matched by `x > 3` (interval notation was asked);
  an inequality gold `x > 3` accepts `(3, \\infty)`.

The labelled table tests/data/equivalence_pairs.csv pins these and the spellings above.
Known limitation (pinned there too): math-verify keeps `i` a symbol, so `i^2` is not -1.

Scorer errors: an exception inside the checking (ours, or one escaping math-verify, which
itself returns False on most internal errors; not a deadline timeout and not an
input-limit refusal) is never cached as a verdict. It is logged once
per input (`grpo.scorer`, with sha256[:12] of gold and prediction) and counted in
`SCORER_ERRORS` under the label of the innermost `count_scorer_errors(label)` of this
thread ("unlabelled" outside any). `check` raises `ScorerError`; `verify` and
`is_correct` return False. Parse failures of malformed LaTeX are the answer's fault
(math-verify returns no parse): wrong, not an error.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from fractions import Fraction
from typing import Any

from grpo_core.verify.extraction import (
    EXTRACTIONS,
    SPLIT_DIGITS,
    as_number,
    canonical,
    clean_answer,
    extract_answer,
    extract_boxed,
    gold_from_gsm8k,
    gold_from_math_solution,
    normalise_gold,
)
from grpo_core.verify.math_verify_adapter import (
    cannot_be_equal,
    math_verify_fns,
    mv_parse,
    profile,
    warm_up,
)
from grpo_core.verify.quick_value import quick_profile, quick_unequal
from grpo_core.verify.safe_eval import TIMED_OUT, call_with_deadline, risky_reason
from grpo_core.verify.scorer_errors import (
    SCORER_ERRORS,
    ScorerError,
    count_scorer_errors,
    record_scorer_error,
)

__all__ = [
    "EXTRACTIONS", "EXTRACTOR_VERSION", "SCORER_ERRORS", "GoldAnswer", "ScorerError",
    "as_number", "canonical", "check", "clean_answer", "clear_caches", "count_scorer_errors",
    "extract_answer",
    "extract_boxed", "gold_from_gsm8k", "gold_from_math_solution", "is_correct",
    "is_equivalent", "normalise_gold", "numbers_equal", "parse_gold", "record_scorer_error",
    "verify", "warm_up",
]  # fmt: skip

# Names the extraction + equivalence rules; evaluation puts it in the protocol hash.
# Bump it whenever a verdict can change.
EXTRACTOR_VERSION = "4-variables-last-expression"

# Wall-clock budget for checking one completion, the gold's parse included when it is not
# cached yet. GC pauses and a busy machine can stretch a call past it by a few 100 ms;
# the bound we promise is 1 s.
BUDGET_S = 0.6
GOLD_DEADLINE_S = 0.6  # parsing one gold answer (once per problem)
MAX_GOLD_CHARS = 1024
MAX_PRED_CHARS = 4 * MAX_GOLD_CHARS  # longer predictions are wrong without a look
# A pair that just ran out of time is not retried for this long (it is no cached verdict:
# a less busy moment may decide it). The same answer recurs at once: G equal completions
# of a group, or the strict and the flexible reading of one completion in evaluation.
RETRY_TIMEOUT_AFTER_S = 60.0

class _LRU:
    """A small thread-safe LRU map (functools.lru_cache cannot skip caching timeouts)."""

    def __init__(self, maxsize: int):
        self.maxsize, self._data, self._lock = maxsize, OrderedDict(), threading.Lock()

    def get(self, key: Any, default: Any = None) -> Any:
        if not self._data:  # no lock needed to see an empty map (most _TIMEOUTS reads)
            return default
        with self._lock:
            if key not in self._data:
                return default
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            if len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


# --- comparing numbers ------------------------------------------------------------------


def numbers_equal(gold: tuple[Fraction, bool, bool], pred: tuple[Fraction, bool, bool]) -> bool:
    """Exact equality; when either side is written as a decimal both are compared rounded
    to 6 places (math-verify's rule). A percent sign is a unit: `50%` is 50, never 0.5."""
    (gv, g_dec, _), (pv, p_dec, _) = gold, pred
    if gv == pv:
        return True
    return (g_dec or p_dec) and round(gv, 6) == round(pv, 6)


_PERCENT = re.compile(r"\\text\{\s*(?:\\?%|percent)\s*\}|\\?%|\bpercent(?:age)?\b")


def _for_mv(text: str) -> str:
    """The text math-verify reads: percent is a unit (see the docstring), dropped."""
    return _PERCENT.sub("", text).strip() if "%" in text or "percent" in text else text


# --- gold answers -----------------------------------------------------------------------

_GOLDS = _LRU(8192)
_VERDICTS = _LRU(65536)
_PARSES = _LRU(8192)  # math-verify's parse per cleaned text, golds and predictions alike
_TIMEOUTS = _LRU(1024)  # (gold, prediction) -> when it last ran out of time
_MISSING = object()


class GoldAnswer:
    """A gold answer parsed once, reusable across the G completions of a group.

    `number` is set for plain numbers (compared exactly, math-verify never needed);
    otherwise `parsed` holds math-verify's parse, made once by `parse_gold`.
    """

    __slots__ = ("canon", "number", "parsed", "profile", "quick", "text")

    def __init__(self, text: str, number: tuple | None, parsed: list | None,
                 quick: tuple | None = None):
        self.text = text
        self.number = number
        self.canon = canonical(text)
        self.parsed = parsed
        self.profile: tuple | None = None  # (value, varies), see _profile; made on first use
        # quick_value's cheap reading (no parser): most wrong answers are disproved with it
        self.quick = ("value", complex(number[0]), False) if number is not None else quick

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GoldAnswer) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"GoldAnswer({self.text!r})"


def _gold_key(text: Any) -> str | None:
    if not isinstance(text, str) or "####" in text:
        text = normalise_gold(text)  # AMC floats, GSM8K solutions
        if text is None:
            return None
    if "\\boxed" in text or "\\fbox" in text:
        text = extract_boxed(text) or text
    return clean_answer(text)


def _parse_gold_key(key: str, seconds: float) -> GoldAnswer | None | object:
    number = as_number(key)
    if number is not None:
        return GoldAnswer(key, number, None)
    if risky_reason(key, max_chars=MAX_GOLD_CHARS) or SPLIT_DIGITS.search(key):
        return None
    quick = quick_profile(key)
    if quick is not None:  # simple arithmetic: math-verify parses it later, if ever needed
        return GoldAnswer(key, None, None, quick)
    parsed = _PARSES.get(key)  # one parse per text, gold or prediction
    if parsed is None:
        math_verify_fns()
        parsed = call_with_deadline(mv_parse, _for_mv(key), seconds=seconds)
        if parsed is TIMED_OUT:
            return TIMED_OUT
        _PARSES.put(key, parsed)
    return GoldAnswer(key, None, parsed) if parsed else None


def parse_gold(text: Any, seconds: float | None = None) -> GoldAnswer | None:
    """Parse a gold answer once (cached by its text). None when it cannot be parsed, when
    its parse overran `seconds` (default GOLD_DEADLINE_S, read at call time), or when the
    parse raised (a scorer error: counted, logged). Only real verdicts are cached."""
    if isinstance(text, GoldAnswer):
        return text
    try:
        key = _gold_key(text)
        if not key:
            return None
        hit = _GOLDS.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        gold = _parse_gold_key(key, seconds or GOLD_DEADLINE_S)
    except Exception as exc:  # noqa: BLE001 - counted and logged, never a crash
        record_scorer_error(text, "", exc)
        return None
    if gold is TIMED_OUT:
        return None  # not remembered: a less busy moment may parse it
    _GOLDS.put(key, gold)
    return gold


# --- verification -------------------------------------------------------------------------


def _gold_profile(gold: GoldAnswer) -> tuple:
    if gold.number is not None:
        return complex(gold.number[0]), False
    return profile(gold.parsed) if gold.parsed else (None, False)


def _mv_check(gold: GoldAnswer, pred: str, pred_parsed: list | None) -> tuple[bool, list]:
    """(equal?, the prediction's parse). Runs under a deadline: touches no locks."""
    if pred_parsed is None:
        pred_parsed = mv_parse(_for_mv(pred))
    if not pred_parsed:
        return False, pred_parsed
    if gold.parsed is None and gold.number is None:  # parsed when first needed
        gold.parsed = mv_parse(_for_mv(gold.text))
    if gold.profile is None:
        gold.profile = _gold_profile(gold)
    if cannot_be_equal(gold.profile, profile(pred_parsed)):
        return False, pred_parsed
    if gold.parsed is None:  # a plain-number gold meeting a non-number prediction
        gold.parsed = mv_parse(_for_mv(gold.text))
    _, mv_verify = math_verify_fns()
    equal = bool(gold.parsed) and mv_verify(gold.parsed, pred_parsed, timeout_seconds=None)
    return equal, pred_parsed


def _verify_uncached(gold: GoldAnswer, pred: str, seconds: float) -> bool | None:
    stripped = clean_answer(pred)
    if not stripped:
        return False
    number = as_number(stripped)
    if gold.number is not None and number is not None:
        return numbers_equal(gold.number, number)
    canon = canonical(stripped)
    if canon and canon == gold.canon:
        return True
    # `1 2` is no number (math-verify would read it as 3): refused, like other limits.
    if risky_reason(stripped) or (number is None and SPLIT_DIGITS.search(stripped)):
        return False
    if gold.quick is not None:  # no parser for an answer that surely differs
        pred_quick = (("value", complex(number[0]), False) if number is not None
                      else quick_profile(stripped))
        if quick_unequal(gold.quick, pred_quick):
            return False
    math_verify_fns()
    cached = _PARSES.get(stripped)  # the same wrong answer recurs across prompts
    result = call_with_deadline(_mv_check, gold, stripped, cached, seconds=seconds)
    if result is TIMED_OUT:
        return None
    equal, parsed = result
    if cached is None:
        _PARSES.put(stripped, parsed)
    return equal


def check(gold: GoldAnswer | None, predicted: str | None, seconds: float | None = None) -> bool:
    """Is `predicted` (an extracted answer) equivalent to the gold? Takes at most about
    `seconds` (default BUDGET_S; a timeout counts as wrong, is not cached, and is not
    retried for RETRY_TIMEOUT_AFTER_S). Raises ScorerError when the scorer itself failed
    (already counted and logged: don't count it again)."""
    if gold is None or not isinstance(predicted, str):
        return False
    pred = predicted.strip()
    if not pred or len(pred) > MAX_PRED_CHARS:
        return False
    key = (gold.text, pred)
    hit = _VERDICTS.get(key)
    if hit is not None:
        return hit
    timed_out = _TIMEOUTS.get(key)
    if timed_out is not None and time.monotonic() - timed_out < RETRY_TIMEOUT_AFTER_S:
        return False
    try:
        result = _verify_uncached(gold, pred, seconds or BUDGET_S)
    except Exception as exc:  # noqa: BLE001 - counted and logged, a False verdict
        raise record_scorer_error(gold.text, pred, exc) from exc
    if result is None:
        _TIMEOUTS.put(key, time.monotonic())
        return False
    _VERDICTS.put(key, result)
    return result


def verify(gold: GoldAnswer | None, predicted: str | None, seconds: float | None = None) -> bool:
    """`check`, with a scorer error (counted, logged) returned as False. Never raises."""
    try:
        return check(gold, predicted, seconds)
    except ScorerError:
        return False


def is_correct(completion: str, gold: str, *, extraction: str = "strict") -> bool:
    """Does `completion` state the gold answer (`Problem.answer` as the store holds it),
    read with `extraction` ("strict" or "flexible")? False on a scorer error (counted);
    ValueError only for an unknown extraction name."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown extraction {extraction!r}; known: {EXTRACTIONS}")
    try:
        predicted = extract_answer(completion, extraction)
    except Exception as exc:  # noqa: BLE001 - recorded as a scorer error, never a verdict
        record_scorer_error(gold, completion, exc)
        return False
    return verify(parse_gold(gold), predicted)


def is_equivalent(gold_text: Any, pred_text: str | None) -> bool:
    """Convenience: parse_gold + verify."""
    return verify(parse_gold(gold_text), pred_text)


def clear_caches() -> None:
    """Forget parsed golds and verdicts (benchmarks start cold)."""
    for cache in (_GOLDS, _VERDICTS, _PARSES, _TIMEOUTS):
        cache.clear()
