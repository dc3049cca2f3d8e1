"""The README's path 2 ("A Prefect deployment, with workers"), run as a user runs it: its
fenced commands, read from README.md, in their order, against a real Prefect server and
worker on loopback (issue 47). What differs from a user's terminal is only where things
live: the ports are free ones, the workspace ($GRPO_WORKDIR, which `.grpo` stands for) and
PREFECT_HOME are under tmp_path, `.venv/bin` is this interpreter's folder. A `# terminal N`
line runs in the background, as in its own terminal.

Asserted: every command exits 0; the quickstart's and the retrain's flow runs publish
their artifact (the retrain's holds the decision and its rule) and end with their result
as the state message; `mlflow ui` answers without logging each request; then path 3's
retrain, on a config whose champion does not exist yet, fails with the one line naming the
missing champion as its state message and in what `--watch` prints, no traceback."""
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prefect_services import Services, artifacts, flow_run, free_port, prefect_post, wait_http

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def readme_block(heading: str) -> list[str]:
    """The commands of the first fenced block after `heading` in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index(heading):]
    block = re.search(r"^```[^\n]*\n(.*?)^```", after, flags=re.S | re.M).group(1)
    return [line for line in block.splitlines() if line.strip()]


def as_run_here(line: str, port: int, workdir: Path) -> tuple[dict, list[str], bool]:
    """(environment assignments, argv, background?) of one README line, placed here."""
    background = bool(re.search(r"#\s*terminal \d", line))
    line = line.split(" #")[0].strip()
    line = (line.replace("127.0.0.1:4200", f"127.0.0.1:{port}")
                .replace("$PWD/.grpo", str(workdir)).replace("$PWD", str(ROOT)))
    words = shlex.split(line)
    env = {}
    if words[0] == "export":
        return dict(w.split("=", 1) for w in words[1:]), [], False
    while "=" in words[0] and not words[0].startswith(("-", ".")):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words[0].startswith(".venv/bin/"):
        words[0] = str(BIN / words[0].removeprefix(".venv/bin/"))
    if words[0].endswith("/prefect") and words[1:3] == ["server", "start"]:
        env["PREFECT_SERVER_API_PORT"] = str(port)  # docs/prefect.md: the UI's port too
    if words[0].endswith("/mlflow") and words[1] == "ui":
        words += ["--port", str(free_port())]
    return env, words, background


def test_readme_path_2_then_a_retrain_without_champion(tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    workdir = tmp_path / "ws"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env = {**base, "PREFECT_HOME": str(tmp_path / "prefect"), "GRPO_WORKDIR": str(workdir),
           "GRPO_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    services, said, times = Services(tmp_path), {}, {}
    lines = readme_block("**2. A Prefect deployment, with workers.**")
    assert any("weekly-retrain" in x for x in lines) and any("flows.worker" in x for x in lines)
    try:
        for n, line in enumerate(lines):
            extra, argv, background = as_run_here(line, port, workdir)
            if not argv:  # `export ...`: every later terminal has it
                env.update(extra)
                continue
            if background:
                proc = services.start(f"bg{n}", argv, {**env, **extra})
                if "server" in argv:
                    wait_http(f"{api}/health", 180, proc, tmp_path / f"bg{n}.log")
                continue
            if argv[0].endswith("/mlflow"):  # a server: it answers, and quietly
                proc = services.start("mlflow-ui", argv, {**env, **extra})
                url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
                wait_http(f"{url}/health", 180, proc, tmp_path / "mlflow-ui.log")
                for _ in range(5):
                    urllib.request.urlopen(f"{url}/health", timeout=10)
                time.sleep(1)
                assert "GET /health" not in (tmp_path / "mlflow-ui.log").read_text()
                continue
            t0 = time.monotonic()
            out = subprocess.run(argv, env={**env, **extra}, cwd=ROOT, capture_output=True,
                                 text=True, timeout=900, check=False)
            times[line[:70]] = round(time.monotonic() - t0)
            said[line] = out.stdout + out.stderr
            assert out.returncode == 0, f"{line}\n{said[line][-3000:]}"

        runs = {r["name"]: r for r in prefect_post(api, "flow_runs/filter", {})
                if r["state_type"] != "SCHEDULED"}
        quick = next(r for name, r in runs.items() if name.startswith("r1_zero-"))
        retrain = next(r for name, r in runs.items() if name.startswith("retrain-r1_zero-"))
        assert quick["state_type"] == retrain["state_type"] == "COMPLETED", runs
        # the result as the state message, and the artifact a Prefect user opens
        assert re.search(r"over the base \(paired\)", quick["state"]["message"]), quick["state"]
        page = artifacts(api, quick["id"])["pipeline-r1-zero"]
        assert "delta (paired)" in page and "MLflow: [MLflow run](" in page, page
        decision = flow_run(api, retrain["id"])["state"]["message"]
        assert re.match(r"(promoted v2|kept champion v1): .* over the champion \(paired\); "
                        r"quickstart-r1_zero v2 (champion|challenger)", decision), decision
        page = artifacts(api, retrain["id"])["retrain-r1-zero"]
        assert re.match(r"\*\*(promoted v2|kept champion v1)\*\*: ", page), page
        assert "Rule: paired" in page and "base = the champion" in page, page

        # Path 3's retrain of recipes-r1_zero, never trained here: refused in one line.
        lines3 = readme_block("**3. On a schedule: retraining the champion.**")
        retrain_line = next(x for x in lines3 if "weekly-retrain" in x)
        _, argv, _ = as_run_here(retrain_line, port, workdir)
        out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=600, check=False)
        watched = out.stdout + out.stderr
        assert out.returncode == 1 and "finished in state 'Refused'" in watched, watched[-3000:]
        assert "refused: no champion for 'recipes-r1_zero' yet" in watched, watched[-3000:]
        failed = next(r for r in prefect_post(api, "flow_runs/filter", {})
                      if r["state_type"] == "FAILED")
        assert failed["state"]["message"].startswith("no champion for 'recipes-r1_zero' yet"), failed
    finally:
        services.stop()
        print("times (s):", times)
    # the server's and the worker's terminals: no telemetry errors, no traceback (the
    # refusal included), and the worker did run the flows
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("bg*.log")))
    assert "grpo/round-1: started" in logs, logs[-4000:]
    assert "Traceback" not in logs, logs[-4000:]
    assert "Failed to send telemetry" not in logs, logs[-4000:]
