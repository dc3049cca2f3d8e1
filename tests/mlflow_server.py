"""A real `mlflow server` on loopback for tests: start, SIGKILL, restart on the same port
and backend store (what a crashed and restarted tracking server looks like)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, folder: Path, db: Path, port: int | None = None):
        self.folder, self.db = Path(folder), Path(db)
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> MlflowServer:
        """Launch (does not wait; see `wait_healthy`)."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
               "MLFLOW_DISABLE_TELEMETRY": "true"}
        self._log = (self.folder / "server.log").open("a")
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        # start_new_session: the server and the workers it spawns form one process group
        # that kill()/stop() end as a whole.
        self.proc = subprocess.Popen(
            [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--artifacts-destination", str(self.folder / "server-artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            cwd=self.folder, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 90) -> MlflowServer:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            assert time.monotonic() < deadline, f"mlflow server not healthy in {timeout} s"
            time.sleep(0.3)
        return self

    def log_tail(self) -> str:
        path = self.folder / "server.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
