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

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_core.data.hub import hub_adapter
from grpo_core.data.readers import (
    FORMATS,
    file_digest,
    read_shards,
    shard_files,
)
from grpo_core.data.source import (
    AUTO_COLUMNS,
    Adapter,
    Preset,
    SourceError,
    column_mapping,
    content_fingerprint,
    parse_columns,
)

SPLIT_NAMES = ("train", "test", "eval", "validation", "dev")

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
