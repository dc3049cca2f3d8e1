"""Reading answers: the final answer of a completion, the gold of a dataset row, and one
spelling for MATH's many spellings of a value.

Two extraction modes (`EXTRACTIONS`):

- `strict`: the template's own format: the first complete `<answer>...</answer>` block,
  else the last `\\boxed{...}`. Training rewards use it: it is what the prompt asks for.
  The *first* block, because generation stops at the first `</answer>` (prompts.stop_strings:
  filter, eval and GRPO rollouts alike); in a text that ran on (another engine, an old
  completion), what follows it is a turn the model invented, never its answer. A model
  that echoes the template's example (`<answer> answer here </answer>`) and then answers
  is scored on the echo: reading the last block would let it try again after a first
  block, and no stop rule would keep that text. docs/evaluation.md says the same.
- `flexible`: the chain the standard evaluators use (lm-evaluation-harness gsm8k
  flexible-extract, the Qwen2.5-Math and Minerva evaluators): the last `\\boxed{}`, else the
  first `<answer>` block, else the text after the last "the answer is" / "#### " / "A: " /
  "Answer: " marker, else the final expression whole (a bare answer `14 \\pi`, `0,1`, or
  the mathematics ending the last line, "So the result is 4+\\sqrt{2}."; GSM8K-style
  arithmetic `9 * 2 = $18` is left to the last number), else the last complete math
  expression (a `$...$` span, a `\\frac{..}{..}`, `\\sqrt{..}`, an interval or tuple), else
  the last number in the text (lm-eval's `(-?[$0-9.,]{2,})|(-?[0-9]+)`), which is taken
  only when no such expression follows it: an expression is never split for a number in
  it (grpo_core/verify/fallback.py). `$`, thousands commas and a trailing period are
  removed from a number so found.

Every scan is linear (no backtracking regex) and reads only the tail of a long completion:
the final answer is at the end, and megabyte input must cost what a short one does.

`clean_answer` (applied to gold and prediction before any comparison, grpo_core/verify/answers.py)
removes math delimiters, one enclosing `\\boxed{}` and a trailing period, then tidies:
`\\begin{pmatrix} 2 \\\\ 3 \\end{pmatrix}`'s row separator `\\\\` is kept (only the spacing
commands `\\!`, `\\,`, `\\ `, `\\quad`, `~` go: collapsing `\\\\ ` to `\\` turned a matrix
into its last entry); thousands separators `11,\\! 111`, `11{,}111`, `1\\,000` and
`1 000` (groups of three) are joined, and so are plain `5,525` commas of a brace group that
holds one number (`\\frac{12}{5,525}`); unbraced arguments are braced (`\\frac \\pi4` ->
`\\frac{\\pi}{4}`, `\\sqrt2` -> `\\sqrt{2}`, `\\dfrac`/`\\tfrac`/`\\cfrac` -> `\\frac`); `°` is
`^\\circ`; a trailing unit word goes, never a variable letter (grpo_core/verify/units.py).
`as_number` reads plain numbers exactly, mixed numbers `1 1/2` and `1\\frac{1}{2}` (a proper
fraction after an integer) and `1.2e3` included. Whitespace
between two digits is not cosmetic: `canonical("1 2")` is not `canonical("12")`, and
`SPLIT_DIGITS` finds such answers (answers.py refuses them as ambiguous).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from grpo_core.verify.fallback import clean_number, last_expression_or_number
from grpo_core.verify.units import strip_units

EXTRACTIONS = ("strict", "flexible")
MAX_BOXED_SCAN = 100_000  # \boxed{} is looked for in the last 100k chars only
MAX_MARKER_SCAN = 20_000  # "the answer is" and the last number: the last 20k chars only
MAX_MARKER_ANSWER = 300  # what follows a marker; a longer "answer" is a paragraph

BOX_COMMAND = re.compile(r"\\(?:boxed|fbox|framebox)\s*\{")
_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last brace-matched `\\boxed{...}` (or `\\fbox`, `\\framebox`).

    One left-to-right pass over the braces with an explicit stack: linear time, no
    recursion, so unbalanced or 10,000-deep input is fine.
    """
    if not isinstance(text, str) or "\\" not in text:
        return None
    text = text[-MAX_BOXED_SCAN:]  # bounds the Python loop below on megabyte input
    opens = [m.end() - 1 for m in BOX_COMMAND.finditer(text)]
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


def _answer_tag(completion: str) -> str | None:
    """The first complete `<answer>...</answer>` block's content (None when empty)."""
    start = completion.find("<answer>")
    if start == -1:
        return None
    end = completion.find("</answer>", start)
    if end == -1:
        return None
    # The innermost opening tag before that close: <answer><answer>5</answer></answer> -> 5
    start = completion.rfind("<answer>", start, end)
    return completion[start + len("<answer>") : end].strip() or None


def _boxed(completion: str) -> str | None:
    boxed = extract_boxed(completion)
    return boxed.strip() if boxed is not None else None  # "" for \boxed{}, as always


# "The final answer is", "the answer is", "#### ", "Answer:", and "A:" as a word of its own
# (not the end of "QA:"). Case-insensitive except "A:", which in lower case is prose.
_MARKER = re.compile(
    r"(?i:\bthe\s+(?:final\s+)?answer\s+is\b)|####|(?i:\banswer\s*:)|(?<![A-Za-z0-9])A:"
)
_LEADING_NUMBER = re.compile(r"-?\\?\$?\s*[0-9][0-9,]*(?:\.[0-9]+)?(?![0-9./])")
_MATH_AFTER = re.compile(r"[0-9\\^_{}=/+*()\[\]<>|-]")  # "8 apples" is 8; "8 + x" is not
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\n")


def _after_marker(text: str) -> str | None:
    """What follows the last answer marker, up to the end of its sentence or line."""
    tail = text[-MAX_MARKER_SCAN:]
    last = None
    for last in _MARKER.finditer(tail):  # only the last one matters
        pass
    if last is None:
        return None
    rest = tail[last.end() : last.end() + MAX_MARKER_ANSWER].lstrip(" \t\r\n:*")
    end = _SENTENCE_END.search(rest)
    answer = (rest[: end.start()] if end else rest).strip().rstrip(".").strip()
    if not answer:
        return None
    number = _LEADING_NUMBER.match(answer)
    if number and not _MATH_AFTER.search(answer[number.end() :]):
        # "8 apples", "$1,234 in total": the number is the answer (GSM8K)
        return clean_number(number.group()) or None
    return answer


def extract_answer(completion: str, extraction: str = "strict") -> str | None:
    """The model's final answer, or None. `strict` (default): the first complete
    `<answer>...</answer>` block, else the last `\\boxed{...}`. `flexible`: the last
    `\\boxed{}`, else the first `<answer>` block,
    else the last "the answer is"/"####"/"A:"/"Answer:" marker, else the final expression,
    else the last math expression or the last number after it."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown extraction {extraction!r}; known: {EXTRACTIONS}")
    if not isinstance(completion, str):
        return None
    if extraction == "strict":
        return _answer_tag(completion) or _boxed(completion)
    return (
        _boxed(completion)
        or _answer_tag(completion)
        or _after_marker(completion)
        or last_expression_or_number(completion)
    )


# --- one spelling per value ------------------------------------------------------------

MAX_TIDY_CHARS = 4096  # longer answers are judged unseen; their canon stays cosmetic
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# `\\` (a matrix row separator) is matched first so that its second backslash is never
# read as the start of `\ ` (the bug that turned a matrix into its last entry).
_SPACING = re.compile(r"\\\\|\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_THOUSANDS = re.compile(r"(?<=\d)(?:,\s*\\!|\{,\}|\\,|\\!)\s*(?=\d{3}(?!\d))")
# A brace group that is one number with thousands commas: `\\frac{12}{5,525}`, `\\sqrt{1,000}`
# (not an escaped set brace `\\{1,234\\}`, whose comma separates elements).
_BRACED_THOUSANDS = re.compile(r"(?<![\\])\{\s*-?\d{1,3}(?:,\d{3})+\s*\}")
_SPACE_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d./])")
_FRAC_ALIAS = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_TOKEN = r"([0-9A-Za-z]|\\[A-Za-z]+)"  # one TeX argument token: a char or a command
_FRAC_BARE2 = re.compile(r"\\frac\s*" + _TOKEN + r"\s*" + _TOKEN)  # \frac12, \frac \pi4
_FRAC_BARE1 = re.compile(r"\\frac\s*" + _TOKEN + r"\s*\{")  # \frac1{2}
_FRAC_BARE_DEN = re.compile(r"\\frac\s*(\{[^{}]*\})\s*" + _TOKEN)  # \frac{1}2
_SQRT_BARE = re.compile(r"\\sqrt\s*(\[[^\]]*\])?\s*" + _TOKEN)  # \sqrt2, \sqrt[3]x
SPLIT_DIGITS = re.compile(r"\d\s+\d")


def _spacing(m: re.Match) -> str:
    tok = m.group()
    return tok if tok == "\\\\" else ("" if tok in ("\\!", "\\,") else " ")


def _tidy(s: str) -> str:
    """MATH's spellings of one value made one: see the module docstring."""
    if "\u00b0" in s:  # 90° is 90^\circ
        s = s.replace("\u00b0", "^\\circ")
    if "\\" in s or "{" in s:
        s = _THOUSANDS.sub("", s)
        if "," in s and "{" in s:
            s = _BRACED_THOUSANDS.sub(lambda m: m.group().replace(",", ""), s)
        s = _SPACING.sub(_spacing, s) if "\\" in s or "~" in s else s
        s = s.replace("{,}", ",")
        if "frac" in s or "sqrt" in s:
            s = _FRAC_ALIAS.sub(r"\\frac", s)
            s = _FRAC_BARE2.sub(r"\\frac{\1}{\2}", s)
            s = _FRAC_BARE1.sub(r"\\frac{\1}{", s)
            s = _FRAC_BARE_DEN.sub(r"\\frac\1{\2}", s)
            s = _SQRT_BARE.sub(lambda m: f"\\sqrt{m.group(1) or ''}{{{m.group(2)}}}", s)
    if " " in s:
        s = _SPACE_THOUSANDS.sub(lambda m: m.group().replace(" ", ""), s)
    return s.strip()


def clean_answer(text: str) -> str:
    """Remove math delimiters, one enclosing \\boxed{}, a trailing period; then tidy."""
    s = text.strip()
    # Every wrapper starts with `$` or `\`: most answers ("18") skip the loop.
    for _ in range(3 if s[:1] in ("$", "\\") or s.endswith(".") else 0):
        before = s
        for left, right in _WRAPPERS:
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : -len(right)].strip()
        m = BOX_COMMAND.match(s)
        if m and s.endswith("}"):
            inner = extract_boxed(s)
            if inner is not None and m.end() + len(inner) + 1 == len(s):
                s = inner.strip()
        s = s.rstrip(".").strip()
        if s == before:
            break
    return strip_units(_tidy(s)) if len(s) <= MAX_TIDY_CHARS else s


# --- plain-number fast path ------------------------------------------------------------

_NUM_RE = re.compile(
    r"^(?P<sign>[-+\u2212]?)\s*(?:\\?\$)?\s*(?:"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)?(?P<dec>\.[0-9]+)?"  # 1,234.5 | 12 | .5
    r"(?:[eE](?P<exp>[-+]?[0-9]{1,3}))?"  # 1.2e3
    r"|(?P<whole>[0-9]+)(?:\s+|\s*(?=\\frac))"  # a mixed number: 1 1/2, 1\frac{1}{2}
    r"(?:(?P<mnum>[0-9]+)\s*/\s*(?P<mden>[0-9]+)|\\frac\{(?P<mfnum>[0-9]+)\}\{(?P<mfden>[0-9]+)\})"
    r"|(?P<num>[0-9]+)\s*/\s*(?P<den>[0-9]+)"  # 3/4
    r"|\\frac\s*\{\s*(?P<fsign>-?)\s*(?P<fnum>[0-9]+)\s*\}\s*\{\s*(?P<fden>[0-9]+)\s*\}"
    r")\s*(?P<pct>\\?%)?$"
)


def _parts(g: dict) -> tuple[Fraction, bool] | None:
    """(value, written as a decimal) of a _NUM_RE match, or None."""
    if g["int"] is not None or g["dec"] is not None:
        digits = (g["int"] or "0").replace(",", "") + (g["dec"] or "")
        if len(digits) > 100:
            return None
        value = Fraction(digits) if g["dec"] else Fraction(int(digits))  # int: 3x faster
        if g["exp"]:
            value *= Fraction(10) ** int(g["exp"])
        return value, g["dec"] is not None or g["exp"] is not None
    num = g["num"] or g["fnum"] or g["mnum"] or g["mfnum"]
    den = g["den"] or g["fden"] or g["mden"] or g["mfden"]
    if num is None or len(num) + len(den) > 100 or int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    if g["whole"] is not None:
        if value >= 1 or len(g["whole"]) > 50:  # 2 5/3 is no mixed number: not ours to read
            return None
        value += int(g["whole"])
    return (-value if g["fsign"] == "-" else value), False


def as_number(text: str) -> tuple[Fraction, bool, bool] | None:
    """(value, written as a decimal, has a percent sign) for a plain number, else None.

    Accepts ints, decimals, 1.2e3, a/b, \\frac{a}{b}, mixed numbers, thousands separators,
    a leading $ and a trailing %. Anything else (units, LaTeX expressions) returns None.
    """
    if not isinstance(text, str) or len(text) > 200:
        return None
    m = _NUM_RE.match(clean_answer(text))
    if m is None:
        return None
    parts = _parts(m.groupdict())
    if parts is None:
        return None
    value, is_dec = parts
    negative = m.group("sign") in ("-", "\u2212")
    return (-value if negative else value), is_dec, m.group("pct") is not None


_CANON_DROP = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])")
_DIGIT_GAP = re.compile(r"(?<=\d)\s+(?=\d)")
_WS = re.compile(r"\s+")


def canonical(text: str) -> str:
    """Cosmetic normal form: equal canon strings are certainly the same answer. Whitespace
    goes, except between two digits (`1 2` is not `12`)."""
    s = _CANON_DROP.sub("", clean_answer(text))
    return _WS.sub("", _DIGIT_GAP.sub("\x01", s)).replace("\x01", " ")


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
