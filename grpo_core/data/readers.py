"""File-format readers: a local .jsonl/.ndjson/.json/.csv/.parquet file -> (row index, raw
row) pairs, plus the row types they produce. A row that cannot be read (malformed JSON,
invalid UTF-8 kept as lone surrogates) arrives as `BadRow`; a file that holds no readable
rows raises `SourceUnreadable`. grpo_core.data.adapters builds sources on top of these and
re-exports the types."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
           ".csv": "csv"}


class Rejection(NamedTuple):
    """Why a row was quarantined: a stable code (counted) and a human detail."""

    code: str  # missing_problem, empty_problem, missing_answer, unparseable_answer, wrong_type,
    #            too_long, undecodable, malformed_json
    detail: str

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


class SourceUnreadable(ValueError):
    """The source exists but holds no readable rows (CLI exit 1): one line."""


@dataclass
class BadRow:
    """A row that could not be read at all; `raw` keeps what was there."""

    rejection: Rejection
    raw: Any


def file_digest(path: Path) -> str:
    """sha256 of the file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _decode(path: Path) -> str:
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="surrogateescape")
    # surrogateescape keeps invalid bytes as lone surrogates: the row holding them is
    # quarantined as undecodable instead of the whole file being refused.
    return data.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")


def _lines(path: Path) -> Iterator[str]:
    """The file's lines, streamed (a file of several GB is never read whole), decoded as
    `_decode` does. Split on "\n" only, not splitlines(): U+2028 or NEL may sit raw inside
    a JSON string."""
    with path.open("rb") as fh:
        head = fh.read(2)
        if head in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16: rare and small, decoded whole
            yield from _decode(path).split("\n")
            return
        fh.seek(0)
        for n, raw in enumerate(fh):
            line = raw.decode("utf-8", errors="surrogateescape").removesuffix("\n")
            yield line.removeprefix("\ufeff") if n == 0 else line


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    index = 0
    for lineno, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            yield index, json.loads(line)
        except json.JSONDecodeError as exc:
            yield index, BadRow(Rejection("malformed_json", f"line {lineno}: {exc.msg} "
                                          f"(col {exc.colno})"), {"line": line[:2000]})
        index += 1


def _read_json(path: Path) -> Iterator[tuple[int, Any]]:
    text = _decode(path)
    if not text.strip():
        return
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # JSON lines in a .json file
            yield from _read_jsonl(path)
            return
        raise SourceUnreadable(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} "
                               f"col {exc.colno}") from None
    if isinstance(doc, dict):
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) == 1 and len(doc) <= 2:  # {"data": [...]} (maybe with a version key)
            doc = lists[0]
        elif doc and all(isinstance(v, list) for v in doc.values()):  # columnar
            keys = list(doc)
            doc = [dict(zip(keys, vals)) for vals in zip(*doc.values())]
        else:
            doc = [doc]
    if not isinstance(doc, list):
        raise SourceUnreadable(f"{path}: JSON holds a {type(doc).__name__}, not rows")
    yield from enumerate(doc)


def _read_csv(path: Path) -> Iterator[tuple[int, Any]]:
    # All cells stay strings: type inference would turn AIME's "025" into 25. Decoded like
    # JSON lines: a UTF-8 BOM (Excel's "CSV UTF-8") or UTF-16 BOM must not garble the header.
    fh = io.StringIO(_decode(path), newline="")
    try:
        yield from enumerate(csv.DictReader(fh))
    except csv.Error as exc:
        raise SourceUnreadable(f"{path}: not valid CSV: {exc}") from None


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=8192)
        index = 0
        # batch by batch: a file of several GB is never one table in memory
        for batch in batches:
            for row in batch.to_pylist():
                yield index, row
                index += 1
    except Exception as exc:  # noqa: BLE001 - any pyarrow failure means unreadable
        raise SourceUnreadable(f"{path}: not a readable Parquet file: {exc}") from None


def shard_files(source: str | Path) -> list[Path]:
    """The files one source reads: the file itself; every file of a folder; or the matches
    of a glob (`data/train-*.parquet`), the way hub datasets are published in shards.
    Sorted by name; one format for all. [] when nothing matches."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS]
    elif any(c in str(source) for c in "*?["):
        found = [p for p in path.parent.glob(path.name) if p.is_file()]
    else:
        return []
    return sorted(found, key=lambda p: p.name)


def read_shards(files: list[Path], fmt: str) -> Iterator[tuple[int, Any]]:
    """The rows of every shard in order, numbered across shards."""
    index = 0
    for f in files:
        for _, row in READERS[fmt](f):
            yield index, row
            index += 1


READERS = {"jsonl": _read_jsonl, "json": _read_json, "csv": _read_csv, "parquet": _read_parquet}
