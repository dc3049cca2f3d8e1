"""math-verify, called safely: what grpo_core.verify.answers calls under the bounds of
grpo_core.verify.safe_eval (nothing here bounds time itself).

- `math_verify_fns()`: math-verify's (parse, verify), imported and warmed up outside any
  deadline, its signal timeouts off (they work only in the main thread).
- `mv_parse(text)`: its parse of an answer, a bare LaTeX answer wrapped in \\boxed{}.
- `profile` / `cannot_be_equal`: cheap numeric disproofs that spare most wrong answers
  math-verify's symbolic comparison.
- `never_read(pred, gold)`: text math-verify reads no value in (code, shell), told from
  its characters alone, before any parse (and before math-verify is even imported).
"""

from __future__ import annotations

import cmath
import logging
import re

from grpo_core.verify.units import looks_like_prose, mv_extraction_config


class _DropTimeoutWarning(logging.Filter):
    # We disable math-verify's signal timeouts on purpose (they break off the main thread)
    # and bound time ourselves; its one-off warning about that is noise.
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutWarning())


def _mv_candidates(text: str) -> list[str]:
    """Strings to hand math-verify's parse, best first. A bare LaTeX answer is wrapped in
    \\boxed{} (parse then reads all of it, not just its first number)."""
    if "\\boxed" in text or "\\fbox" in text or "$" in text or "\\(" in text or "\\[" in text:
        return [text]
    boxed = "\\boxed{" + text + "}"
    return [text, boxed] if looks_like_prose(text) else [boxed, text]


# A mark no LaTeX answer holds and math-verify's LaTeX grammar refuses wherever it stands
# (tests/test_answers.py pins it): a dunder, a backtick, `@`, `#`, `?`.
_NOT_MATH = re.compile(r"__|[`@#?]")
# What math-verify could read apart from the whole text: a math span (`$`, `\\(`, `\\[`), a
# command (`\\boxed`, `\\frac`), a bracket `[`, a brace (the end of the \\boxed{} it is
# handed in), an `=` (it parses the last side of an equation alone when the whole fails);
# or a number, which must start after a space, an operator or the text's start. A digit
# glued to a letter, `_`, `/` or `-` after one (`x0`, `/tmp/pytest-5/`) starts none.
_READABLE_PART = re.compile(r"[$\\\[{}=]|(?<![0-9A-Za-z_/])(?<![0-9A-Za-z_/]-)[0-9]")


def never_read(pred: str, gold: str) -> bool:
    """True when math-verify surely finds `pred` (as `_mv_candidates` hands it over)
    unequal to `gold` without parsing it: pred has a mark of _NOT_MATH and no part its
    regexes read apart, so its parse is its own text as a fallback string (the whole
    text's LaTeX parse fails on the mark), which math-verify compares as a string: only a
    gold with such a mark could equal it. Linear time; nothing is evaluated."""
    return (_NOT_MATH.search(pred) is not None and _READABLE_PART.search(pred) is None
            and _NOT_MATH.search(gold) is None)


_MV: dict = {}
# One of each construct MATH answers use: the first parse of each pays sympy's lazy imports
# and cache fills (up to ~0.3 s apiece on a busy machine), which must not eat a deadline.
_WARM_UP = [
    ("\\frac{1}{2}", "0.5"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("[-2, 7)", "(-2, 7]"),
    ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "x \\in [-2,7]"),
    ("\\{1, 2\\}", "1, 2"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"),
    ("\\text{(C)}", "C"),
    ("x^2 + 1", "x = 1"),
    ("6 - 5i", "6+5i"),
    ("90^\\circ", "50\\%"),
    ("\\sin x \\cos x", "\\log_2 8"),
    ("\\infty", "-\\infty"),
    ("x \\ge 2", "1.5"),
]


def warm_up() -> None:
    """Import math-verify and pay its first-use costs now (idempotent, ~1-2 s once)."""
    math_verify_fns()


def math_verify_fns() -> tuple:
    """(parse, verify) of math-verify, imported and warmed up on first use.

    Never inside a deadline: an import interrupted half-way would leave a broken module.
    """
    if not _MV:
        import functools

        from math_verify import parse, verify

        # units=False: a letter is a variable, never a unit (grpo_core/verify/units.py)
        parse = functools.partial(parse, extraction_config=mv_extraction_config())

        for gold, pred in _WARM_UP:
            for text in (gold, pred):
                try:
                    verify(
                        parse("\\boxed{" + gold + "}", parsing_timeout=None),
                        parse("\\boxed{" + text + "}", parsing_timeout=None),
                        timeout_seconds=None,
                    )
                except Exception:  # noqa: BLE001, S110 - warming only
                    pass
        _MV["fns"] = (parse, verify)
    return _MV["fns"]


def mv_parse(text: str) -> list:
    """math-verify's parse of an answer (call it under a deadline; no signals used)."""
    parse, _ = math_verify_fns()
    for candidate in _mv_candidates(text):
        parsed = parse(candidate, parsing_timeout=None)
        if parsed:
            return parsed
    return []


_PROBES = (0.5772156649015329, 1.3247179572447460)  # generic points (Euler-Mascheroni, plastic)


def profile(parsed: list) -> tuple[complex | None, bool]:
    """(value, varies) of a parsed answer: its value when it is a number-valued expression
    (no symbols, sets, tuples, relations or percent), and whether it is an expression that
    provably depends on its symbols (it takes two different values at two points)."""
    import sympy

    expr = parsed[0] if parsed else None
    try:
        if not isinstance(expr, sympy.Expr) or expr.has(sympy.UnevaluatedExpr):
            return None, False
        symbols = sorted(expr.free_symbols, key=str)
        if not symbols:
            value = complex(expr.evalf(20))
            return (value if cmath.isfinite(value) else None), False
        v1, v2 = (
            complex(expr.subs({s: p + k / 10 for k, s in enumerate(symbols)}).evalf(15))
            for p in _PROBES
        )
    except Exception:  # noqa: BLE001 - not a plain expression after all
        return None, False
    varies = cmath.isfinite(v1) and cmath.isfinite(v2) and abs(v1 - v2) > 1e-6 * max(1.0, abs(v1))
    return None, varies


def cannot_be_equal(gold: tuple[complex | None, bool], pred: tuple[complex | None, bool]) -> bool:
    """Cheap disproofs that spare math-verify's symbolic comparison (tens of ms):
    two numbers more than 1e-6 apart (math-verify's loosest rule rounds to 6 decimals),
    or a number against an expression that varies with its variables."""
    (g_value, g_varies), (p_value, p_varies) = gold, pred
    if g_value is not None and p_value is not None:
        return abs(g_value - p_value) > 1e-6 * max(1.0, abs(g_value))
    return (g_value is not None and p_varies) or (p_value is not None and g_varies)
