"""What a data source is, whatever kind it is: its rows and the converter that makes each
a `Problem` (`Adapter`), the column mapping that says which column holds which field, a
preset's description (`Preset`), the fingerprint that names its content, and the one-line
`SourceError`. grpo_core.data.adapters builds the file, preset and synthetic sources on
these (and re-exports them), grpo_core.data.hub the hub's."""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from grpo_core.data.problems import Problem
from grpo_core.data.readers import Rejection

FIELDS = ("problem", "answer", "solution", "id", "level", "subject")
# Column names tried, in order, when a file or hub dataset has no explicit mapping.
AUTO_COLUMNS = {
    "problem": ("problem", "question", "prompt", "query", "input"),
    "answer": ("answer", "final_answer", "gold", "target", "expected_answer"),
    "solution": ("solution", "rationale", "reasoning", "explanation"),
    "id": ("id", "unique_id", "idx", "problem_id"),
    "level": ("level", "difficulty"),
    "subject": ("subject", "type", "category"),
}


class SourceError(ValueError):
    """The source cannot be used as named (CLI exit 2): one line, names the culprit."""


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str
    hub_config: str | None
    files: dict[str, str]  # our split -> path under data_dir
    hub_splits: dict[str, str]  # our split -> hub split
    columns: dict[str, tuple[str, ...]]
    gold: str  # "answer" (the column), "gsm8k" (after ####), "boxed" (last \boxed of solution)

    @property
    def default_split(self) -> str:
        return "train" if "train" in self.files else "test"


@dataclass
class Adapter:
    """Rows of one source split and the converter that makes each a `Problem`."""

    source: str  # stored as Problem.source
    split: str
    origin: str  # file path or hub id: what messages name
    fingerprint: str  # content fingerprint of the source (file bytes, mapping, split)
    read: Callable[[], Iterable[tuple[int, Any]]]
    columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gold: str = "auto"

    def rows(self) -> Iterator[tuple[int, Any]]:
        yield from self.read()

    def convert(self, index: int, raw: Any) -> Problem | Rejection:
        if isinstance(raw, Problem):  # synthetic and other in-process generators
            return raw
        if not isinstance(raw, dict):
            return Rejection("wrong_type", f"row is {type(raw).__name__}, not an object")
        got = {f: _first(raw, cols) for f, cols in self.columns.items()}
        text = {}
        for f in ("problem", "answer", "solution", "subject", "id"):
            value, err = _as_text(got.get(f), f, loose=f in ("answer", "id"))
            if err:
                return err
            text[f] = value
        if not text["problem"] or not text["problem"].strip():
            return Rejection("missing_problem" if text["problem"] is None else "empty_problem",
                             "no problem text")
        gold, err = self._gold(text["answer"], text["solution"])
        if err:
            return err
        level, err = _as_level(got.get("level"))
        if err:
            return err
        return Problem(source=self.source, split=self.split, problem=text["problem"].strip(),
                       answer=gold.strip(), solution=text["solution"] or "", level=level,
                       subject=text["subject"] or None,
                       id=f"{self.source}/{self.split}/{text['id'] or index}")

    def _gold(self, answer: str | None, solution: str | None) -> tuple[str, Rejection | None]:
        from grpo_core.verify import answers  # late: answers is optional at import time

        rule = self.gold
        if rule == "auto":
            if answer and "####" in answer:
                rule = "gsm8k"
            elif answer:
                rule = "answer"
            elif solution and "####" in solution and "\\boxed" not in solution:
                answer, rule = solution, "gsm8k"  # a GSM8K-style solution, no answer column
            else:
                rule = "boxed"
        if rule == "gsm8k":
            gold = answers.gold_from_gsm8k(answer or "")
            why = "no '#### <answer>' line in answer"
        elif rule == "boxed" and not answer:
            gold = answers.gold_from_math_solution(solution or "")
            why = "no answer column and no \\boxed{} in solution"
        else:  # the column as is; normalise_gold("math") would look for \boxed in it
            src = "" if self.source in ("math", "gsm8k") else self.source
            gold = answers.normalise_gold(answer or "", src)
            why = "no answer"
        if not gold or not gold.strip():
            return "", Rejection("missing_answer", why)
        return gold, None


def _first(raw: dict, columns: tuple[str, ...]) -> Any:
    for c in columns:
        if c in raw:
            return raw[c]
    return None


def _as_text(value: Any, name: str, loose: bool) -> tuple[str | None, Rejection | None]:
    """Text of a cell; numbers count as text only where `loose` (answers, ids)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, bool) or not loose and isinstance(value, (int, float)):
        return None, Rejection("wrong_type", f"{name} is {type(value).__name__}, not text")
    if isinstance(value, int):
        return str(value), None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, Rejection("wrong_type", f"{name} is {value}")
        return str(int(value)) if value.is_integer() else repr(value), None  # AMC: 27.0 is 27
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8"), None
        except UnicodeDecodeError as exc:
            return None, Rejection("undecodable", f"{name}: invalid UTF-8 ({exc.reason})")
    return None, Rejection("wrong_type", f"{name} is {type(value).__name__}, not text")


def _as_level(value: Any) -> tuple[int | None, Rejection | None]:
    if isinstance(value, bool):
        return None, Rejection("wrong_type", "level is a boolean")
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None, None
    if isinstance(value, (int, float)):
        return int(value), None
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(?:level\s*)?(\d+)\s*", value, re.IGNORECASE)
        return (int(m.group(1)) if m else None), None  # "Level ?" in MATH: unknown, not wrong
    return None, Rejection("wrong_type", f"level is {type(value).__name__}")


def parse_columns(spec: str | dict[str, str] | None) -> dict[str, str]:
    """`problem=q,answer=a` (or a dict) -> {"problem": "q", "answer": "a"}; checked."""
    if not spec:
        return {}
    if isinstance(spec, str):
        pairs = [p.split("=", 1) for p in spec.split(",") if p.strip()]
        if any(len(p) != 2 or not p[0].strip() or not p[1].strip() for p in pairs):
            raise SourceError(f"--columns must look like problem=COL,answer=COL, got {spec!r}")
        spec = {k.strip(): v.strip() for k, v in pairs}
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown:
        raise SourceError(f"column mapping: unknown field {unknown[0]!r}; fields are "
                          f"{', '.join(FIELDS)}")
    return dict(spec)


def column_mapping(where: str, present: set[str] | None, explicit: dict[str, str],
             base: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    cols = {f: (explicit[f],) if f in explicit else base.get(f, ()) for f in FIELDS}
    if present is None:
        return cols
    for f, col in explicit.items():
        if col not in present:
            raise SourceError(f"{where}: column {col!r} (mapped to {f}) not found; columns: "
                              f"{', '.join(sorted(present)) or 'none'}")
    cols = {f: tuple(c for c in cs if c in present) for f, cs in cols.items()}
    if present and not cols["problem"]:
        raise SourceError(f"{where}: no problem column (looked for "
                          f"{', '.join(base.get('problem', ()))}); use --columns problem=COL")
    if present and not cols["answer"] and not cols["solution"]:
        raise SourceError(f"{where}: no answer or solution column; use --columns answer=COL")
    return cols


def content_fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts: what names a source's content and reading."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
