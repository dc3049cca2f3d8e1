"""One pipeline per store at a time.

DuckDB's own lock covers a single open connection, and the pipeline opens its store
stage by stage; a second pipeline could slip in between two stages and interleave its
writes. `pipeline_lock` is held for the whole run instead: an advisory `flock` on
<store>.pipeline.lock, released by the kernel when the holder exits or is SIGKILLed (so
a crash never leaves a stale lock). A waiter gives up after `timeout` seconds with a
message naming the store and the holder.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from grpo_core.store import StoreLockedError

_held: dict[str, int] = {}  # lock path -> depth: re-entrant within one process


def lock_path(store_path: str | os.PathLike) -> Path:
    return Path(store_path).expanduser().resolve().with_name(Path(store_path).name + ".pipeline.lock")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"


@contextlib.contextmanager
def pipeline_lock(store_path: str | os.PathLike, timeout: float) -> Iterator[Path]:
    """Hold the store's pipeline lock; wait up to `timeout` s, then StoreLockedError."""
    path = lock_path(store_path)
    key = str(path)
    if key in _held:  # a flow calling another flow on the same store
        _held[key] += 1
        try:
            yield path
        finally:
            _held[key] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"store {store_path} is in use by another pipeline ({_holder(path)}); "
                        f"waited {timeout:g} s (data.store_lock_timeout). Run again when it "
                        f"is done, or give this run its own workdir") from None
                time.sleep(0.25)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds")}).encode())
        _held[key] = 1
        try:
            yield path
        finally:
            del _held[key]
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
