"""A real `mlflow server` on loopback for tests: start, SIGKILL, restart on the same port
and backend store (what a crashed and restarted tracking server looks like); with
`admin=(user, password)`, behind MLflow's basic auth as infra/compose.yaml runs it (the
shipped infra/mlflow/basic_auth.ini, its user store moved into the test's folder).
`http_standin`: a loopback stand-in answering GETs with a status of the test's choosing."""
from __future__ import annotations

import base64
import configparser
import contextlib
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUTH_INI = ROOT / "infra" / "mlflow" / "basic_auth.ini"


@contextlib.contextmanager
def http_standin(status_of: Callable[[http.server.BaseHTTPRequestHandler], int]) -> Iterator[str]:
    """A loopback HTTP server answering each GET with `status_of(request)` and no body, for
    what needs no MLflow behind it (a probe's credentials, how often it asks); yields its URI."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status_of(self))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    def __init__(self, folder: Path, db: Path, port: int | None = None,
                 admin: tuple[str, str] | None = None):
        self.folder, self.db = Path(folder), Path(db)
        self.port = port or free_port()
        self.admin = admin
        self._flask_key = secrets.token_hex(16)  # one per server, kept across restarts
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> MlflowServer:
        """Launch (does not wait; see `wait_healthy`)."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
               "MLFLOW_DISABLE_TELEMETRY": "true"}
        args = []
        if self.admin:
            # The shipped settings, with the user store in this folder. The admin's password
            # goes through the environment only, as in compose: never into a file.
            ini = configparser.ConfigParser()
            ini.read(AUTH_INI)
            ini["mlflow"]["database_uri"] = f"sqlite:///{self.folder / 'basic_auth.db'}"
            with (self.folder / "basic_auth.ini").open("w") as f:
                ini.write(f)
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(self.folder / "basic_auth.ini"),
                       MLFLOW_AUTH_ADMIN_USERNAME=self.admin[0],
                       MLFLOW_AUTH_ADMIN_PASSWORD=self.admin[1],
                       MLFLOW_FLASK_SERVER_SECRET_KEY=self._flask_key)
            args = ["--app-name", "basic-auth"]
        self._log = (self.folder / "server.log").open("a")
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        # start_new_session: the server and the workers it spawns form one process group
        # that kill()/stop() end as a whole.
        self.proc = subprocess.Popen(
            [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--artifacts-destination", str(self.folder / "server-artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1", *args],
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

    def request(self, path: str, user: tuple[str, str] | None = None, method: str = "GET",
                body: dict | None = None) -> tuple[int, dict | str]:
        """(HTTP status, JSON or text) of one REST call, with basic auth when `user` is given."""
        req = urllib.request.Request(self.uri + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        if user is not None:
            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def ensure_user(self, username: str, password: str,
                    admin: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
        """infra/mlflow_users.py as an operator runs it: an admin's credentials in
        MLFLOW_TRACKING_*, the user's password in a variable named on the command line."""
        admin = admin or self.admin
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(MLFLOW_TRACKING_URI=self.uri, MLFLOW_TRACKING_USERNAME=admin[0],
                   MLFLOW_TRACKING_PASSWORD=admin[1], NEW_USER_PASSWORD=password)
        return subprocess.run([sys.executable, str(ROOT / "infra" / "mlflow_users.py"), username,
                               "--password-env", "NEW_USER_PASSWORD"],
                              env=env, capture_output=True, text=True, timeout=120, check=False)

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
