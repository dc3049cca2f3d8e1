"""Prefect tells the same story as the terminal and MLflow (issue 16, point 5).

`grpo run` over both recipes (the compare flow, a pipeline subflow per recipe; the
`main_job` fixture, shrunk) on the built-in model, in a subprocess with Prefect's temporary server writing into
<workdir>/prefect; then the README's way of opening that history, `PREFECT_HOME=<workdir>/
prefect prefect server start`, on loopback, read back through Prefect's client:

- flow runs named after what they ran: `compare-r1_zero-vs-sft_grpo`, and
  `<recipe>-<config hash[:8]>` for each pipeline (the hash MLflow's parent run is tagged with);
- task runs named by the stage labels, each stage's end line in its task run's log;
- each pipeline run's log holds the stage start/end lines, the findings and the `final:`
  line (sent before the temporary server stopped at the process's exit);
- the recipe-comparison markdown artifact on the compare flow run.

(tests/test_deployment.py checks the names and log lines against a server a worker reports to.)
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pipeline_runs import ROOT, mlflow_runs

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_history(home: Path, port: int, log: Path) -> subprocess.Popen:
    """The README's command: the workspace's Prefect home served by a real server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, cwd=ROOT, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 150
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError(f"prefect server not healthy: {log.read_text()[-2000:]}")


def _read_history(api: str) -> dict:
    """Flow runs, their task runs and logs, and the artifacts, through Prefect's client."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
        out = {"runs": {}, "artifacts": client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[
                "recipe-comparison", "pipeline-r1-zero", "pipeline-sft-grpo"])))}
        for run in runs:
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[run.id])))
            logs = client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            out["runs"][run.name] = {"run": run, "tasks": {t.name: t for t in tasks}, "logs": logs}
        return out


def test_grpo_run_tells_the_same_story_in_prefect(main_job, tmp_path):
    workdir, _ = main_job

    # MLflow's side of the story: each recipe's parent run and its config hash.
    _, mlflow = mlflow_runs(workdir, "recipes")
    parents = {r.data.tags["recipe"]: r for r in mlflow if "mlflow.parentRunId" not in r.data.tags
               and r.data.tags.get("config_hash")}
    assert set(parents) == {"r1_zero", "sft_grpo"}, sorted(parents)

    port = _free_port()
    server = _serve_history(workdir / "prefect", port, tmp_path / "prefect-server.log")
    try:
        history = _read_history(f"http://127.0.0.1:{port}/api")
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    runs = history["runs"]

    compare = runs.get("compare-r1_zero-vs-sft_grpo")
    assert compare is not None, sorted(runs)
    assert compare["run"].state_type.value == "COMPLETED"
    # the comparison table, as a markdown artifact on the compare flow run
    artifacts = [a for a in history["artifacts"] if a.flow_run_id == compare["run"].id]
    assert len(artifacts) == 1 and "| recipe | benchmark |" in artifacts[0].data
    assert artifacts[0].key == "recipe-comparison"
    # issue 27: the compare run says the verdict (the one on MLflow's comparison run) in its
    # log and its artifact, with the table and a link to that MLflow run; its own work
    # shows as task runs
    (comp,) = [r for r in mlflow if r.data.tags.get("grpo.pipeline") == "comparison"]
    said = comp.data.tags["grpo.verdict"]
    assert said.startswith(("sft_grpo beats", "r1_zero beats", "no significant difference")), said
    compare_log = "\n".join(log.message for log in compare["logs"])
    assert f"verdict: {said}" in compare_log and "| recipe | benchmark |" in compare_log
    assert comp.info.run_id in compare_log
    assert artifacts[0].data.startswith(f"**{said}**") and f"/runs/{comp.info.run_id}" in artifacts[0].data
    assert {"comparison-report", "log-comparison"} <= {t.rsplit("-", 1)[0] for t in compare["tasks"]}, \
        sorted(compare["tasks"])
    assert comp.data.tags["prefect_flow_run_id"] == str(compare["run"].id)

    for recipe, parent in parents.items():
        name = f"{recipe}-{parent.data.tags['config_hash'][:8]}"
        assert name in runs, (name, sorted(runs))
        pipeline = runs[name]
        assert pipeline["run"].state_type.value == "COMPLETED"
        assert pipeline["run"].parent_task_run_id is not None  # a subflow of the compare run
        assert parent.data.tags["prefect_flow_run_id"] == str(pipeline["run"].id)

        stages = ["data", "model", "eval/base", "filter/round-1", "grpo/round-1",
                  "eval/round-1", "eval/final"] + (["sft", "eval/sft"] if recipe == "sft_grpo" else [])
        assert set(stages) <= set(pipeline["tasks"]), (recipe, sorted(pipeline["tasks"]))

        messages = [log.message for log in pipeline["logs"]]
        text = "\n".join(messages)
        for stage in stages:
            assert f"{stage}: started" in messages, (stage, text)
            assert re.search(rf"^{re.escape(stage)}: (computed|cached|reused from eval/[\w-]+) in "
                             r"[0-9.]+ s", text, re.M), (stage, text)
        # the final line carries the paired delta (issue 47), and eval/final says whose
        # evaluation it reused
        assert re.search(r"^final: synthetic avg@2 [0-9.]+ \[.*\], [+-][0-9.]+ .*over the base "
                         r"\(paired\)", text, re.M), text
        assert re.search(r"^eval/final: reused from eval/(round-\d|sft|base) in", text, re.M), text
        # one name per run, and the run's artifact: the result, the table, the MLflow links
        assert parent.info.run_name == name
        (page,) = [a for a in history["artifacts"] if a.flow_run_id == pipeline["run"].id]
        assert page.key == f"pipeline-{recipe.replace('_', '-')}"
        assert page.data.startswith(f"**{recipe}**: synthetic avg@2 ") and "delta (paired)" in page.data
        assert f"/runs/{parent.info.run_id}" in page.data, page.data
        findings = parent.data.tags.get("findings", "none")
        for finding in ([] if findings == "none" else findings.split(" | ")):
            assert f"finding: {finding}" in messages, (finding, text)
        if findings != "none":  # the one count, as the parent's page says it (issue 27)
            assert f"findings: {parent.data.tags['findings.count']}" in messages, text
        # the end line is in the stage's task run's log too (its page in the UI)
        final_task = pipeline["tasks"]["eval/final"].id
        assert any(log.task_run_id == final_task and log.message.startswith("eval/final: ")
                   for log in pipeline["logs"]), text


def test_run_names_and_plain_stages():
    """Without Prefect in the way: the name formats, and run_stage on a plain function
    (outside a flow run the stage runs as itself, no task run)."""
    import logging

    from flows.run_view import config_run_name
    from grpo_core.config import PipelineConfig
    from tasks.runner import run_stage
    from tasks.stage_results import FilterResult

    cfg = PipelineConfig()
    cfg.project.recipe = "sft_grpo"
    assert config_run_name(cfg) == f"sft_grpo-{cfg.hash()[:8]}"
    assert config_run_name(cfg.model_dump(mode="json"), "retrain-") == f"retrain-sft_grpo-{cfg.hash()[:8]}"

    def fn(x):
        return FilterResult(kept=x, considered=8)

    records = []
    log = logging.getLogger("test_prefect_story")
    log.addHandler(handler := logging.Handler())
    handler.emit = records.append
    log.setLevel(logging.INFO)
    try:
        assert run_stage(log, "filter/round-1", "filter", fn, 3) == FilterResult(kept=3, considered=8)
    finally:
        log.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert lines[0] == "filter/round-1: started"
    assert re.fullmatch(r"filter/round-1: computed in [0-9.]+ s: kept 3 of 8 \(38%\)", lines[1])
