"""Dataset adapters: turn a source name into raw rows plus a converter to `Problem`.

`resolve_source(source, split=..., data_dir=..., columns=..., limit=...)` accepts
  - a preset (gsm8k, math, math500, aime24, aime25, amc23): local copies under
    `data_dir` / $GRPO_DATA_DIR laid out like shared/data, else the Hugging Face hub;
  - `synthetic:arith` (grpo_core.data.synthetic);
  - a file (.jsonl / .json / .parquet / .csv) with an optional column mapping;
  - any other hub id (or a local copy of a hub repo, with `config`), streamed
    (grpo_core.data.hub).
The adapter yields (row index, raw row) pairs; `convert` makes each raw row a `Problem` or
a `Rejection` (reason code + detail). Rows that cannot even be read (malformed JSON,
invalid UTF-8) arrive as `BadRow`. Whole-source problems raise `SourceError` (usage: a
missing path, unknown preset, mapping to a missing column) or `SourceUnreadable` (data:
a corrupt or empty file), each with a one-line message.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_core.data.problems import Problem
from grpo_core.data.readers import (  # noqa: F401 - BadRow, SourceUnreadable: re-exported
    FORMATS,
    READERS,
    BadRow,
    Rejection,
    SourceUnreadable,
    file_digest,
    read_shards,
    shard_files,
)

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
SPLIT_NAMES = ("train", "test", "eval", "validation", "dev")


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


_EVAL = {"problem": ("problem",), "answer": ("answer",), "solution": ("solution",),
         "id": ("id",)}
PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("gsm8k", "openai/gsm8k", "main",
           {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
           {"train": "train", "test": "test"},
           {"problem": ("question",), "answer": ("answer",), "solution": ("answer",)}, "gsm8k"),
    # The hub has no "MATH test minus MATH-500" set; MATH-lighteval holds the full MATH
    # train/test with the same columns (problem, level "Level N", type, solution).
    Preset("math", "DigitalLearningGmbH/MATH-lighteval", "default",
           {"train": "math/train4500.jsonl"}, {"train": "train", "test": "test"},
           {"problem": ("problem",), "answer": ("answer",), "solution": ("solution",),
            "id": ("idx", "unique_id"), "level": ("level",), "subject": ("type", "subject")},
           "boxed"),
    Preset("math500", "HuggingFaceH4/MATH-500", None, {"test": "math500/test.jsonl"},
           {"test": "test"},
           {**_EVAL, "id": ("unique_id",), "level": ("level",), "subject": ("subject",)},
           "answer"),
    Preset("aime24", "HuggingFaceH4/aime_2024", None, {"test": "aime24/test.jsonl"},
           {"test": "train"}, _EVAL, "answer"),
    Preset("aime25", "math-ai/aime25", None, {"test": "aime25/test.jsonl"},
           {"test": "test"}, _EVAL, "answer"),
    Preset("amc23", "math-ai/amc23", None, {"test": "amc23/test.jsonl"},
           {"test": "test"}, _EVAL, "answer"),
]}
SPLIT_ALIASES = {"train4500": "train"}


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


# ----------------------------------------------------------------------------- sources


def file_adapter(path: str | Path, *, split: str | None = None, name: str | None = None,
                 columns: str | dict[str, str] | None = None, limit: int | None = None,
                 preset: Preset | None = None) -> Adapter:
    """A file, a folder of shards or a glob of shards (readers.shard_files): named after
    the file's stem (or its folder when the stem is a split), the folder, or the glob's
    folder (its parent when that is a hub layout's `data/`)."""
    path = Path(path).expanduser()
    shards = shard_files(path)
    if not shards:
        if path.is_dir():
            raise SourceError(f"{path}: is a directory with no {'/'.join(FORMATS)} files; name "
                              "a file, a folder of shards, or a preset with --data-dir")
        raise SourceError(f"{path}: no such file")
    fmts = {FORMATS.get(f.suffix.lower()) for f in shards}
    if None in fmts or len(fmts) > 1:
        bad = sorted({f.suffix for f in shards})
        raise SourceError(f"{path}: unsupported format {bad[0] if len(bad) == 1 else bad!r}; "
                          f"use {', '.join(FORMATS)} (one format per folder)")
    fmt = fmts.pop()
    if path.is_file():
        stem_is_split = path.stem.lower() in SPLIT_NAMES
        named = path.parent.name if stem_is_split else path.stem
        split = split or (path.stem.lower() if stem_is_split else "train")
    else:  # a folder or glob of shards: train-00000-of-00002.parquet is split train
        folder = path if path.is_dir() else path.parent
        named = (folder.parent if folder.name == "data" else folder).name
        first = shards[0].stem.split("-")[0].lower()
        split = split or (first if first in SPLIT_NAMES else "train")
    source = name or preset and preset.name or named
    # Columns are read from the first rows; every row is read (streamed) only at ingest.
    head = list(itertools.islice(read_shards(shards, fmt), min(limit or 1000, 1000)))
    present = {k for _, r in head if isinstance(r, dict) for k in r} or None
    explicit = parse_columns(columns)
    base = preset.columns if preset and not explicit else AUTO_COLUMNS
    cols = column_mapping(str(path), present, explicit, base)
    gold = preset.gold if preset and not explicit else "auto"
    digest = [file_digest(f) for f in shards]
    return Adapter(source=source, split=split, origin=str(path),
                   fingerprint=content_fingerprint(digest[0] if len(digest) == 1 else digest,
                                                   split, cols, gold, limit),
                   read=lambda: itertools.islice(read_shards(shards, fmt), limit),
                   columns=cols, gold=gold)


def preset_adapter(name: str, *, split: str | None = None, data_dir: str | Path | None = None,
                   limit: int | None = None) -> Adapter:
    from grpo_core.workspace import resolve_data_dir

    preset = PRESETS[name]
    split = SPLIT_ALIASES.get(split or "", split) or preset.default_split
    root = resolve_data_dir(data_dir)
    splits = preset.files if root else preset.hub_splits
    if split not in splits:
        raise SourceError(f"preset {name} has no split {split!r}; splits: {', '.join(splits)}")
    if root is not None:
        path = root / preset.files[split]
        if not path.is_file():
            raise SourceError(f"preset {name} ({split}): {path} not found (data dir {root})")
        return file_adapter(path, split=split, limit=limit, preset=preset)
    from grpo_core.data.hub import hub_adapter

    return hub_adapter(preset.hub_id, split=split, config=preset.hub_config, limit=limit,
                       preset=preset)


def synthetic_adapter(source: str, *, split: str | None = None, limit: int | None = None,
                      levels: list[int] | None = None, seed: int = 0) -> Adapter:
    try:
        from grpo_core.data import synthetic
    except ImportError:
        raise SourceError(f"{source}: the synthetic task module is not available") from None
    if source != synthetic.SOURCE:
        raise SourceError(f"unknown synthetic task {source!r}; known: {synthetic.SOURCE}")
    split = split or "train"
    n = limit or 1000

    def read() -> Iterator[tuple[int, Any]]:
        yield from enumerate(synthetic.generate_problems(split=split, n=n, levels=levels,
                                                         seed=seed))

    want = "eval" if split in ("eval", "test") else "train"
    return Adapter(source=source, split=want, origin=source,
                   fingerprint=content_fingerprint(source, want, n, levels, seed), read=read)


def resolve_source(source: str, *, split: str | None = None,
                   data_dir: str | Path | None = None,
                   columns: str | dict[str, str] | None = None, limit: int | None = None,
                   name: str | None = None, levels: list[int] | None = None,
                   seed: int = 0, config: str | None = None) -> Adapter:
    """Preset, synthetic task, file path (a file, a folder or glob of shards) or hub id
    (`config`: which of its configs) -> Adapter (raises SourceError)."""
    if limit is not None and limit < 1:
        raise SourceError(f"--limit must be >= 1, got {limit}")
    if source.startswith("synthetic:"):
        return synthetic_adapter(source, split=split, limit=limit, levels=levels, seed=seed)
    if source in PRESETS and not columns:
        return preset_adapter(source, split=split, data_dir=data_dir, limit=limit)
    from grpo_core.data.hub import hub_adapter

    path = Path(source).expanduser()
    if path.is_dir() and config:  # a local copy of a hub dataset repo, one of its configs
        return hub_adapter(str(path), split=split, config=config, columns=columns, limit=limit,
                           name=name)
    if path.exists():
        parent = PRESETS.get(path.parent.name)
        preset = parent if parent and not columns and not name and any(
            Path(f).name == path.name for f in parent.files.values()) else None
        if preset:
            split = split or next(s for s, f in preset.files.items() if Path(f).name == path.name)
        return file_adapter(path, split=split, name=name, columns=columns, limit=limit,
                            preset=preset)
    if any(c in source for c in "*?["):  # a glob of shards: data/train-*.parquet
        return file_adapter(source, split=split, name=name, columns=columns, limit=limit)
    looks_like_path = path.suffix.lower() in FORMATS or source.startswith((".", "/", "~"))
    if looks_like_path:
        raise SourceError(f"{source}: no such file")
    if "/" in source.strip("/"):
        return hub_adapter(source, split=split, config=config, columns=columns, limit=limit)
    raise SourceError(f"unknown source {source!r}: not a preset ({', '.join(PRESETS)}), "
                      "synthetic:arith, an existing file or a hub id (owner/name)")
