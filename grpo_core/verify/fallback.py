"""The flexible extraction's last resort, when a completion has no box, answer tag or answer
marker: its last complete math expression, else its last number.

The last number alone (lm-eval's gsm8k flexible-extract) splits expressions: "So the
result is \\frac{3}{4}." would be 4 and "the interval [0,1)" 1. So, in the last
MAX_TAIL chars:

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

from grpo_core.verify.units import looks_like_prose

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


def last_expression_or_number(text: str) -> str | None:
    """The flexible chain's last resort (see the module docstring), or None."""
    # MATH's thousands separator `32,\!000` is one number, not 32 and 000
    tail = text[-MAX_TAIL:].replace(",\\!", ",")
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
