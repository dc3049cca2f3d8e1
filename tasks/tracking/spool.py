"""The offline spool behind MLflow's asynchronous logging: `MetricSpool.put` hands a batch
to `log_batch(synchronous=False)`; `close` waits up to a deadline, sends a failed batch
again, and appends what is still unsent to <workdir>/runs/unsent/<run id>.jsonl, which
`replay_unsent_metrics` sends on the next run (a point sent twice is one row in MLflow's
store: one per key, step, timestamp and value)."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from grpo_core.workspace import workdir_of
from tasks.tracking.mlflow_client import get_client

log = logging.getLogger(__name__)

Point = tuple[str, float, int, int]  # key, value, timestamp ms, step


def unsent_dir(workdir: str | Path) -> Path:
    return Path(workdir) / "runs" / "unsent"


def _metrics(points: list[Point]) -> list[Metric]:
    return [Metric(k, v, ts, step) for k, v, ts, step in points]


class MetricSpool:
    """One run's metric points: sent asynchronously by MLflow, the unsent kept on disk."""

    def __init__(self, run_id: str, client: MlflowClient, fallback_dir: str | Path):
        self.run_id, self.client = run_id, client
        self.fallback_file = Path(fallback_dir) / f"{run_id}.jsonl"
        self._pending: list[tuple[list[Point], object]] = []  # (points, RunOperations)
        self.closed = False
        self.failures = 0

    def put(self, points: list[Point]) -> None:
        if points:
            ops = self.client.log_batch(self.run_id, metrics=_metrics(points), synchronous=False)
            self._pending.append((points, ops))

    def _unconfirmed(self, timeout_s: float) -> list[Point]:
        """The points of batches MLflow did not confirm within `timeout_s` (failed or not
        done yet); RunOperations.wait has no timeout: it is waited on in a thread."""
        done: list[bool] = [False] * len(self._pending)

        def wait() -> None:
            for i, (_, ops) in enumerate(self._pending):
                try:
                    if ops is not None:
                        ops.wait()
                    done[i] = True
                except Exception:  # noqa: BLE001 - any failure: the points stay unsent
                    self.failures += 1

        t = threading.Thread(target=wait, daemon=True, name=f"metric-spool-{self.run_id[:8]}")
        t.start()
        t.join(timeout_s)
        return [p for ok, (points, _) in zip(done, self._pending, strict=True) if not ok
                for p in points]

    def close(self, timeout_s: float) -> int:
        """Wait for MLflow, send what failed again until `timeout_s` has passed, spool the
        rest. Returns how many points went to `fallback_file` (0 when MLflow took all)."""
        deadline = time.monotonic() + timeout_s
        left = self._unconfirmed(timeout_s)
        while left and time.monotonic() < deadline:
            try:
                self.client.log_batch(self.run_id, metrics=_metrics(left))
                left = []
            except Exception as exc:  # noqa: BLE001 - still unreachable: try again, then spool
                self.failures += 1
                log.warning("MLflow unreachable, %d metric points waiting: %s", len(left), exc)
                time.sleep(max(0.0, min(2.0, deadline - time.monotonic())))
        self.closed, self._pending = True, []
        if left:
            self.fallback_file.parent.mkdir(parents=True, exist_ok=True)
            with self.fallback_file.open("a", encoding="utf-8") as fh:
                for key, value, ts, step in left:
                    fh.write(json.dumps({"key": key, "value": value, "timestamp": ts,
                                         "step": step}) + "\n")
            log.warning("MLflow unreachable: %d metric points of run %s kept in %s",
                        len(left), self.run_id, self.fallback_file)
        return len(left)


def replay_unsent_metrics(workspace, client: MlflowClient | None = None) -> dict[str, int]:
    """Send the points earlier runs kept; a file is deleted once MLflow took it, one that
    still fails stays for the next run. Returns {run_id: points sent}."""
    done: dict[str, int] = {}
    client = get_client(client)
    folder = unsent_dir(workdir_of(workspace))
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
            client.log_batch(path.stem, metrics=_metrics(points))
        except Exception as exc:  # noqa: BLE001 - still unreachable: keep the file
            log.warning("could not replay %s: %s", path, exc)
            continue
        path.unlink()
        done[path.stem] = len(points)
    return done
