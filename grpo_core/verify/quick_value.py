"""A cheap numeric reading of simple answers, to disprove most unequal pairs without
math-verify's LaTeX parser (an ANTLR parse costs ~10 ms; most of a verdict's time).

`quick_profile(text)` reads a small subset of LaTeX arithmetic: numbers, single-letter
variables (`i` too: math-verify keeps it a symbol), `\\pi`, `\\frac{}{}`, `\\sqrt{}` /
`\\sqrt[n]{}`, `^`, `\\cdot`, `\\times`, `+ - * /`, brackets, implicit products
(`3\\sqrt{2}`, `2xy`), degrees `90^\\circ` (90); tuples / intervals / lists of those; and a
few shapes whole: an equation of those (`y = 2x + 1`), a matrix, a union of intervals, a
word (`\\text{odd}`, `\\text{(B)}`). It returns a profile, or None for anything else
(inequalities, sets, functions, other text): those go to math-verify as before.

    ("value", v, varies, points)   v: the value when it is a constant (complex), else None;
                                   varies: whether it provably depends on its variables;
                                   points: its values at two generic points of its
                                   variables (real ones only), or None
    ("items", [profiles])          a comma-separated tuple, interval or list
    ("eq", profile)                an equation: the profile of its right-hand side
    ("matrix",) ("union",)         a matrix of two or more entries; intervals joined by \\cup
    ("word",)                      a word math-verify reads as a symbol (not `e`, `i`, `pi`)

`quick_unequal(a, b)` is True only when the two surely differ under math-verify: two
constant values more than 1e-6 apart (math-verify's loosest rule rounds to 6 decimals), a
constant against an expression that varies, two expressions whose values differ at both
generic points (math-verify compares variables by name, case-insensitively), two lists of
constants whose sets of values differ (a bare list is a set), one value against a list of
several values; an equation's right-hand side against an answer that is no equation (what
math-verify compares); a matrix or a union of intervals against a scalar or a word; a word
against a constant. Equality is never decided here.
Nothing is evaluated by Python's eval: a hand-written parser over a bounded token list.
"""

from __future__ import annotations

import cmath
import math
import re

MAX_CHARS = 200
MAX_EXPONENT = 64.0
INFINITY = 1e300
_POINTS = (0.5772156649015329, 1.3247179572447460)  # generic points, as math_verify_adapter.profile
_TOKEN = re.compile(
    r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|\\(frac|dfrac|tfrac|sqrt|pi|infty|cdot|times|left|right)(?![A-Za-z])"
    r"|([A-Za-z])|([-+*/^{}()\[\],]))"
)


class _Unsupported(Exception):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos, n = [], 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise _Unsupported
        num, cmd, letter, op = m.groups()
        if num is not None:
            out.append(("num", num))
        elif cmd is not None:
            if cmd not in ("left", "right"):  # \left( is (
                out.append(("cmd", "frac" if cmd.endswith("frac") else cmd))
        elif letter is not None:
            # Euler's number, and `I`; `i` is a symbol to math-verify, as any letter
            if letter in "eEI":
                raise _Unsupported
            out.append(("var", letter))
        else:
            out.append(("op", op))
        pos = m.end()
    return out


class _Reader:
    """Recursive descent over the tokens, evaluated at one point of the variables."""

    def __init__(self, toks: list, point: float):
        self.toks, self.i, self.point = toks, 0, point
        self.vars: set[str] = set()

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            raise _Unsupported
        self.i += 1
        return tok[1]

    def expr(self) -> complex:
        value = self.term()
        while (tok := self.peek()) and tok in (("op", "+"), ("op", "-")):
            self.i += 1
            value = value + self.term() if tok[1] == "+" else value - self.term()
        return value

    def term(self) -> complex:
        value = self.signed()
        while (tok := self.peek()) is not None:
            if tok in (("op", "*"), ("op", "/"), ("cmd", "cdot"), ("cmd", "times")):
                self.i += 1
                right = self.signed()
                if tok[1] == "/":
                    if right == 0:
                        raise _Unsupported
                    value /= right
                else:
                    value *= right
            elif tok[0] in ("num", "var", "cmd") or tok in (("op", "("), ("op", "{")):
                value *= self.power()  # implicit product: 3\sqrt{2}, 2xy, 2(x+1)
            else:
                break
        return value

    def signed(self) -> complex:
        if self.peek() in (("op", "-"), ("op", "+")):
            sign = -1 if self.take("op") == "-" else 1
            return sign * self.signed()
        return self.power()

    def power(self) -> complex:
        base = self.atom()
        if self.peek() == ("op", "^"):
            self.i += 1
            exponent = self.signed() if self.peek() != ("op", "{") else self.atom()
            if abs(exponent) > MAX_EXPONENT:
                raise _Unsupported
            if base == 0 and exponent.real <= 0:
                raise _Unsupported
            base = base**exponent
        return base

    def group(self) -> complex:
        self.take("op", "{")
        value = self.expr()
        self.take("op", "}")
        return value

    def atom(self) -> complex:
        kind, value = self.peek() or ("", "")
        if kind == "num":
            self.i += 1
            return complex(float(value))
        if kind == "var":
            self.i += 1
            self.vars.add(value.lower())
            # math-verify lower-cases symbols: X is x
            return complex(self.point + (ord(value.lower()) - 96) / 29)
        if (kind, value) == ("op", "{"):
            return self.group()
        if (kind, value) == ("op", "("):
            self.i += 1
            inner = self.expr()
            self.take("op", ")")
            return inner
        if kind == "cmd":
            self.i += 1
            return self.command(value)
        raise _Unsupported

    def argument(self) -> complex:
        return self.group() if self.peek() == ("op", "{") else self.atom()

    def command(self, value: str) -> complex:
        """\\pi, \\frac{a}{b}, \\sqrt{a}, \\sqrt[n]{a} (\\cdot and \\times are read by term)."""
        if value == "pi":
            return complex(math.pi)
        if value == "infty":  # an interval's open end: a stand-in far past any answer
            return complex(INFINITY)
        if value == "frac":
            num, den = self.argument(), self.argument()
            if den == 0:
                raise _Unsupported
            return num / den
        if value == "sqrt":
            root = 2.0
            if self.peek() == ("op", "["):
                self.i += 1
                root = float(self.take("num"))
                self.take("op", "]")
                if root == 0:
                    raise _Unsupported
            arg = self.argument()
            return cmath.sqrt(arg) if root == 2 else arg ** (1 / root)
        raise _Unsupported


def _value(toks: list) -> tuple:
    values, names = [], set()
    for point in _POINTS:
        reader = _Reader(toks, point)
        values.append(reader.expr())
        if reader.i != len(toks):
            raise _Unsupported
        names |= reader.vars
    v1, v2 = values
    if not (cmath.isfinite(v1) and cmath.isfinite(v2)):
        raise _Unsupported
    if not names:
        return ("value", v1, False, None)
    varies = abs(v1 - v2) > 1e-6 * max(1.0, abs(v1))
    real = abs(v1.imag) < 1e-12 and abs(v2.imag) < 1e-12  # no branch of a root involved
    return ("value", None, varies, (v1.real, v2.real) if real else None)


def number_profile(value: complex) -> tuple:
    """The profile of a plain number (as answers reads one exactly)."""
    return ("value", complex(value), False, None)


def _split_items(toks: list) -> list[list] | None:
    """The items of a bracketed or bare comma list at depth 0, or None when no comma."""
    if any(t == ("op", ",") for t in toks):
        if toks[0] in (("op", "("), ("op", "[")) and toks[-1] in (("op", ")"), ("op", "]")):
            toks = toks[1:-1]
        items, depth, current = [], 0, []
        for t in toks:
            if t in (("op", "("), ("op", "["), ("op", "{")):
                depth += 1
            elif t in (("op", ")"), ("op", "]"), ("op", "}")):
                depth -= 1
            if t == ("op", ",") and depth == 0:
                items.append(current)
                current = []
            else:
                current.append(t)
        items.append(current)
        return items if all(items) and depth == 0 else None
    return None


_MATRIX = re.compile(r"\\begin\{([pbBvV]?matrix)\}(.*)\\end\{\1\}", re.DOTALL)
_WORD = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm)\s*\{\s*(\(?[A-Za-z][A-Za-z ]*\)?)\s*\}")
# words math-verify reads as constants (\text{pi} is pi, a symbol e equals E), or may
_CONSTANT_WORDS = frozenset("e i pi oo inf infty infinity nan zoo".split())


def _interval(toks: list) -> bool:
    """Whether toks are one interval: two values in brackets."""
    if not toks or toks[0] not in (("op", "("), ("op", "[")) or toks[-1] not in (
        ("op", ")"), ("op", "]")
    ):
        return False
    items = _split_items(toks) or []
    return len(items) == 2 and all(_value(item) for item in items)


def _shape(text: str) -> tuple | None:
    """A matrix, a word, a union of intervals or an equation written whole, or None."""
    m = _MATRIX.fullmatch(text)
    if m:
        body = m.group(2)
        many = "&" in body or "\\\\" in body
        return ("matrix",) if many and "\\begin" not in body else None
    m = _WORD.fullmatch(text)
    if m:
        word = m.group(1).strip("() ").lower()
        return ("word",) if word and word not in _CONSTANT_WORDS else None
    if "\\cup" in text:
        parts = text.split("\\cup")
        return ("union",) if all(_interval(_tokens(part)) for part in parts) else None
    if "=" in text:
        sides = [_value(_tokens(side)) for side in text.split("=")]  # each one value
        return ("eq", sides[-1])
    return None


def quick_profile(text: str) -> tuple | None:
    """The profile of `text` (see the module docstring), or None outside the subset."""
    if not text or len(text) > MAX_CHARS:
        return None
    circ = "circ" in text
    if circ:  # 90^\\circ is 90, as math-verify reads it (not pi/2)
        text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    try:
        if any(cue in text for cue in _SHAPE_CUES):
            profile = _shape(text)
        else:
            toks = _tokens(text)
            items = _split_items(toks) if toks else None
            if items is not None:
                profile = ("items", [_value(item) for item in items])
            elif not toks or any(t == ("op", "[") or t == ("op", "]") for t in toks):
                return None  # a one-item bracket is nothing we read
            else:
                profile = _value(toks)
    except (_Unsupported, ArithmeticError, ValueError, OverflowError):
        return None
    if circ and profile is not None:  # degrees of a variable: math-verify's reading of them
        profile = _without_points(profile)  # is not ours to guess
    return profile


_SHAPE_CUES = ("\\begin", "\\text", "\\mbox", "\\mathrm", "\\cup", "=")


def _without_points(profile: tuple) -> tuple:
    if profile[0] == "eq":
        return ("eq", _without_points(profile[1]))
    return profile[:3] + (None,) if profile[0] == "value" else profile


def _values_unequal(a: tuple, b: tuple) -> bool:
    (_, av, a_varies, a_points), (_, bv, b_varies, b_points) = a, b
    if av is not None and bv is not None:
        return abs(av - bv) > 1e-6 * max(1.0, abs(av))
    if a_points is not None and b_points is not None:  # both read with their variables
        return all(abs(x - y) > 1e-6 * max(1.0, abs(x)) for x, y in zip(a_points, b_points))
    return (av is not None and b_varies) or (bv is not None and a_varies)


def _constants(profile: tuple) -> set | None:
    """The distinct constant values of an item list (rounded), None if any item varies."""
    if any(i[1] is None for i in profile[1]):
        return None
    return {(round(i[1].real, 6), round(i[1].imag, 6)) for i in profile[1]}


def _shape_unequal(a: tuple, b: tuple) -> bool:
    """quick_unequal where a is a matrix, a union or a word."""
    if a[0] == "word":  # a symbol: never a constant
        return b[0] == "value" and b[1] is not None or b[0] in ("matrix", "union")
    return b[0] in ("value", "word")  # a matrix or a union of intervals is no scalar


def quick_unequal(a: tuple | None, b: tuple | None) -> bool:
    """True only when profiles a and b surely belong to different answers."""
    if a is None or b is None:
        return False
    if a[0] == "eq" or b[0] == "eq":  # math-verify compares the right-hand side
        if a[0] == b[0]:
            return False  # two equations: compared as relations, not ours to read
        return quick_unequal(a[1], b) if a[0] == "eq" else quick_unequal(a, b[1])
    if a[0] in ("matrix", "union", "word"):
        return _shape_unequal(a, b)
    if b[0] in ("matrix", "union", "word"):
        return _shape_unequal(b, a)
    if a[0] == "value" and b[0] == "value":
        return _values_unequal(a, b)
    if a[0] == "items" and b[0] == "items":
        # a bare list is a set (any order, repeats): only distinct constants can disprove
        ca, cb = _constants(a), _constants(b)
        return ca is not None and cb is not None and ca != cb
    items = _constants(a if a[0] == "items" else b)
    return items is not None and len(items) >= 2  # a list of several never matches one
