"""Final answers: equivalence checking safe on model output, and scorer errors counted.

    is_correct(completion, gold, extraction="flexible")      # scripts: one call
    verify(parse_gold("0.5"), extract_answer(completion))   # the parts, gold parsed once

Extraction (`strict` / `flexible`) and the reading of plain numbers live in
grpo_core/verify/extraction.py and are re-exported here.
Plain numbers (GSM8K, AIME, AMC, most of MATH) are compared exactly with `Fraction`;
everything else goes through math-verify (LaTeX -> sympy via an ANTLR parser; nothing is
ever `eval`ed). Golds are parsed once and cached (grpo_core/verify/gold.py: `GoldAnswer`,
`parse_gold`), so the G completions of a group share one parse. Every math-verify call
(grpo_core.verify.math_verify_adapter) is bounded by `grpo_core.verify.safe_eval` (input
limits plus a per-call deadline that works in any thread).

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

import time
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
from grpo_core.verify.gold import (
    LRU,
    MAX_GOLD_CHARS,
    PARSES,
    GoldAnswer,
    clear_parses,
    for_mv,
    parse_gold,
    read_lazy,
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

# The checker's public API. GoldAnswer and
# parse_gold are grpo_core.verify.gold's (project code imports them from there), listed
# here because scripts use them through this API: verify(parse_gold(gold), answer).
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
MAX_PRED_CHARS = 4 * MAX_GOLD_CHARS  # longer predictions are wrong without a look
# A pair that just ran out of time is not retried for this long (it is no cached verdict:
# a less busy moment may decide it). The same answer recurs at once: G equal completions
# of a group, or the strict and the flexible reading of one completion in evaluation.
RETRY_TIMEOUT_AFTER_S = 60.0

_VERDICTS = LRU(65536)
_TIMEOUTS = LRU(1024)  # (gold, prediction) -> when it last ran out of time


# --- comparing numbers ------------------------------------------------------------------


def numbers_equal(gold: tuple[Fraction, bool, bool], pred: tuple[Fraction, bool, bool]) -> bool:
    """Exact equality; when either side is written as a decimal both are compared rounded
    to 6 places (math-verify's rule). A percent sign is a unit: `50%` is 50, never 0.5."""
    (gv, g_dec, _), (pv, p_dec, _) = gold, pred
    if gv == pv:
        return True
    return (g_dec or p_dec) and round(gv, 6) == round(pv, 6)


# --- verification -------------------------------------------------------------------------


def _gold_profile(gold: GoldAnswer) -> tuple:
    if gold.number is not None:
        return complex(gold.number[0]), False
    return profile(gold.parsed) if gold.parsed else (None, False)


def _mv_check(gold: GoldAnswer, pred: str, pred_parsed: list | None) -> tuple[bool, list]:
    """(equal?, the prediction's parse); the gold is read already unless it is a plain
    number. Runs under a deadline: touches no locks."""
    if pred_parsed is None:
        pred_parsed = mv_parse(for_mv(pred))
    if not pred_parsed:
        return False, pred_parsed
    if gold.profile is None:
        gold.profile = _gold_profile(gold)
    if cannot_be_equal(gold.profile, profile(pred_parsed)):
        return False, pred_parsed
    if gold.parsed is None:  # a plain-number gold meeting a non-number prediction
        gold.parsed = mv_parse(for_mv(gold.text))
    _, mv_verify = math_verify_fns()
    equal = bool(gold.parsed) and mv_verify(gold.parsed, pred_parsed, timeout_seconds=None)
    return equal, pred_parsed


def _refused(gold: GoldAnswer, stripped: str, number: tuple | None) -> bool:
    """A prediction judged wrong unseen, before any parse."""
    # `1 2` is no number (math-verify would read it as 3): refused, like other limits.
    if risky_reason(stripped) or (number is None and SPLIT_DIGITS.search(stripped)):
        return True
    return never_read(for_mv(stripped), gold.text)  # code, not math: read as no value


_GOLD_UNREAD = object()  # _verify_uncached: the gold, read only now, is unreadable or timed out


def _gold_read_for(gold: GoldAnswer, seconds: float | None) -> float | None:
    """Read a lazy gold before the prediction's math-verify comparison: the seconds left
    for the prediction, or None when the gold is unreadable (remembered) or timed out.
    `seconds` None: the gold gets GOLD_DEADLINE_S (grpo_core.verify.gold's) and the
    prediction BUDGET_S, as when parse_gold read it first; given (the reward's budget per
    completion), they share it."""
    if gold.number is not None or gold.parsed:
        return seconds or BUDGET_S
    if gold.parsed is not None:  # read before: math-verify found nothing in it
        return None
    start = time.monotonic()
    readable = read_lazy(gold, seconds)  # unreadable: parse_gold says None from now on
    if readable is TIMED_OUT or not readable:
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
    cached = PARSES.get(stripped)  # the same wrong answer recurs across prompts
    result = call_with_deadline(_mv_check, gold, stripped, cached, seconds=seconds)
    if result is TIMED_OUT:
        return None
    equal, parsed = result
    if cached is None:
        PARSES.put(stripped, parsed)
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
    clear_parses()
    for cache in (_VERDICTS, _TIMEOUTS):
        cache.clear()
