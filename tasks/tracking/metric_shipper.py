"""Training metrics to MLflow from a background thread: a tracking-server outage in the
middle of a round neither stalls training nor loses a point.

The trainer's callback hands points to `MetricShipper.put`, which returns at once. One
daemon thread sends them in batches; a failed batch goes back to the front of the queue
and is retried (the MLflow client itself retries a refused connection for minutes, so a
restarted server picks the points up where it left off). At the end of a round `close`
waits up to a deadline; what is still unsent then is appended to a local file under
<workdir>/runs/unsent/, reported by the caller, and sent by `replay_unsent` on the next
run. Re-sending a point is harmless: MLflow's SQL store keeps one row per
(key, step, timestamp, value).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

Point = tuple[str, float, int, int]  # key, value, timestamp ms, step


def unsent_dir(workdir: str | Path) -> Path:
    return Path(workdir) / "runs" / "unsent"


class MetricShipper:
    """Queue + sender thread for one run's metric points.

    `send(run_id, points)` must raise on failure; it runs only in the sender thread.
    """

    def __init__(self, run_id: str, send: Callable[[str, list[Point]], None],
                 fallback_dir: str | Path, retry_every_s: float = 2.0):
        self.run_id, self._send, self._retry = run_id, send, retry_every_s
        self.fallback_file = Path(fallback_dir) / f"{run_id}.jsonl"
        self._cv = threading.Condition()
        self._queue: list[Point] = []
        self._in_flight: list[Point] = []
        self._closing = False
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"metric-shipper-{run_id[:8]}")
        self._thread.start()

    def put(self, points: list[Point]) -> None:
        if points:
            with self._cv:
                self._queue.extend(points)
                self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return
                batch, self._queue = self._queue, []
                self._in_flight = batch
            try:
                self._send(self.run_id, batch)
            except Exception as exc:  # noqa: BLE001 - any failure: keep the points, retry
                with self._cv:
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                    if self._closing:  # close() already saved the in-flight batch
                        return
                    self._queue[:0] = batch
                    self._in_flight = []
                    self._cv.notify_all()
                    log.warning("MLflow unreachable, %d metric points queued: %s",
                                len(self._queue), self.last_error)
                    self._cv.wait(self._retry)
                continue
            with self._cv:
                self.sent += len(batch)
                self._in_flight = []
                self._cv.notify_all()

    @property
    def closed(self) -> bool:
        return self._closing

    def pending(self) -> int:
        with self._cv:
            return len(self._queue) + len(self._in_flight)

    def drain(self, timeout_s: float) -> int:
        """Wait until every point is sent or `timeout_s` passes; the number left."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(left, 0.5))
            return len(self._queue) + len(self._in_flight)

    def close(self, timeout_s: float) -> int:
        """Drain, then stop the thread; points still unsent go to `fallback_file`.
        Returns how many went there (0 when MLflow took everything)."""
        self.drain(timeout_s)
        with self._cv:
            self._closing = True
            left = self._in_flight + self._queue
            self._queue, self._in_flight = [], []
            self._cv.notify_all()
        if left:
            self.fallback_file.parent.mkdir(parents=True, exist_ok=True)
            with self.fallback_file.open("a", encoding="utf-8") as fh:
                for key, value, ts, step in left:
                    fh.write(json.dumps({"key": key, "value": value, "timestamp": ts,
                                         "step": step}) + "\n")
            log.warning("MLflow unreachable: %d metric points of run %s kept in %s",
                        len(left), self.run_id, self.fallback_file)
        return len(left)


def replay_unsent(workdir: str | Path, send: Callable[[str, list[Point]], None]) -> dict[str, int]:
    """Send the points earlier runs could not; a file is deleted once MLflow took it.
    Returns {run_id: points sent}; a file that still fails stays for the next run."""
    done: dict[str, int] = {}
    folder = unsent_dir(workdir)
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        points = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                points.append((row["key"], float(row["value"]), int(row["timestamp"]),
                               int(row["step"])))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash while writing it
        try:
            send(path.stem, points)
        except Exception as exc:  # noqa: BLE001 - still unreachable: keep the file
            log.warning("could not replay %s: %s", path, exc)
            continue
        path.unlink()
        done[path.stem] = len(points)
    return done
