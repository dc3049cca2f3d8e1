"""Units after a number, told apart from variables; words told apart from products of letters.

The rule (one of the equivalence rules listed in grpo_core/verify/answers.py):

- A unit is a *word*: the content of a trailing `\\text{...}` / `\\mbox{...}` (also
  `\\textrm`, `\\textnormal`, `\\mathrm`), or one of the unit words of UNIT_WORDS (cm,
  inches, degrees, dollars, square units, ...), after a number, a closing bracket or a
  space, at the end of the answer, optionally squared or cubed (`\\text{ cm}^2`, `5 cm^3`).
  `strip_units` removes it: `5\\text{ cm}`, `5 cm` and `5` are one answer.
- A letter is never a unit: `4t`, `4 s`, `2xy`, `3ab`, `3qr + 6q - 15r - 30` are
  expressions in their variables. math-verify's own unit list holds single letters and
  pairs (t, s, h, m, c, ab, bc, ...), which read `4t` as 4 and `3ab` as 3; we parse with its
  unit stripping off (`MV_NORMALISATION`) and strip units here instead. A reward that
  accepted a dropped variable would teach the model to drop variables.
- `looks_like_prose`: an answer holds prose when a word stands apart from the mathematics
  (`18 apples`, `The answer is 5`): three or more letters that are neither glued to a digit
  nor a function name, or a two-letter English word (is, of, so, ...). Letters glued to a
  digit (`3qr`) and other pairs (`ab + bc`) are variables.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Multi-letter unit words only (a single letter is a variable). Plurals are matched by an
# optional s/es. "in" is left out: `5 in` is as likely a cut-off sentence.
UNIT_WORDS = (
    "cm", "mm", "km", "meter", "metre", "centimeter", "centimetre", "millimeter",
    "kilometer", "inch", "inches", "ft", "feet", "foot", "yd", "yard", "mile", "mph", "kph",
    "sec", "second", "min", "minute", "hr", "hour", "day", "week", "month", "yr", "year",
    "dollar", "cent", "euro", "degree", "deg", "radian", "rad", "unit", "gram", "kg", "mg",
    "lb", "pound", "ounce", "oz", "liter", "litre", "ml", "gallon", "cup", "acre",
)  # fmt: skip
_UNIT = (
    r"(?:(?:square|sq\.?|cubic|cu\.?)\s+)?(?:"
    + "|".join(sorted(UNIT_WORDS, key=len, reverse=True))
    + r")(?:e?s)?\.?"
)
_POWER = r"(?:\s*\^\s*(?:\{\s*[23]\s*\}|[23]))?"
_BEFORE = r"(?<=[0-9}\)\]\s])"  # after a number, a closing bracket or a space
_TEXT_UNIT = re.compile(
    _BEFORE + r"\s*\\(?:text|textrm|textnormal|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}"
    + _POWER + r"\s*$"
)
_WORD_UNIT = re.compile(_BEFORE + r"\s*" + _UNIT + _POWER + r"\s*$", re.IGNORECASE)


def strip_units(text: str) -> str:
    """`text` without a trailing unit word (see the module docstring); unchanged when
    nothing would be left."""
    if not text or not any(ch.isalpha() for ch in text[-40:]):
        return text
    for unit in (_TEXT_UNIT, _WORD_UNIT):
        m = unit.search(text, max(0, len(text) - 80))
        if m and text[: m.start()].strip():
            text = text[: m.start()].rstrip()
    return text


_COMMANDS = re.compile(r"\\[A-Za-z]+")
# \text{...} and the name of an environment (`\begin{pmatrix}`) are not prose: read as
# prose, a spaced matrix loses its boxed read and becomes its last entry.
_TEXT_ARGS = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname|begin|end)\s*\{[^{}]*\}")
_WORD = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2,}(?![A-Za-z0-9])")
FUNCTION_NAMES = frozenset(
    "sin cos tan cot sec csc log ln exp lim max min gcd lcm det mod arcsin arccos arctan "
    "sinh cosh tanh sqrt frac pi inf infty".split()
)
_TWO_LETTER_WORDS = frozenset("is of so we it or to be an as at by if on no".split())


def _blank(m: re.Match) -> str:
    return " " * len(m.group())  # the same length: positions stay those of the text


def _prose_words(text: str) -> Iterator[re.Match]:
    """The words of prose in `text` (see looks_like_prose), as matches at their places."""
    bare = _COMMANDS.sub(_blank, _TEXT_ARGS.sub(_blank, text))
    for m in _WORD.finditer(bare):
        word = m.group().lower()
        two_letter = len(word) == 2
        if (two_letter and word in _TWO_LETTER_WORDS) or (not two_letter and word not in FUNCTION_NAMES):
            yield m


def looks_like_prose(text: str) -> bool:
    """`18 apples`, `The answer is 5`: a word standing apart from the mathematics outside
    LaTeX commands, \\text{} and environment names (see the module docstring)."""
    return next(_prose_words(text), None) is not None


def prose_end(text: str) -> int:
    """Where the last word of prose in `text` ends; 0 when it holds none."""
    end = 0
    for m in _prose_words(text):
        end = m.end()
    return end


def mv_extraction_config() -> list:
    """math-verify's default extraction targets with its unit stripping off (see above)."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    normalisation = NormalizationConfig(basic_latex=True, units=False, malformed_operators=True,
                                        nits=True, boxed="all", equations=False)
    return [LatexExtractionConfig(normalization_config=normalisation), ExprExtractionConfig()]
