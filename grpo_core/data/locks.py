"""One pipeline per store at a time.

DuckDB's own lock covers a single open connection, and the pipeline opens its store
stage by stage; a second pipeline could slip in between two stages and interleave its
writes. `pipeline_lock` is held for the whole run instead: `filelock`'s native lock (an
advisory `flock`) on <store>.pipeline.lock, released by the kernel when the holder exits
or is SIGKILLed (so a crash never leaves a stale lock; no soft-lock fallback, which
could). The holder writes its pid, host and start time into the file; a waiter gives up
after `timeout` seconds with a message naming the store and the holder. Re-entrant within
a process, from any thread (a flow calling another flow on the same store).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock, Timeout

from grpo_core.data.store import StoreLockedError

_locks: dict[tuple[int, str], FileLock] = {}  # (pid, lock path) -> this process's lock
_locks_guard = threading.Lock()


def lock_path(store_path: str | os.PathLike) -> Path:
    return Path(store_path).expanduser().resolve().with_name(Path(store_path).name + ".pipeline.lock")


def _write_holder(fd: int) -> None:
    """filelock's on_acquired hook: who holds the lock, for the message a waiter prints."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(),
        "since": datetime.now(UTC).isoformat(timespec="seconds")}).encode(), 0)


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"


def _lock(path: Path) -> FileLock:
    with _locks_guard:
        key = (os.getpid(), str(path))  # a forked child makes its own (filelock refuses the parent's)
        lock = _locks.get(key)
        if lock is None:
            # thread_local=False: one hold count for the process, whichever thread re-enters.
            lock = _locks[key] = FileLock(
                path, thread_local=False, fallback_to_soft=False, preserve_lock_file=True,
                on_acquired=_write_holder)
        return lock


@contextlib.contextmanager
def pipeline_lock(store_path: str | os.PathLike, timeout: float) -> Iterator[Path]:
    """Hold the store's pipeline lock; wait up to `timeout` s, then StoreLockedError."""
    path = lock_path(store_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock(path)
    try:
        lock.acquire(timeout=timeout, poll_interval=0.25)
    except Timeout:
        raise StoreLockedError(
            f"store {store_path} is in use by another pipeline ({_holder(path)}); "
            f"waited {timeout:g} s (data.store_lock_timeout). Run again when it "
            f"is done, or give this run its own workdir") from None
    try:
        yield path
    finally:
        lock.release()
