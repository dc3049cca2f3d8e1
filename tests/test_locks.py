"""The store's pipeline lock: one holder at a time across processes, re-entrant within one
(any thread), released when the holder dies, and a waiter's error names the holder."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from grpo_core.data.locks import lock_path, pipeline_lock
from grpo_core.data.store import StoreLockedError

HOLD = """
import sys, time
from grpo_core.data.locks import pipeline_lock
with pipeline_lock(sys.argv[1], 10):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/store.duckdb until killed."""
    store = tmp_path / "store.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield store, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_process_waits_then_gets_the_holders_name(holder):
    store, proc = holder
    info = json.loads(lock_path(store).read_text())
    assert info["pid"] == proc.pid and info["host"] == socket.gethostname() and info["since"]
    t0 = time.monotonic()
    with pytest.raises(StoreLockedError) as err, pipeline_lock(store, 0.6):
        pass
    assert 0.5 <= time.monotonic() - t0 < 5
    msg = str(err.value)
    assert f"store {store} is in use by another pipeline (pid {proc.pid} on " in msg
    assert f"since {info['since']})" in msg and "waited 0.6 s" in msg
    with pytest.raises(StoreLockedError), pipeline_lock(store, 0):  # no wait at all
        pass


def test_a_killed_holder_leaves_no_stale_lock(holder):
    store, proc = holder
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pipeline_lock(store, 5) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_reentrant_within_the_process_from_any_thread(tmp_path):
    store = tmp_path / "store.duckdb"
    with pipeline_lock(store, 0) as outer:
        with pipeline_lock(store, 0) as inner:
            assert inner == outer == lock_path(store)
        entered = []

        def other_thread():
            with pipeline_lock(store, 0) as path:
                entered.append(path == outer)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert entered == [True]
        # Still held by this process after the nested exits: another process is refused.
        probe = subprocess.run([sys.executable, "-c", HOLD.replace("10)", "0)"), str(store)],
                               check=False, capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0 and "StoreLockedError" in probe.stderr
        assert f"pid {os.getpid()}" in probe.stderr
