"""Bounds on the time spent checking untrusted (model-written) math. Nothing here evaluates it.

Two layers, both usable from any thread:

1. `risky_reason(text)`: a linear scan that rejects inputs which could make sympy run
   *uninterruptible* C code (big-integer powers and factorials such as `9^9^9^9`,
   `10^{10^{10}}`, `(10^{100})!`, numbers of hundreds of digits) or recurse deeply
   (`\\boxed{` nested 10,000 times). Such answers are judged wrong (or unparseable gold).
2. `call_with_deadline(fn, *args, seconds=...)`: runs `fn` in the calling thread and, if it
   overruns, raises `DeadlineExceeded` inside that thread from a watchdog thread
   (`PyThreadState_SetAsyncExc`). This interrupts pure-Python work (sympy's simplify,
   integrals, sums) between bytecodes, like math-verify's `signal.alarm`, but works off the
   main thread too, where signals cannot be used. C calls are not interrupted: layer 1
   keeps those small.

What runs under those bounds, math-verify called without signals, is
grpo_core/verify/math_verify_adapter.py.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_ANSWER_CHARS = 512
MAX_NESTING = 50
MAX_NUMBER_DIGITS = 100
MAX_EXPONENT_DIGITS = 4  # 2^{2005} is fine; 2^{100000000} is a 30M-digit integer
MAX_SYMBOLIC_EXPONENT_DIGITS = 3  # (x+1)^{9999} expands into 10,000 huge coefficients
MAX_FACTORIAL_DIGITS = 4  # 9999! takes ms; 100000! takes ~0.5 s of C code
MAX_BOUND_DIGITS = 3  # \sum, \prod and \binom with bounds past 999 multiply huge integers


class DeadlineExceeded(BaseException):
    """Raised inside a guarded call that ran past its deadline.

    A BaseException so that `except Exception` blocks in sympy/math-verify don't swallow it.
    """


_DIGITS = re.compile(r"\d+")
_BIG_OPERATOR = re.compile(r"\\(?:[dt]?binom|choose|sum|prod)(?![A-Za-z])")
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def _bracket_matches(text: str) -> tuple[dict[int, int], int, bool]:
    """Map closing -> opening bracket positions (any of ()[]{} ), the max nesting depth, and
    whether the curly braces balance. One pass, an explicit stack: no recursion."""
    match: dict[int, int] = {}
    stack: list[tuple[str, int]] = []
    depth = max_depth = curly = 0
    curly_ok = True
    for i, ch in enumerate(text):
        if ch in "([{":
            stack.append((ch, i))
            depth += 1
            max_depth = max(max_depth, depth)
            curly += ch == "{"
        elif ch in ")]}":
            if ch == "}":
                curly -= 1
                curly_ok &= curly >= 0
            # Intervals like [0, 1) close with a different bracket: pop whatever is open.
            if stack:
                match[i] = stack.pop()[1]
                depth -= 1
    return match, max_depth, curly_ok and curly == 0


def _operand_after(text: str, i: int, match_open: dict[int, int]) -> tuple[str, int]:
    """The operand of `^` at i-1: a {group}, a \\command, a number or one character.
    Returns (operand text, index just after it)."""
    n = len(text)
    while i < n and text[i] == " ":
        i += 1
    if i >= n:
        return "", i
    if text[i] == "{":
        close = match_open.get(i)
        if close is None:
            return text[i:], n
        return text[i + 1 : close], close + 1
    if text[i] == "\\":
        j = i + 1
        while j < n and text[j].isalpha():
            j += 1
        return text[i:j], j
    if text[i].isdigit():
        # `10^100` exponentiates by 1 (latex reads one digit) but be conservative: whole run.
        m = _DIGITS.match(text, i)
        return m.group(), m.end()
    return text[i], i + 1


def _group_before(text: str, i: int, match: dict[int, int]) -> str | None:
    """If text[i] (after skipping spaces backwards) closes a bracket group, its content."""
    while i >= 0 and text[i] == " ":
        i -= 1
    if i >= 0 and text[i] in _CLOSERS and i in match:
        return text[match[i] + 1 : i]
    return None


def _digits_before(text: str, i: int) -> int:
    j = i
    while j >= 0 and text[j] == " ":
        j -= 1
    k = j
    while k >= 0 and text[k].isdigit():
        k -= 1
    return j - k


_NUMERIC_NOISE = re.compile(r"\\(?:cdot|times|left|right|div)\b|\\[!,;: ]|\s")
_NUMERIC_ONLY = re.compile(r"[0-9.+\-*/^!(){}\[\]]*")


def _numeric(text: str) -> bool:
    """Only numbers and operators: an exact big-integer computation if sympy evaluates it.
    (With a letter or a function in it, sympy keeps the expression symbolic.)"""
    return _NUMERIC_ONLY.fullmatch(_NUMERIC_NOISE.sub("", text)) is not None


def risky_reason(text: str, max_chars: int = MAX_ANSWER_CHARS) -> str | None:
    """Why `text` must not reach sympy, or None when it is safe to parse. Linear time."""
    reason, match = _shape_reason(text, max_chars)
    if reason is not None:
        return reason
    if "^" not in text and "*" not in text and "!" not in text and "\\" not in text:
        return None
    # math-verify's plain-expression path reads `**` as a power too.
    text = text.replace("**", "^ ")  # same length: bracket positions stay valid
    match_open = {o: c for c, o in match.items()}
    big_operator = _BIG_OPERATOR.search(text) is not None
    for i, ch in enumerate(text):
        if ch == "^":
            reason = _power_reason(text, i, match, match_open, big_operator)
        elif ch == "!":
            reason = _factorial_reason(text, i, match)
        else:
            continue
        if reason is not None:
            return reason
    if big_operator and any(len(r) > MAX_BOUND_DIGITS for r in _DIGITS.findall(text)):
        return "huge sum, product or binomial"
    return None


def _shape_reason(text: str, max_chars: int) -> tuple[str | None, dict]:
    """risky_reason's checks of the whole text (length, bytes, brackets, digit runs), and
    the text's bracket matches."""
    if len(text) > max_chars:
        return f"longer than {max_chars} chars", {}
    if "\x00" in text:
        return "NUL byte", {}
    match, depth, curly_ok = _bracket_matches(text)
    if not curly_ok:
        return "unbalanced braces", match
    if depth > MAX_NESTING:
        return f"nesting deeper than {MAX_NESTING}", match
    if any(len(run) > MAX_NUMBER_DIGITS for run in _DIGITS.findall(text)):
        return f"a number longer than {MAX_NUMBER_DIGITS} digits", match
    return None, match


def _power_reason(text: str, i: int, match: dict, match_open: dict,
                  big_operator: bool) -> str | None:
    """risky_reason for the power at text[i] == "^"."""
    operand, after = _operand_after(text, i + 1, match_open)
    digits = max((len(r) for r in _DIGITS.findall(operand)), default=0)
    base_digits = _digits_before(text, i - 1)
    if digits > (MAX_EXPONENT_DIGITS if base_digits else MAX_SYMBOLIC_EXPONENT_DIGITS):
        return "huge exponent"
    if big_operator and base_digits and operand.isdigit() and int(operand) > 3:
        return "huge sum, product or binomial"  # \binom{10^{50}}{...}
    if ("^" in operand or "!" in operand) and _numeric(operand):
        return "nested exponent"
    if text[after:].lstrip(" ").startswith(("^", "!")):
        return "exponent chain"
    base = _group_before(text, i - 1, match)
    if base is not None and ("^" in base or "!" in base) and _numeric(base + operand):
        return "power of a power"
    return None


def _factorial_reason(text: str, i: int, match: dict) -> str | None:
    """risky_reason for the factorial at text[i] == "!"."""
    if text[i + 1 : i + 2] == "!" or _digits_before(text, i - 1) > MAX_FACTORIAL_DIGITS:
        return "huge factorial"
    group = _group_before(text, i - 1, match)
    if group is not None and (
        "^" in group or "!" in group or any(len(r) > 3 for r in _DIGITS.findall(group))
    ):
        return "huge factorial"
    return None


# --- watchdog --------------------------------------------------------------------------

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int
_REFIRE_S = 0.05  # re-raise every 50 ms if something swallowed the first exception


def _quiet_unraisable() -> None:
    """A deadline can land while the thread runs a finalizer (a __del__ during garbage
    collection inside the timed call): Python then reports it as "unraisable" and goes on,
    and the re-fire 50 ms later interrupts the call properly. Reporting it would format a
    traceback - which the re-fire can interrupt in turn - so DeadlineExceeded is dropped
    there, and everything else goes to the hook that was installed (checked on each arm:
    test runners install their own hooks later)."""
    hook = sys.unraisablehook
    if getattr(hook, "_grpo_quiet", False):
        return

    def quiet(info, _next=hook):
        if info.exc_type is DeadlineExceeded:
            return
        _next(info)

    quiet._grpo_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = quiet


class _Token:
    __slots__ = ("active", "fired", "tid")

    def __init__(self, tid: int):
        self.tid, self.active, self.fired = tid, True, False


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, _Token]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="grpo-deadline", daemon=True)
            self._thread.start()

    def arm(self, seconds: float) -> _Token:
        _quiet_unraisable()
        token = _Token(threading.get_ident())
        with self._cond:
            self._ensure_thread()
            heapq.heappush(self._heap, (time.monotonic() + seconds, next(self._seq), token))
            self._cond.notify()
        return token

    def disarm(self, token: _Token) -> None:
        with self._cond:
            token.active = False
            if token.fired:  # an exception may still be pending for this thread: drop it
                _set_async_exc(token.tid, ctypes.py_object())

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and not self._heap[0][2].active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, token = self._heap[0]
                now = time.monotonic()
                if due > now:
                    self._cond.wait(due - now)
                    continue
                heapq.heappop(self._heap)
                token.fired = True
                _set_async_exc(token.tid, ctypes.py_object(DeadlineExceeded))
                heapq.heappush(self._heap, (now + _REFIRE_S, next(self._seq), token))

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap, self._thread = [], None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.reset_after_fork)

TIMED_OUT = object()


def call_with_deadline(fn: Callable[..., Any], *args: Any, seconds: float) -> Any:
    """fn(*args), or TIMED_OUT if it ran longer than `seconds` (wall clock) in this thread.

    Exceptions from fn propagate. After a timeout, sympy's thread-local evaluation flags are
    restored in case the interruption landed inside one of its `with evaluate(False)` blocks.
    """
    token = _WATCHDOG.arm(seconds)
    outcome: Any = TIMED_OUT
    try:
        outcome = fn(*args)
    except DeadlineExceeded:
        outcome = TIMED_OUT
    finally:
        while True:  # a re-fire can land while disarming; disarm is idempotent
            try:
                _WATCHDOG.disarm(token)
                break
            except DeadlineExceeded:
                outcome = TIMED_OUT
    if outcome is TIMED_OUT:
        _restore_sympy_flags()
    return outcome


def _restore_sympy_flags() -> None:
    try:
        from sympy.core.parameters import global_parameters

        global_parameters.evaluate = True
        global_parameters.distribute = True
        global_parameters.exp_is_pow = False
    except Exception:  # noqa: BLE001, S110 - sympy missing or changed: nothing to restore
        pass
