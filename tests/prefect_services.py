"""A real Prefect server (and worker) for the deployment tests: free ports, health waits,
the REST API read back (flow runs, their logs, task runs, artifacts), and the processes
started, stopped by process group. `auth`: the server's API auth string, or None."""
import base64
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {seconds} s: {log.read_text()[-2000:]}")


def prefect_status(api: str, auth: str | None) -> int:
    """HTTP status of one Prefect API call (list flows), with `auth` as the auth string."""
    req = urllib.request.Request(f"{api}/flows/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def prefect_post(api: str, path: str, body: dict, auth: str | None = None) -> list[dict]:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    req = urllib.request.Request(f"{api}/{path}", data=json.dumps(body).encode(), method="POST",
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def prefect_story(api: str, auth: str) -> dict:
    """Flow run name -> its task run names, log lines, state and whether it is a subflow,
    read from the server's API (scheduled runs of the weekly cron left out)."""
    story = {}
    for run in prefect_post(api, "flow_runs/filter", {}, auth):
        if run["state_type"] == "SCHEDULED":
            continue
        ids = {"any_": [run["id"]]}
        story[run["name"]] = {
            "id": run["id"], "state": run["state_type"], "sub": bool(run["parent_task_run_id"]),
            "tasks": {t["name"] for t in prefect_post(api, "task_runs/filter",
                                                        {"flow_runs": {"id": ids}}, auth)},
            "logs": run_logs(api, auth, ids)}
    return story


def run_logs(api: str, auth: str, ids: dict) -> list[str]:
    """Every log line of the flow runs `ids`, in pages of 200 (the server's most per call)."""
    lines: list[str] = []
    while True:
        page = prefect_post(api, "logs/filter", {"logs": {"flow_run_id": ids}, "limit": 200,
                                                  "offset": len(lines), "sort": "TIMESTAMP_ASC"},
                             auth)
        lines += [x["message"] for x in page]
        if len(page) < 200:
            return lines


def run_state(api: str, auth: str, run_id: str) -> tuple[str, list[str]]:
    """(state type, log lines) of flow run `run_id`."""
    ids = {"any_": [run_id]}
    run = prefect_post(api, "flow_runs/filter", {"flow_runs": {"id": ids}}, auth)[0]
    return run["state_type"], run_logs(api, auth, ids)


class Services:
    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(self, name: str, args: list[str], env: dict) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # the servers' (and a worker's) clean stop
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def flow_run(api: str, run_id: str, auth: str | None = None) -> dict:
    """The flow run `run_id` as the API reads it (name, state_type, state.message, ...)."""
    return prefect_post(api, "flow_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}}, auth)[0]


def artifacts(api: str, run_id: str, auth: str | None = None) -> dict[str, str]:
    """{key: markdown} of the artifacts flow run `run_id` published."""
    found = prefect_post(api, "artifacts/filter",
                         {"artifacts": {"flow_run_id": {"any_": [run_id]}}}, auth)
    return {a["key"]: a.get("data") or "" for a in found}
