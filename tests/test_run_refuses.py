"""`grpo run` refuses bad input before any work: a broken config exits 2 with one line
naming the field and leaves no workspace, Prefect home, MLflow run or ./mlruns behind;
an unreachable MLflow server fails in seconds (a real process, timed) naming the URI."""
import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from test_config import BROKEN
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).resolve().parents[1]
GRPO = str(Path(sys.executable).with_name("grpo"))

# Files that are not a config at all, next to the field-level table of test_config.
FILE_CASES = {
    "yaml-syntax": (b"grpo: [unclosed\n", "not valid YAML"),
    "not-a-mapping": (b"- 1\n- 2\n", "mapping"),
    "not-utf8": (b"grpo:\n  beta: \xff\xfe\x00\x01\n", "bad.yaml"),
    "extends-missing": (b"extends: nowhere.yaml\n", "nowhere.yaml"),
    "extends-cycle": (b"extends: bad.yaml\n", "cycle"),
}


def _refused(tmp_path: Path, monkeypatch, args: list[str]) -> str:
    ws = tmp_path / "ws"
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GRPO_WORKDIR", str(ws))
    result = CliRunner().invoke(app, ["run", *args, "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: config error"), result.output
    assert not ws.exists(), "workspace state created before validation"
    assert list(cwd.iterdir()) == [], "files (./mlruns?) created before validation"
    return lines[0]


@pytest.mark.parametrize("tree,field", BROKEN, ids=[f for _, f in BROKEN])
def test_broken_config_file(tree, field, tmp_path, monkeypatch):
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(tree))
    line = _refused(tmp_path, monkeypatch, [str(path)])
    assert field in line


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_unreadable_config_file(case, tmp_path, monkeypatch):
    body, words = FILE_CASES[case]
    (tmp_path / "bad.yaml").write_bytes(body)
    assert words in _refused(tmp_path, monkeypatch, [str(tmp_path / "bad.yaml")])


def test_directory_missing_file_and_bad_override(tmp_path, monkeypatch):
    assert str(tmp_path) in _refused(tmp_path, monkeypatch, [str(tmp_path)])
    assert "missing.yaml" in _refused(tmp_path, monkeypatch, [str(tmp_path / "missing.yaml")])
    assert "grpo.typo" in _refused(tmp_path, monkeypatch, ["--set", "grpo.typo=1"])
    # no CONFIG: the two default recipes are validated with the override too
    assert "grpo.beta" in _refused(tmp_path, monkeypatch, ["--set", "grpo.beta=-1"])


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _listener(kind: str):
    """A real local endpoint that is not MLflow: `refused` (nothing listens), `silent`
    (accepts connections, never answers) or `not-mlflow` (a web server answering 404)."""
    if kind == "refused":
        yield f"http://127.0.0.1:{_unused_port()}"
        return
    if kind == "silent":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(16)  # connections wait in the backlog; nobody reads them
            yield f"http://127.0.0.1:{s.getsockname()[1]}"
        return
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"  # every GET: 501/404-style error
    finally:
        server.shutdown()


@pytest.mark.parametrize("kind", ["refused", "silent", "not-mlflow"])
def test_unreachable_tracking_server_fails_fast(kind, tmp_path):
    ws = tmp_path / "ws"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    with _listener(kind) as uri:
        env.update(MLFLOW_TRACKING_URI=uri, GRPO_WORKDIR=str(ws))
        t0 = time.monotonic()
        proc = subprocess.run([GRPO, "run", str(ROOT / "configs/quickstart.yaml"), "--quiet"],
                              env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, check=False)
        took = time.monotonic() - t0
    print(f"{kind} {uri}: exit {proc.returncode} in {took:.1f} s: {proc.stderr.strip()}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert uri in proc.stderr and "not reachable" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # Bounded, not fast: MLflow's own retries would take minutes; start-up plus the 5 s probe
    # took 13 s on a loaded machine.
    assert took < 60.0, f"took {took:.1f} s to refuse {uri}"
    assert not ws.exists(), "workspace state created before the check"
