"""Gold answers parsed once: `GoldAnswer`, `parse_gold`, and the caches of parses.

Separate from grpo_core/verify/answers.py, which compares a prediction with a gold: this
module is the gold side alone (reading a problem's answer text, deciding whether it is
readable at all, and remembering that), which the ingest (grpo_core.data.validation) and
the scorers share. It imports nothing of answers.

Golds are parsed once and cached by their cleaned text, so the G completions of a group
share one parse. Plain numbers are read exactly (`GoldAnswer.number`); anything else is
left to math-verify, which reads it under `safe_eval`'s limits and a deadline
(GOLD_DEADLINE_S, read at call time: the ingest raises it). The scorers' entry points ask
for a lazy gold (`parse_gold(..., lazy=True)`): math-verify's parse is made only for the
first prediction that needs it (`read_lazy`), so an answer in the gold's own spelling never
pays for one. `PARSES` holds math-verify's parse per cleaned text, of golds and
predictions alike. Percent is a unit (`for_mv` drops it before math-verify reads a text);
see answers' docstring for that rule."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from grpo_core.verify.extraction import (
    SPLIT_DIGITS,
    as_number,
    canonical,
    clean_answer,
    extract_boxed,
    normalise_gold,
)
from grpo_core.verify.math_verify_adapter import math_verify_fns, mv_parse
from grpo_core.verify.quick_value import number_profile, quick_profile
from grpo_core.verify.safe_eval import TIMED_OUT, call_with_deadline, risky_reason
from grpo_core.verify.scorer_errors import record_scorer_error

GOLD_DEADLINE_S = 0.6  # parsing one gold answer (once per problem)
MAX_GOLD_CHARS = 1024


class LRU:
    """A small thread-safe LRU map (functools.lru_cache cannot skip caching timeouts)."""

    def __init__(self, maxsize: int):
        self.maxsize, self._data, self._lock = maxsize, OrderedDict(), threading.Lock()

    def get(self, key: Any, default: Any = None) -> Any:
        if not self._data:  # no lock needed to see an empty map (most timeout reads)
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


_PERCENT = re.compile(r"\\text\{\s*(?:\\?%|percent)\s*\}|\\?%|\bpercent(?:age)?\b")


def for_mv(text: str) -> str:
    """The text math-verify reads: percent is a unit (see answers' docstring), dropped."""
    return _PERCENT.sub("", text).strip() if "%" in text or "percent" in text else text


_GOLDS = LRU(8192)
PARSES = LRU(8192)  # math-verify's parse per cleaned text, golds and predictions alike
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
        # (value, varies), see answers' _gold_profile; made on first use
        self.profile: tuple | None = None
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
        parsed = PARSES.get(gold.text)
        if parsed is None:
            math_verify_fns()
            parsed = call_with_deadline(mv_parse, for_mv(gold.text), seconds=seconds)
            if parsed is TIMED_OUT:
                return TIMED_OUT
            PARSES.put(gold.text, parsed)
        gold.parsed = parsed
    return bool(gold.parsed)


def read_lazy(gold: GoldAnswer, seconds: float | None = None) -> bool | object:
    """Read a gold now that a lazy parse_gold left unread, within `seconds` (default
    GOLD_DEADLINE_S, read at call time). True when math-verify reads something in it;
    False when nothing (remembered: parse_gold returns None for it from now on); or
    TIMED_OUT (not remembered). An exception inside the parse propagates."""
    readable = _read_gold(gold, seconds or GOLD_DEADLINE_S)
    if readable is not TIMED_OUT and not readable:
        _GOLDS.put(gold.text, None)
    return readable


def parse_gold(text: Any, seconds: float | None = None, *, lazy: bool = False) -> GoldAnswer | None:
    """Parse a gold answer once (cached by its text). None when it cannot be parsed, when
    its parse overran `seconds` (default GOLD_DEADLINE_S, read at call time), or when the
    parse raised (a scorer error: counted, logged). Only real verdicts are cached.

    `lazy=True` (the scorers' entry points: is_correct, is_equivalent, the accuracy reward)
    leaves math-verify's parse of the gold to the first prediction that needs it: an
    answer equal to the gold in spelling (most right answers) never pays for it. Such a
    gold is None only when its text is refused on sight (empty, over a limit, split
    digits); one that math-verify then reads nothing in is found by `answers.grade` (None)
    and remembered: parse_gold returns None for it from then on."""
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
        readable = read_lazy(gold, seconds)
    except Exception as exc:  # noqa: BLE001 - counted and logged, never a crash
        record_scorer_error(gold.text, "", exc)
        return None
    return None if readable is TIMED_OUT or not readable else gold


def clear_parses() -> None:
    """Forget parsed golds and math-verify's parses (answers.clear_caches calls it)."""
    for cache in (_GOLDS, PARSES):
        cache.clear()
