"""Final-answer extraction and equivalence checking, safe on model output.

    completion --extract_answer--> "\\frac{1}{2}" --verify(parse_gold("0.5"), .)--> True

Plain numbers (GSM8K, AIME, AMC, most of MATH) are compared exactly with `Fraction`;
everything else goes through math-verify (LaTeX -> sympy via an ANTLR parser; nothing is
ever `eval`ed). Golds are parsed once and cached, so the G completions of a group share one
parse. Every math-verify call is bounded by `grpo_core.safe_eval` (input limits plus a
per-call deadline that works in any thread).
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from fractions import Fraction
from typing import Any

from grpo_core.safe_eval import (
    TIMED_OUT,
    call_with_deadline,
    cannot_be_equal,
    math_verify_fns,
    mv_parse,
    profile,
    risky_reason,
    warm_up,
)

__all__ = [
    "GoldAnswer", "as_number", "clear_caches", "extract_answer", "extract_boxed",
    "gold_from_gsm8k", "gold_from_math_solution", "is_equivalent", "normalise_gold",
    "numbers_equal", "parse_gold", "verify", "warm_up",
]  # fmt: skip

# Wall-clock budget for checking one completion, the gold's parse included when it is not
# cached yet. GC pauses and a busy machine can stretch a call past it by a few 100 ms;
# the bound we promise is 1 s.
BUDGET_S = 0.6
GOLD_DEADLINE_S = 0.6  # parsing one gold answer (once per problem)
MAX_GOLD_CHARS = 1024

# --- extraction ------------------------------------------------------------------------

MAX_BOXED_SCAN = 100_000  # \boxed{} is looked for in the last 100k chars only
_BOX_CMD = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last brace-matched `\\boxed{...}` (or `\\fbox`, `\\framebox`).

    One left-to-right pass over the braces with an explicit stack: linear time, no
    recursion, so unbalanced or 10,000-deep input is fine.
    """
    if not isinstance(text, str) or "\\" not in text:
        return None
    text = text[-MAX_BOXED_SCAN:]  # bounds the Python loop below on megabyte input
    opens = [m.end() - 1 for m in _BOX_CMD.finditer(text)]
    if not opens:
        return None
    wanted = set(opens)
    closes: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE.finditer(text, opens[0]):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            start = stack.pop()
            if start in wanted:
                closes[start] = m.start()
    for start in reversed(opens):
        if start in closes:
            return text[start + 1 : closes[start]]
    return None


def extract_answer(completion: str) -> str | None:
    """The model's final answer: the content of the last `<answer>...</answer>`, else the
    last `\\boxed{...}`, else None."""
    if not isinstance(completion, str):
        return None
    end = completion.rfind("</answer>")
    if end != -1:
        start = completion.rfind("<answer>", 0, end)
        if start != -1:
            # The first closing tag after that opening one: <answer><answer>5</answer></answer> -> 5
            end = completion.find("</answer>", start)
            content = completion[start + len("<answer>") : end].strip()
            if content:
                return content
    boxed = extract_boxed(completion)
    return boxed.strip() if boxed is not None else None


# --- gold answers per dataset ------------------------------------------------------------


def gold_from_gsm8k(answer_field: str) -> str | None:
    """GSM8K: the text after the last `####`, commas and `$` removed."""
    if not isinstance(answer_field, str) or "####" not in answer_field:
        return None
    gold = answer_field.rsplit("####", 1)[1].replace(",", "").replace("$", "").strip()
    return gold or None


def gold_from_math_solution(solution: str) -> str | None:
    """MATH: the content of the last `\\boxed{}` of the reference solution."""
    boxed = extract_boxed(solution)
    return boxed.strip() if boxed and boxed.strip() else None


_FLOAT_INT = re.compile(r"^(-?\d+)\.0*$")


def normalise_gold(value: Any, source: str = "") -> str | None:
    """The gold answer text of a dataset row's answer field, by source.

    gsm8k: worked solution ending in `#### n`; math: a solution with `\\boxed{}`;
    math500/aime/amc and anything else: the `answer` column (AMC floats like 27.0 mean 27).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        return None
    src = (source or "").lower()
    if src.startswith("gsm8k") or "####" in value:
        return gold_from_gsm8k(value)
    if src == "math" or (src.startswith("math") and "\\boxed" in value and len(value) > 200):
        return gold_from_math_solution(value)
    text = value.strip()
    m = _FLOAT_INT.match(text)
    if m and src.startswith(("amc", "aime")):
        return m.group(1)
    return text or None


# --- plain-number fast path ------------------------------------------------------------

_NUM_RE = re.compile(
    r"^(?P<sign>[-+\u2212]?)\s*(?:\\?\$)?\s*(?:"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)?(?P<dec>\.[0-9]+)?"  # 1,234.5 | 12 | .5
    r"|(?P<num>[0-9]+)\s*/\s*(?P<den>[0-9]+)"  # 3/4
    r"|\\[dt]?frac\s*\{\s*(?P<fsign>-?)\s*(?P<fnum>[0-9]+)\s*\}\s*\{\s*(?P<fden>[0-9]+)\s*\}"
    r"|\\[dt]?frac(?P<snum>[0-9])(?P<sden>[0-9])"  # \frac34
    r")\s*(?P<pct>\\?%)?$"
)
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_SPACING = re.compile(r"\\[!,;: ]|\\(?:quad|qquad)\b|~")


def _strip_wrappers(text: str) -> str:
    """Remove math delimiters, one enclosing \\boxed{}, a trailing period, LaTeX spacing."""
    s = text.strip()
    for _ in range(3):
        before = s
        for left, right in _WRAPPERS:
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : -len(right)].strip()
        m = _BOX_CMD.match(s)
        if m and s.endswith("}"):
            inner = extract_boxed(s)
            if inner is not None and m.end() + len(inner) + 1 == len(s):
                s = inner.strip()
        s = s.rstrip(".").strip()
        if s == before:
            break
    return _SPACING.sub("", s).replace("{,}", ",").strip()


def as_number(text: str) -> tuple[Fraction, bool, bool] | None:
    """(value, written as a decimal, has a percent sign) for a plain number, else None.

    Accepts ints, decimals, a/b, \\frac{a}{b}, thousands separators, a leading $ and a
    trailing %. Anything else (units, LaTeX expressions) returns None.
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    m = _NUM_RE.match(_strip_wrappers(text))
    if m is None:
        return None
    g = m.groupdict()
    negative = g["sign"] in ("-", "\u2212")
    if g["int"] is not None or g["dec"] is not None:
        digits = (g["int"] or "0").replace(",", "") + (g["dec"] or "")
        if len(digits) > 100:
            return None
        value, is_dec = Fraction(digits), g["dec"] is not None
    else:
        num = g["num"] or g["fnum"] or g["snum"]
        den = g["den"] or g["fden"] or g["sden"]
        if num is None or len(num) + len(den) > 100 or int(den) == 0:
            return None
        value, is_dec = Fraction(int(num), int(den)), False
        negative ^= g["fsign"] == "-"
    return (-value if negative else value), is_dec, g["pct"] is not None


def numbers_equal(gold: tuple[Fraction, bool, bool], pred: tuple[Fraction, bool, bool]) -> bool:
    """Exact equality, with math-verify's conventions: `50%` matches both 50 and 0.5, and
    when either side is written as a decimal both are compared rounded to 6 places."""
    gv, g_dec, g_pct = gold
    pv, p_dec, p_pct = pred
    golds = {gv, gv / 100} if g_pct else {gv}
    preds = {pv, pv / 100} if p_pct else {pv}
    if golds & preds:
        return True
    if g_dec or p_dec:
        return any(round(a, 6) == round(b, 6) for a in golds for b in preds)
    return False


_CANON_DROP = re.compile(r"\s+|\\left\b|\\right\b|\\displaystyle\b|\\[!,;: ]")


def _canon(text: str) -> str:
    """Cosmetic normal form: equal canon strings are certainly the same answer."""
    return (
        _CANON_DROP.sub("", _strip_wrappers(text))
        .replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
    )


class _LRU:
    """A small thread-safe LRU map (functools.lru_cache cannot skip caching timeouts)."""

    def __init__(self, maxsize: int):
        self.maxsize, self._data, self._lock = maxsize, OrderedDict(), threading.Lock()

    def get(self, key: Any, default: Any = None) -> Any:
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


_GOLDS = _LRU(8192)
_VERDICTS = _LRU(65536)
_PRED_PARSES = _LRU(4096)
_MISSING = object()


class GoldAnswer:
    """A gold answer parsed once, reusable across the G completions of a group.

    `number` is set for plain numbers (compared exactly, math-verify never needed);
    otherwise `parsed` holds math-verify's parse, made once by `parse_gold`.
    """

    __slots__ = ("canon", "number", "parsed", "profile", "text")

    def __init__(self, text: str, number: tuple | None, parsed: list | None):
        self.text = text
        self.number = number
        self.canon = _canon(text)
        self.parsed = parsed
        self.profile: tuple | None = None  # (value, varies), see _profile; made on first use

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
    return _strip_wrappers(text)


def parse_gold(text: Any, seconds: float | None = None) -> GoldAnswer | None:
    """Parse a gold answer once (cached by its text). None when it cannot be parsed, or when
    its parse overran `seconds` (default GOLD_DEADLINE_S, read at call time; not cached)."""
    if isinstance(text, GoldAnswer):
        return text
    try:
        key = _gold_key(text)
        if not key:
            return None
        hit = _GOLDS.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        number = as_number(key)
        if number is not None:
            gold = GoldAnswer(key, number, None)
        elif risky_reason(key, max_chars=MAX_GOLD_CHARS):
            gold = None
        else:
            math_verify_fns()
            parsed = call_with_deadline(mv_parse, key, seconds=seconds or GOLD_DEADLINE_S)
            if parsed is TIMED_OUT:
                return None  # not remembered: a less busy moment may parse it
            gold = GoldAnswer(key, None, parsed) if parsed else None
        _GOLDS.put(key, gold)
        return gold
    except Exception:  # noqa: BLE001 - a gold we cannot read is "no gold", never a crash
        return None


def _gold_profile(gold: GoldAnswer) -> tuple:
    if gold.number is not None and not gold.number[2]:  # a plain number (no percent sign)
        return complex(gold.number[0]), False
    return profile(gold.parsed) if gold.parsed else (None, False)


def _mv_check(gold: GoldAnswer, pred: str, pred_parsed: list | None) -> tuple[bool, list]:
    """(equal?, the prediction's parse). Runs under a deadline: touches no locks."""
    if pred_parsed is None:
        pred_parsed = mv_parse(pred)
    if not pred_parsed:
        return False, pred_parsed
    if gold.profile is None:
        gold.profile = _gold_profile(gold)
    if cannot_be_equal(gold.profile, profile(pred_parsed)):
        return False, pred_parsed
    if gold.parsed is None:  # a plain-number gold meeting a non-number prediction
        gold.parsed = mv_parse(gold.text)
    _, mv_verify = math_verify_fns()
    equal = bool(gold.parsed) and mv_verify(gold.parsed, pred_parsed, timeout_seconds=None)
    return equal, pred_parsed


def _verify_uncached(gold: GoldAnswer, pred: str, seconds: float) -> bool | None:
    stripped = _strip_wrappers(pred)
    if not stripped:
        return False
    if gold.number is not None:
        number = as_number(stripped)
        if number is not None:
            return numbers_equal(gold.number, number)
    canon = _canon(stripped)
    if canon and canon == gold.canon:
        return True
    if risky_reason(stripped):
        return False
    math_verify_fns()
    cached = _PRED_PARSES.get(stripped)  # the same wrong answer recurs across prompts
    result = call_with_deadline(_mv_check, gold, stripped, cached, seconds=seconds)
    if result is TIMED_OUT:
        return None
    equal, parsed = result
    if cached is None:
        _PRED_PARSES.put(stripped, parsed)
    return equal


def verify(gold: GoldAnswer | None, predicted: str | None, seconds: float | None = None) -> bool:
    """Is `predicted` (an extracted answer) equivalent to the gold? Never raises; takes at
    most about `seconds` (default BUDGET_S; a timeout counts as wrong and is not cached)."""
    if gold is None or not isinstance(predicted, str):
        return False
    pred = predicted.strip()
    if not pred or len(pred) > 4 * MAX_GOLD_CHARS:
        return False
    key = (gold.text, pred)
    hit = _VERDICTS.get(key)
    if hit is not None:
        return hit
    try:
        result = _verify_uncached(gold, pred, seconds or BUDGET_S)
    except Exception:  # noqa: BLE001 - hostile input is a wrong answer, not a crash
        result = False
    if result is None:
        return False
    _VERDICTS.put(key, result)
    return result


def is_equivalent(gold_text: Any, pred_text: str | None) -> bool:
    """Convenience: parse_gold + verify."""
    return verify(parse_gold(gold_text), pred_text)


def clear_caches() -> None:
    """Forget parsed golds and verdicts (benchmarks start cold)."""
    for cache in (_GOLDS, _VERDICTS, _PRED_PARSES):
        cache.clear()
