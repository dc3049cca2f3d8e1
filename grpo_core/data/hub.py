"""Hub datasets as sources, streamed: rows are read once, at ingest, shard by shard, never
downloaded whole into the datasets cache nor held in memory.

    adapter = hub_adapter("AI-MO/NuminaMath-CoT", split="train")
    adapter = hub_adapter("zwhe99/DeepMath-103K", config=..., columns="problem=question,...")

One adapter reads one config's one split; a dataset published as several configs (each a
folder of shards named in its README) is several sources, one per config. A local copy of
such a repository (a folder with that README) is read the same way, by `resolve_source`
when a config is named.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpo_core.data.source import (
    AUTO_COLUMNS,
    Adapter,
    Preset,
    SourceError,
    column_mapping,
    content_fingerprint,
    parse_columns,
)

HEAD_ROWS = 100  # rows peeked for column names when the dataset declares no features


@contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    """Offline, the hub client logs every retry: the one-line SourceError says it all."""
    quiet = [logging.getLogger(n) for n in ("huggingface_hub", "datasets", "fsspec")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def hub_adapter(hub_id: str, *, split: str | None = None, config: str | None = None,
                columns: str | dict[str, str] | None = None, limit: int | None = None,
                preset: Preset | None = None, name: str | None = None) -> Adapter:
    """One config's split of a hub dataset (or of a local copy of one), streamed."""
    import datasets

    split = split or "train"
    hub_split = preset.hub_splits.get(split, split) if preset else split
    where = f"{hub_id}{f' [{config}]' if config else ''} ({hub_split})"
    try:
        with _quiet_hub_logs():
            # the builder resolves the data files once; its hash names their revision
            builder = datasets.load_dataset_builder(hub_id, config)
            stream = builder.as_streaming_dataset(split=hub_split)
    except Exception as exc:  # noqa: BLE001 - offline, missing, gated: all one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = " (offline? point --data-dir at local copies)" if preset else ""
        raise SourceError(f"cannot load hub dataset {where}: {first}{hint}") from None
    if limit is not None:
        stream = stream.take(limit)
    present = stream.column_names
    if present is None:  # no declared features: the first rows say
        present = {k for row in itertools.islice(stream, HEAD_ROWS) for k in row}
    explicit = parse_columns(columns)
    base = preset.columns if preset and not explicit else AUTO_COLUMNS
    cols = column_mapping(where, set(present), explicit, base)
    gold = preset.gold if preset and not explicit else "auto"
    local = Path(hub_id).expanduser().is_dir()
    source = name or (preset.name if preset else Path(hub_id).name if local else hub_id)
    return Adapter(source=source, split=split, origin=hub_id,
                   fingerprint=content_fingerprint(hub_id, config, hub_split, builder.hash,
                                                   cols, gold, limit),
                   read=lambda: enumerate(stream), columns=cols, gold=gold)
