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

Fast paths decide most verdicts before any parse (tests/test_scoring_fast_paths.py pins
each against math-verify): an answer in the gold's own spelling (`canonical`) is right, and
the scorers' entry points (is_correct, is_equivalent, the accuracy reward) read the gold
lazily, so it is never parsed for one; code rather than math (`__import__('os')...`) is
wrong unseen (math_verify_adapter.never_read); most wrong answers are disproved by a cheap
numeric reading (grpo_core/verify/quick_value.py: other values, other shapes).

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
    never_read,
    profile,
    warm_up,
)
from grpo_core.verify.quick_value import number_profile, quick_profile, quick_unequal
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
    "extract_boxed", "gold_from_gsm8k", "gold_from_math_solution", "grade", "is_correct",
    "is_equivalent", "normalise_gold", "numbers_equal", "parse_gold", "record_scorer_error",
    "verify", "warm_up",
]  # fmt: skip

# Names the extraction + equivalence rules; evaluation puts it in the protocol hash.
# Bump it whenever a verdict can change.
EXTRACTOR_VERSION = "5-final-expression"

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
        self.quick = number_profile(number[0]) if number is not None else quick

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


def _parse_gold_key(key: str, seconds: float, lazy: bool) -> GoldAnswer | None | object:
    number = as_number(key)
    if number is not None:
        return GoldAnswer(key, number, None)
    if risky_reason(key, max_chars=MAX_GOLD_CHARS) or SPLIT_DIGITS.search(key):
        return None
    gold = GoldAnswer(key, None, None, quick_profile(key))
    if lazy or _arithmetic(gold):  # math-verify reads it later, if ever needed
        return gold
    readable = _read_gold(gold, seconds)
    return readable if readable is TIMED_OUT else (gold if readable else None)


def _read_gold(gold: GoldAnswer, seconds: float) -> bool | object:
    """Give a gold its math-verify parse (once: one parse per text, gold or prediction).
    True when math-verify reads something in it, False when nothing, or TIMED_OUT."""
    if gold.parsed is None:
        parsed = _PARSES.get(gold.text)
        if parsed is None:
            math_verify_fns()
            parsed = call_with_deadline(mv_parse, _for_mv(gold.text), seconds=seconds)
            if parsed is TIMED_OUT:
                return TIMED_OUT
            _PARSES.put(gold.text, parsed)
        gold.parsed = parsed
    return bool(gold.parsed)


def parse_gold(text: Any, seconds: float | None = None, *, lazy: bool = False) -> GoldAnswer | None:
    """Parse a gold answer once (cached by its text). None when it cannot be parsed, when
    its parse overran `seconds` (default GOLD_DEADLINE_S, read at call time), or when the
    parse raised (a scorer error: counted, logged). Only real verdicts are cached.

    `lazy=True` (the scorers' entry points: is_correct, is_equivalent, the accuracy reward)
    leaves math-verify's parse of the gold to the first prediction that needs it: an
    answer equal to the gold in spelling (most right answers) never pays for it. Such a
    gold is None only when its text is refused on sight (empty, over a limit, split
    digits); one that math-verify then reads nothing in is found by `grade` (None) and
    remembered: parse_gold returns None for it from then on."""
    if isinstance(text, GoldAnswer):
        gold = text
    else:
        try:
            key = _gold_key(text)
            if not key:
                return None
            gold = _GOLDS.get(key, _MISSING)
            if gold is _MISSING:
                gold = _parse_gold_key(key, seconds or GOLD_DEADLINE_S, lazy)
                if gold is TIMED_OUT:
                    return None  # not remembered: a less busy moment may parse it
                _GOLDS.put(key, gold)
        except Exception as exc:  # noqa: BLE001 - counted and logged, never a crash
            record_scorer_error(text, "", exc)
            return None
    if gold is None or lazy or not _pending(gold):
        return gold
    return _parse_pending(gold, seconds or GOLD_DEADLINE_S)


def _arithmetic(gold: GoldAnswer) -> bool:
    """Simple arithmetic, which math-verify surely reads: no need to parse it to know."""
    return gold.quick is not None and gold.quick[0] in ("value", "items")


def _pending(gold: GoldAnswer) -> bool:
    """A gold math-verify has not read yet, which is no simple arithmetic (a lazy one)."""
    return gold.parsed is None and gold.number is None and not _arithmetic(gold)


def _parse_pending(gold: GoldAnswer, seconds: float) -> GoldAnswer | None:
    """parse_gold's eager reading of a gold cached lazily by an earlier call."""
    try:
        readable = _read_gold(gold, seconds)
    except Exception as exc:  # noqa: BLE001 - counted and logged, never a crash
        record_scorer_error(gold.text, "", exc)
        return None
    if readable is TIMED_OUT:
        return None
    if not readable:
        _GOLDS.put(gold.text, None)
        return None
    return gold


# --- verification -------------------------------------------------------------------------


def _gold_profile(gold: GoldAnswer) -> tuple:
    if gold.number is not None:
        return complex(gold.number[0]), False
    return profile(gold.parsed) if gold.parsed else (None, False)


def _mv_check(gold: GoldAnswer, pred: str, pred_parsed: list | None) -> tuple[bool, list]:
    """(equal?, the prediction's parse); the gold is read already unless it is a plain
    number. Runs under a deadline: touches no locks."""
    if pred_parsed is None:
        pred_parsed = mv_parse(_for_mv(pred))
    if not pred_parsed:
        return False, pred_parsed
    if gold.profile is None:
        gold.profile = _gold_profile(gold)
    if cannot_be_equal(gold.profile, profile(pred_parsed)):
        return False, pred_parsed
    if gold.parsed is None:  # a plain-number gold meeting a non-number prediction
        gold.parsed = mv_parse(_for_mv(gold.text))
    _, mv_verify = math_verify_fns()
    equal = bool(gold.parsed) and mv_verify(gold.parsed, pred_parsed, timeout_seconds=None)
    return equal, pred_parsed


def _refused(gold: GoldAnswer, stripped: str, number: tuple | None) -> bool:
    """A prediction judged wrong unseen, before any parse."""
    # `1 2` is no number (math-verify would read it as 3): refused, like other limits.
    if risky_reason(stripped) or (number is None and SPLIT_DIGITS.search(stripped)):
        return True
    return never_read(_for_mv(stripped), gold.text)  # code, not math: read as no value


_GOLD_UNREAD = object()  # _verify_uncached: the gold, read only now, is unreadable or timed out


def _gold_read_for(gold: GoldAnswer, seconds: float | None) -> float | None:
    """Read a lazy gold before the prediction's math-verify comparison: the seconds left
    for the prediction, or None when the gold is unreadable (remembered) or timed out.
    `seconds` None: the gold gets GOLD_DEADLINE_S and the prediction BUDGET_S, as when
    parse_gold read it first; given (the reward's budget per completion), they share it."""
    if gold.number is not None or gold.parsed:
        return seconds or BUDGET_S
    if gold.parsed is not None:  # read before: math-verify found nothing in it
        return None
    start = time.monotonic()
    readable = _read_gold(gold, seconds or GOLD_DEADLINE_S)
    if readable is TIMED_OUT:
        return None
    if not readable:
        _GOLDS.put(gold.text, None)  # parse_gold says None for it from now on
        return None
    return max(0.05, seconds - (time.monotonic() - start)) if seconds else BUDGET_S


def _verify_uncached(gold: GoldAnswer, pred: str,
                     seconds: float | None) -> bool | None | object:
    stripped = clean_answer(pred)
    if not stripped:
        return False
    number = as_number(stripped)
    if gold.number is not None and number is not None:
        return numbers_equal(gold.number, number)
    canon = canonical(stripped)
    if canon and canon == gold.canon:
        return True
    if _refused(gold, stripped, number):
        return False
    if gold.quick is not None:  # no parser for an answer that surely differs
        pred_quick = number_profile(number[0]) if number is not None else quick_profile(stripped)
        if quick_unequal(gold.quick, pred_quick):
            return False
    seconds = _gold_read_for(gold, seconds)
    if seconds is None:
        return _GOLD_UNREAD
    math_verify_fns()
    cached = _PARSES.get(stripped)  # the same wrong answer recurs across prompts
    result = call_with_deadline(_mv_check, gold, stripped, cached, seconds=seconds)
    if result is TIMED_OUT:
        return None
    equal, parsed = result
    if cached is None:
        _PARSES.put(stripped, parsed)
    return equal


def grade(gold: GoldAnswer | None, predicted: str | None,
          seconds: float | None = None) -> bool | None:
    """`check`'s verdict, or None when the gold itself turned out unreadable while checking
    (a lazy gold, parse_gold(lazy=True): math-verify read nothing in it, or its parse
    overran the deadline), so the pair was not judged. The accuracy reward reads None as
    "not scored", as it does a gold that parse_gold refuses. Raises ScorerError as check."""
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
        result = _verify_uncached(gold, pred, seconds)
    except Exception as exc:  # noqa: BLE001 - counted and logged, a False verdict
        raise record_scorer_error(gold.text, pred, exc) from exc
    if result is _GOLD_UNREAD:
        return None
    if result is None:
        _TIMEOUTS.put(key, time.monotonic())
        return False
    _VERDICTS.put(key, result)
    return result


def check(gold: GoldAnswer | None, predicted: str | None, seconds: float | None = None) -> bool:
    """Is `predicted` (an extracted answer) equivalent to the gold? Takes at most about
    `seconds` (default BUDGET_S; a timeout counts as wrong, is not cached, and is not
    retried for RETRY_TIMEOUT_AFTER_S; so does a lazy gold found unreadable, see `grade`).
    Raises ScorerError when the scorer itself failed (already counted and logged: don't
    count it again)."""
    return grade(gold, predicted, seconds) is True


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
    return verify(parse_gold(gold, lazy=True), predicted)


def is_equivalent(gold_text: Any, pred_text: str | None) -> bool:
    """Convenience: parse_gold (lazy) + verify."""
    return verify(parse_gold(gold_text, lazy=True), pred_text)


def clear_caches() -> None:
    """Forget parsed golds and verdicts (benchmarks start cold)."""
    for cache in (_GOLDS, _VERDICTS, _PARSES, _TIMEOUTS):
        cache.clear()
