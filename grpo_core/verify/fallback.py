"""The flexible extraction's last resort, when a completion has no box, answer tag or answer
marker: its final expression, else its last complete math expression, else its last number.

The last number alone (lm-eval's gsm8k flexible-extract) splits expressions: "So the
result is \\frac{3}{4}." would be 4, "the interval [0,1)" 1, a bare `14 \\pi` 14 and
`0,1` 01. So, in the last MAX_TAIL chars:

0. the final expression, whole: the completion itself when it is a bare answer (no word of
   prose, at most MAX_SPAN chars: `14 \\pi`, `4+\\sqrt{2}`, a column vector, `0, 1`), else
   what follows the last word of prose on its last line ("So the result is 14 \\pi.");
   not when that is GSM8K-style arithmetic (`9 * 2 = $18`, `x = 18`, `12 x 2 = 24`) or a
   word: lm-eval's last number (3) reads those;
1. the last math span `$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]` whose content is mathematics,
   not prose (a currency sign pairs with the next one as `$5 and $`: that is prose, or it
   ends in an operator, and is skipped);
2. the last LaTeX construct outside such spans: `\\frac{..}{..}` (`\\dfrac`, `\\tfrac`),
   `\\sqrt{..}` (with a number or sign glued before it: `-3\\sqrt{2}`), an interval or
   tuple of numbers `[0, 1)`, `(2, -\\frac{1}{2})` (not `(1,000)`, a thousands number);
3. the last number, lm-eval's `(-?[$0-9.,]{2,})|(-?[0-9]+)`, cleaned of `$`, thousands
   commas and a trailing period: taken when it starts after the end of the expression
   of 1-2 (or there is none). A number inside the expression never splits it.

Every scan is a regex without nested quantifiers over a bounded tail: linear time.
"""

from __future__ import annotations

import re

from grpo_core.verify.safe_eval import risky_reason
from grpo_core.verify.units import FUNCTION_NAMES, looks_like_prose, prose_end

MAX_TAIL = 20_000  # the last 20k chars only: the answer is at the end
MAX_SPAN = 300  # longer "math" between two `$` is prose with currency signs

# lm-evaluation-harness gsm8k flexible-extract: the last match decides.
_LAST_NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_BODY = r"([^$]{1,300}?)"  # MAX_SPAN
_SPAN = re.compile(
    rf"(?<!\\)\$\${_BODY}\$\$|(?<!\\)\${_BODY}\$|\\\({_BODY}\\\)|\\\[{_BODY}\\\]"
)
_CONSTRUCT_START = re.compile(r"(?:-\s*)?(?:\d+(?:\.\d+)?\s*)?\\(?:[dtc]?frac|sqrt)(?![A-Za-z])")
_ITEM = (
    r"\s*-?\s*(?:\d+(?:\.\d+)?\s*(?:\\pi|\\sqrt\{\d+\})?|\\infty|\\pi"
    r"|\\[dtc]?frac\{[^{}]{1,40}\}\{[^{}]{1,40}\}|\\sqrt\{[^{}]{1,40}\})\s*"
)
_TUPLE = re.compile(r"(?:\\left)?[\[(]" + _ITEM + r"(?:," + _ITEM + r"){1,9}(?:\\right)?[\])]")
_THOUSANDS_ONLY = re.compile(r"\(\d{1,3}(?:,\d{3})+\)")
_DANGLING = re.compile(r"[-+*/=^_,\\]\s*$")


def clean_number(text: str) -> str:
    """`$1,234.` -> `1234`: lm-eval's clean-up of a GSM8K-style number."""
    return text.replace("\\$", "").replace("$", "").replace(",", "").strip().rstrip(".")


def _braced_end(text: str, i: int, groups: int) -> int | None:
    """The end of `groups` brace groups starting at text[i] (spaces and one `[..]` root
    index allowed before the first), or None when they are not complete."""
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i < n and text[i] == "[":  # \sqrt[3]{..}
        close = text.find("]", i, i + 20)
        if close == -1:
            return None
        i = close + 1
    for _ in range(groups):
        while i < n and text[i] == " ":
            i += 1
        if i < n and text[i].isalnum():  # an unbraced one-character argument: \frac65
            i += 1
            continue
        if i >= n or text[i] != "{":
            return None
        depth = 0
        for j in range(i, min(n, i + MAX_SPAN)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                i = j + 1
                break
        else:
            return None
    return i


def _last_span(tail: str) -> tuple[int, str] | None:
    found = None
    for m in _SPAN.finditer(tail):
        content = next(g for g in m.groups() if g is not None).strip()
        if content and not looks_like_prose(content) and not _DANGLING.search(content):
            found = (m.end(), content)
    return found


def _last_construct(tail: str) -> tuple[int, str] | None:
    found = None
    for m in _CONSTRUCT_START.finditer(tail):
        groups = 2 if "frac" in m.group() else 1
        end = _braced_end(tail, m.end(), groups)
        # the outermost construct: \frac{1 + \sqrt{5}}{4}, not the \sqrt{5} inside it
        if end is not None and (found is None or end > found[0]):
            found = (end, tail[m.start() : end].strip())
    for m in _TUPLE.finditer(tail):
        if not _THOUSANDS_ONLY.fullmatch(m.group().replace(" ", "")) and (
            found is None or m.end() > found[0]
        ):
            found = (m.end(), m.group())
    return found


# What lm-eval's last number reads, in GSM8K-style text (`x` there is times):
# - arithmetic: numbers, operators and currency signs only, with a computation in it (`=`,
#   a sum or product, a spaced minus, a comparison, GSM8K's bare `$`, not LaTeX's `\$`);
# - an equation whose last side is a number, units and words after it allowed, and whose
#   side before it holds at most one variable (a letter standing alone) and no LaTeX:
#   `x = 18`, `12 x 2 = 24`, `2s + 16 = 32`, `30/1.5 = 20mph`, `... = 762 M&M's`; or whose
#   last side is a variable and the one before a number (`6 = x`);
# - an amount with its units (`352 kg`, `20mph`, `5 m/s`, `8%`, `2:00 am`), words alone
#   (`in`), or after a word that is no function name (`in 2020`); digits apart (`1 1 1`).
# Not `x - 3z = 0`, `x^2 + y^2 = 13`, `y = x+3`, a fraction `3/4`, a list `0,1` or `1, -3`,
# `-\$0.50`, `2n`, a letter `A`: answers, read whole.
_ARITHMETIC = re.compile(r"[-+*/×÷=<>().,%$\s0-9]+")
_COMPUTATION = re.compile(r"[=<>]|(?<!\\)\$|[\d)]\s*[+*×÷]\s*\$?[\d(]|\d\s+-\s+\$?[\d(]")
_TIMES = re.compile(r"(?<=[\d)])\s*[xX]\s*(?=\$?[\d(])|\s+[xX]\s+(?=\$?[\d(])")
_AMOUNT = r"\s*-?\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?::\d\d|\.\d+)?%?"  # 1,234.5 $6 8% 2:00
# after the number: words past a space, a glued unit (`20mph`, `$7/min`); not `2x`
_NUMBER_SIDE = re.compile(_AMOUNT + r"(?:(?:\s|[A-Za-z]{2}|/)[^0-9\\^_{}=+*()\[\]<>|-]*)?")
# a first unit of two letters or more (`352 kg`, `20mph`) or a rate (`5 m/s`), more words
_WITH_UNITS = re.compile(
    _AMOUNT + r"(?:\s*(?:[A-Za-z]{2,}(?:/[A-Za-z]+)?|[A-Za-z]?/[A-Za-z]+)(?:\s+[A-Za-z./]+)*)?\s*"
)
_WORDS = re.compile(r"[A-Za-z]{2,}(?:\s+[A-Za-z]+)*")
_SPACED_DIGITS = re.compile(r"\d\s+\d")
_SPACE_THOUSANDS = re.compile(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_LEADING_WORD = re.compile(r"([a-z]{2,})\s")
_LETTER = re.compile(r"\(?[A-Za-z]\)?")
_LATEX = re.compile(r"[\\^_{}]")
_SINGLE_LETTER = re.compile(r"(?<![A-Za-z])[A-Za-z](?![A-Za-z])")
_LABEL = re.compile(r"(?<![A-Za-z\\])[A-Za-z]+\s*:\s")
# quotes, `;` (code, HTML entities), `**`, `__`, backticks; characters outside printable
# ASCII but for a few of mathematics
_NOT_AN_ANSWER = re.compile(r"['\";`]|\*\*|__|[^\x20-\x7e×÷°π√−·≤≥≠]")
_CONTENT = re.compile(r"[0-9A-Za-z]")
_BEFORE_MATH = re.compile(r"[^0-9A-Za-z\\$(\[{.+\-|]*")  # no final expression starts so


def _last_number_reads(text: str) -> bool:
    """Whether `text` is GSM8K-style, read by lm-eval's last number (see above)."""
    times = _TIMES.sub("*", text)
    if _ARITHMETIC.fullmatch(times.replace("\\$", "$")) and _COMPUTATION.search(times):
        return True
    if "=" in times:
        before, last = times.split("=")[-2:]
        variables = {m.group().lower() for m in _SINGLE_LETTER.finditer(before)}
        if _NUMBER_SIDE.fullmatch(last) and len(variables) <= 1 and not _LATEX.search(before):
            return True
        if _SINGLE_LETTER.fullmatch(last.strip()) and re.fullmatch(_AMOUNT, before.strip()):
            return True
        unit = re.fullmatch(_AMOUNT + r"([A-Za-z])", last.strip())  # `1200m-300m = 900m`
        if unit and re.search(rf"\d{unit.group(1)}(?![A-Za-z])", before):
            return True
    if _WITH_UNITS.fullmatch(text) or _WORDS.fullmatch(text):
        return True
    if _SPACED_DIGITS.search(text) and not _SPACE_THOUSANDS.fullmatch(text):
        return True  # `1 1 1`: no one number (`10 000` is one)
    word = _LEADING_WORD.match(text)  # "... than in 2020": a word of prose all the same
    return word is not None and word.group(1).lower() not in FUNCTION_NAMES


def final_expression(tail: str) -> str | None:
    """Step 0 of the module docstring: the bare answer, or the last line's mathematics after
    its last word of prose, whole; None when there is none or lm-eval's number reads it."""
    text = tail.strip()
    if len(text) > MAX_SPAN or looks_like_prose(text):
        line = text.rsplit("\n", 1)[-1]
        text = line[prose_end(line) :]
    labels = list(_LABEL.finditer(text))  # "QA: 5": a label is prose too
    if labels:
        text = text[labels[-1].end() :]
    lead = _BEFORE_MATH.match(text := text.strip()).group()
    if "=" in lead or "<" in lead or ">" in lead:  # the result of a computation: lm-eval's
        return None
    text = text[len(lead) :].rstrip().rstrip(".").rstrip()
    if not text or len(text) > MAX_SPAN or _DANGLING.search(text) or _last_number_reads(text):
        return None
    if _NOT_AN_ANSWER.search(text) or not _CONTENT.search(text) or risky_reason(text):
        return None  # code, markup, control characters, or what no scorer reads: as before
    return text


def last_expression_or_number(text: str) -> str | None:
    """The flexible chain's last resort (see the module docstring), or None."""
    final = final_expression(text[-MAX_TAIL:])
    if final is not None and not (_LETTER.fullmatch(final) and final != text.strip()):
        return final
    # A letter ending prose ("... than box B.") is an answer only where no number is.
    # MATH's thousands separator `32,\!000` is one number, not 32 and 000
    tail = text[-MAX_TAIL:].replace(",\\!", ",")
    return _last_expression_or_number(tail) or final


def _last_expression_or_number(tail: str) -> str | None:
    """Steps 1-3 of the module docstring."""
    expression = None
    if "$" in tail or "\\" in tail or "(" in tail or "[" in tail:
        span = _last_span(tail) if "$" in tail or "\\(" in tail or "\\[" in tail else None
        construct = _last_construct(tail)
        if span and construct:
            expression = span if span[0] >= construct[0] else construct
        else:
            expression = span or construct
    number = None
    for m in _LAST_NUMBER.finditer(tail):
        cleaned = clean_number(m.group())
        # one with no digit left after cleaning ("...", ",,") does not count
        if any(ch.isdigit() for ch in cleaned):
            number = (m.start(), cleaned)
    if expression is not None and (number is None or number[0] < expression[0]):
        return expression[1]
    return number[1] if number else None
