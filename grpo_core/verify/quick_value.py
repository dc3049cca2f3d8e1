"""A cheap numeric reading of simple answers, to disprove most unequal pairs without
math-verify's LaTeX parser (an ANTLR parse costs ~10 ms; most of a verdict's time).

`quick_profile(text)` reads a small subset of LaTeX arithmetic: numbers, single-letter
variables, `\\pi`, `\\frac{}{}`, `\\sqrt{}` / `\\sqrt[n]{}`, `^`, `\\cdot`, `\\times`, `+ - * /`,
brackets, implicit products (`3\\sqrt{2}`, `2xy`), degrees `90^\\circ` (90); and tuples / intervals / lists of
those. It returns a profile, or None for anything else (relations, text, sets, matrices,
functions): those go to math-verify as before.

    ("value", v, varies)   v: the value at generic points of its variables (complex);
                           varies: whether it provably depends on them
    ("items", [profiles])  a comma-separated tuple, interval or list

`quick_unequal(a, b)` is True only when the two surely differ: two constant values more
than 1e-6 apart (math-verify's loosest rule rounds to 6 decimals), a constant against an
expression that varies, two lists of constants whose sets of values differ (a bare list
is a set), or one value against a list of several values. Equality is never decided here.
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
            if letter in "eiEI":  # Euler's number, the imaginary unit: not ours to read
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
            self.vars.add(value)
            return complex(self.point + (ord(value) % 7) / 10)
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
        return ("value", v1, False)
    varies = abs(v1 - v2) > 1e-6 * max(1.0, abs(v1))
    return ("value", None, varies)


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


def quick_profile(text: str) -> tuple | None:
    """The profile of `text` (see the module docstring), or None outside the subset."""
    if not text or len(text) > MAX_CHARS:
        return None
    if "circ" in text:  # 90^\\circ is 90, as math-verify reads it (not pi/2)
        text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    try:
        toks = _tokens(text)
        if not toks:
            return None
        items = _split_items(toks)
        if items is not None:
            return ("items", [_value(item) for item in items])
        if any(t == ("op", "[") or t == ("op", "]") for t in toks):
            return None  # a one-item bracket is nothing we read
        return _value(toks)
    except (_Unsupported, ArithmeticError, ValueError, OverflowError):
        return None


def _values_unequal(a: tuple, b: tuple) -> bool:
    (_, av, a_varies), (_, bv, b_varies) = a, b
    if av is not None and bv is not None:
        return abs(av - bv) > 1e-6 * max(1.0, abs(av))
    return (av is not None and b_varies) or (bv is not None and a_varies)


def _constants(profile: tuple) -> set | None:
    """The distinct constant values of an item list (rounded), None if any item varies."""
    if any(i[1] is None for i in profile[1]):
        return None
    return {(round(i[1].real, 6), round(i[1].imag, 6)) for i in profile[1]}


def quick_unequal(a: tuple | None, b: tuple | None) -> bool:
    """True only when profiles a and b surely belong to different answers."""
    if a is None or b is None:
        return False
    if a[0] == "value" and b[0] == "value":
        return _values_unequal(a, b)
    if a[0] == "items" and b[0] == "items":
        # a bare list is a set (any order, repeats): only distinct constants can disprove
        ca, cb = _constants(a), _constants(b)
        return ca is not None and cb is not None and ca != cb
    items = _constants(a if a[0] == "items" else b)
    return items is not None and len(items) >= 2  # a list of several never matches one
