"""What a Prefect user sees of a run besides its stages' lines (tasks/runner.py): its
findings in the run log, its artifact (the result, the headline table, the MLflow links),
and the names the Prefect UI shows: a stage's task run is named by its label (`data`,
`grpo/round-1`, `eval/final`, and its end line is in that task run's log too), a flow run
by what it runs (`r1_zero-7ee43f68`: recipe and config hash; `compare-r1_zero-vs-sft_grpo`).
Nothing here imports prefect at import time."""
from __future__ import annotations

from collections.abc import Callable


def log_findings(log, findings: list) -> None:
    """Each finding (worth a human's look) as a line of the terminal and the Prefect run
    log, where `grpo run` over both recipes shows them nowhere else: after their count by
    severity, info ones at INFO, the others at WARNING."""
    from grpo_core.findings import count_findings

    if findings:
        log.info("findings: %s", count_findings(findings))
    for f in findings:  # grpo_core.findings.Finding
        (log.info if f.severity == "info" else log.warning)("finding: %s", f.line())


# --------------------------------------------------------------------------- run names
# Callables for @flow(flow_run_name=...): Prefect calls them with the run's context set,
# its parameters validated (so `config` is a PipelineConfig). A name that cannot be made
# keeps Prefect's generated one rather than failing the run.

def config_run_name(cfg, prefix: str = "") -> str:
    """`<prefix><recipe>-<first 8 of the config hash>`, the hash the MLflow parent run is
    tagged with (config_hash)."""
    if isinstance(cfg, dict):
        from grpo_core.config import PipelineConfig

        cfg = PipelineConfig.model_validate(cfg)
    return f"{prefix}{cfg.project.recipe}-{cfg.hash()[:8]}"


def _named_from_parameters(make: Callable[[dict], str]) -> str:
    from prefect.runtime import flow_run

    try:
        return make(flow_run.parameters)
    except Exception:  # noqa: BLE001 - never fail a run over its name
        return flow_run.name


def pipeline_run_name() -> str:
    """grpo-pipeline: `r1_zero-7ee43f68`."""
    return _named_from_parameters(lambda p: config_run_name(p["config"]))


def retrain_run_name() -> str:
    """grpo-retrain: `retrain-r1_zero-7ee43f68` (the config's hash, as the pipeline's)."""
    return _named_from_parameters(lambda p: config_run_name(p["config"], "retrain-"))


def compare_run_name() -> str:
    """grpo-compare: `compare-r1_zero-vs-sft_grpo`."""
    def make(p: dict) -> str:
        recipes = [c["project"]["recipe"] if isinstance(c, dict) else c.project.recipe
                   for c in p["configs"]]
        return "compare-" + "-vs-".join(recipes)

    return _named_from_parameters(make)


def prefect_run_link() -> dict:
    """This flow run's id and UI address: url None under the temporary local server (no
    PREFECT_API_URL), whose address dies with the run (serve the workspace's history on
    its own address instead: docs/prefect.md, "The workspace's own Prefect history")."""
    import os

    from prefect.runtime import flow_run

    url = flow_run.ui_url if os.environ.get("PREFECT_API_URL") else None
    return {"id": str(flow_run.id), "url": url, "name": flow_run.name}


# --------------------------------------------------------------------------- artifacts

def artifact_key(kind: str, recipe: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes): `pipeline-r1-zero`."""
    import re

    return re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{recipe}".lower()).strip("-")


def links_markdown(links: dict) -> str:
    """The MLflow links of an artifact, in the UI's "Model training" view: the run, the
    headline runs table, the model version; "" without any."""
    names = (("run", "MLflow run"), ("runs_table", "headline runs table"),
             ("model_version", "model version"))
    said = [f"[{label}]({links[k]})" for k, label in names if links.get(k)]
    return "MLflow: " + ", ".join(said) if said else ""


def publish_result(kind: str, recipe: str, head: list[str], report: dict, findings: list,
                   description: str) -> None:
    """A pipeline's or retrain's Prefect artifact (`<kind>-<recipe>`): `head` (the result or
    decision), the headline table of `report` (finish_pipeline's), the findings, the MLflow
    links; and the run link logged (`--watch` prints the log, not the artifact)."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact

    links = report.get("links") or {}
    markdown = "\n".join([*head, "", report.get("table") or "", "",
                           *([f"- {f.line()}" for f in findings] + [""] if findings else []),
                           links_markdown(links)])
    create_markdown_artifact(key=artifact_key(kind, recipe), markdown=markdown,
                             description=description)
    if links.get("run"):
        get_run_logger().info("MLflow run: %s", links["run"])
