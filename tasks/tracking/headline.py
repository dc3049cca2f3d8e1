"""The experiment's views in MLflow's UI: the headline runs-table view, UI links, the
comparison run's and the experiment's descriptions, and the comparison table read back
(`grpo compare`); the numbers and texts are grpo_core.eval.headline's.

MLflow 3.17 keeps a runs-table view as the experiment tag `mlflow.sharedViewState.<id>`; a
value in its saved-view envelope ({"name", "createdAt", "updatedAt", "state": the view as
a JSON string}) is listed under the runs table's "Views" menu by its name, and opens
through `?viewStateShareKey=<id>`. Links ask for MLflow's model-training mode
(`?workflowType=machine_learning`): MLflow 3.17 ignores the experiment's kind tag and
opens every experiment in its GenAI view (checked in Chromium: bench/mlflow_ui_check.py).
"""
from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mlflow.tracking import MlflowClient

from grpo_core.eval.comparison import table_row
from grpo_core.eval.headline import comparison_description, headline_tag, landing_text
from grpo_core.eval.metric_names import (
    HEADLINE,
    benchmarks_in,
    ci_block_keys,
    delta_key,
    sanitize_key,
)
from grpo_core.redaction import strip_userinfo
from tasks.tracking.mlflow_client import child_runs, current_uri, get_client, set_tags, stage_of

EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"
VIEW_KEY = "grpo-headline"
VIEW_NAME = "Headline: base, final, paired delta (95% CI)"  # as the Views menu lists it
WORKFLOW = "machine_learning"  # the UI's mode is browser-wide: links ask for this one
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
DEFAULT_UI = "http://127.0.0.1:5000"  # `mlflow ui`'s default address, for a local store
_STATS = ("grpo_steps", "sft_steps", "wall_min", "findings")
CELL_PX, DELTA_PX = 210, 300  # runs-table widths of a headline cell, of the delta cell


def headline_columns(benchmarks: Iterable[str], metric: str) -> list[str]:
    """The runs table's headline columns: base, final and paired delta per benchmark (tags
    with their CI), then the run's size."""
    cols = ["attributes.`Models`"]
    for bench in benchmarks:
        cols += [f"tags.`{headline_tag(bench, metric, name)}`" for name in HEADLINE]
    return cols + [f"metrics.`{s}`" for s in _STATS]


def saved_view(state: Mapping[str, Any], name: str, created_ms: int | None = None) -> str:
    """A runs-table view as MLflow 3.17's web app saves one (listed under "Views")."""
    now = int(time.time() * 1000)
    return json.dumps({"name": name, "createdAt": created_ms or now, "updatedAt": now,
                       "state": json.dumps(state)})


def read_view(value: str | None) -> tuple[dict, int | None]:
    """(state, createdAt) of a view tag, in the saved-view envelope or bare (older runs)."""
    try:
        found = json.loads(value) if value else {}
        if isinstance(found.get("state"), str):
            return json.loads(found["state"]), found.get("createdAt")
        return found, None
    except (ValueError, AttributeError):
        return {}, None


def set_experiment_view(client: MlflowClient, exp_id: str, benchmarks: Iterable[str],
                        metric: str) -> str:
    """Tag the experiment as model development and save the headline runs-table view,
    keeping earlier configs' benchmark columns; returns the view key for `ui_links`."""
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    tag = VIEW_TAG_PREFIX + VIEW_KEY
    old, created = read_view(client.get_experiment(exp_id).tags.get(tag))
    # metric columns of an earlier version's view gave way to the tags
    kept = [c for c in old.get("selectedColumns", []) if c.startswith("tags.")]
    cols = list(dict.fromkeys([*kept, *headline_columns(benchmarks, metric)]))
    stats = [f"metrics.`{s}`" for s in _STATS]  # the run's size after every benchmark
    cols = ["attributes.`Models`", *(c for c in cols if c not in (*stats, "attributes.`Models`")),
            *stats]
    view = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
            "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs",
            "datasetsFilter": [], "selectedColumns": cols, "columnOrder": cols,
            # MLflow's default column (~90 px) cuts "0.054 [0.035, 0.072]" to "0.054 [0.03...":
            # wide enough for a value with its CI, and the comparison's recipe names
            "columnWidths": {c: DELTA_PX if c.endswith(" paired`") else CELL_PX
                             for c in cols if c.startswith("tags.")}}
    client.set_experiment_tag(exp_id, tag, saved_view(view, VIEW_NAME, created))
    return VIEW_KEY


def ui_base(tracking_uri: str) -> str:
    """The MLflow UI of `tracking_uri`: an http(s) server itself (credentials stripped),
    else $GRPO_MLFLOW_UI_URL, else `mlflow ui`'s default address."""
    if tracking_uri.startswith(("http://", "https://")):
        return strip_userinfo(tracking_uri).rstrip("/")
    return os.environ.get("GRPO_MLFLOW_UI_URL") or DEFAULT_UI


def ui_links(tracking_uri: str, exp_id: str, run_id: str | None = None,
             model: tuple[str, str] | None = None, base: str | None = None) -> dict[str, str]:
    """{"runs_table": ..., "run": ..., "model_version": ...} (the last two when asked);
    `base`: the UI's address when not ui_base's (an `mlflow ui` on another port)."""
    base, ml = (base or ui_base(tracking_uri)).rstrip("/"), f"workflowType={WORKFLOW}"
    links = {"runs_table": f"{base}/#/experiments/{exp_id}/runs?{ml}&viewStateShareKey={VIEW_KEY}"}
    if run_id:
        links["run"] = f"{base}/#/experiments/{exp_id}/runs/{run_id}?{ml}"
    if model:
        name, version = model
        links["model_version"] = (f"{base}/#/models/{urllib.parse.quote(name)}/versions/"
                                  f"{version}?{ml}")
    return links


def links_for_run(run_id: str, model: tuple[str, str] | None = None,
                  client: MlflowClient | None = None) -> dict[str, str]:
    """ui_links of `run_id` in this process's store (tasks.tracking.mlflow_client.connect)."""
    exp_id = get_client(client).get_run(run_id).info.experiment_id
    return ui_links(current_uri(), exp_id, run_id, model)


VERDICT_TAG = "grpo.verdict"


def describe_comparison(run_id: str, said: str, markdown: str, parent_runs: Sequence[str],
                        prefect_run: Mapping[str, str | None] | None = None,
                        client: MlflowClient | None = None, rows: Sequence[Mapping] = ()) -> None:
    """The comparison run's and the experiment's descriptions: the verdict first, then
    links (relative to the UI's address) to the comparison run, the parent runs, the
    headline view and the Prefect flow run; `rows`: the comparison table."""
    c = get_client(client)
    run = c.get_run(run_id)
    exp_id = run.info.experiment_id

    def link(rid: str) -> str:
        return ui_links("", exp_id, rid, base="/")["run"]

    parents = ", ".join(f"[{c.get_run(p).info.run_name}]({link(p)})" for p in parent_runs)
    prefect = prefect_run or {}
    prefect_link = (f"[Prefect flow run]({prefect['url']})" if prefect.get("url")
                    else f"Prefect flow run `{prefect['id']}`" if prefect.get("id") else "")
    links = f"Parent runs: {parents}" + (f"; {prefect_link}" if prefect_link else "") + "."
    set_tags(run_id, {"mlflow.note.content": comparison_description(said, rows, markdown, links),
                      VERDICT_TAG: said or "none",
                      **({"prefect_flow_run_id": prefect["id"]} if prefect.get("id") else {})}, c)
    c.set_experiment_tag(exp_id, "mlflow.note.content", landing_text(
        said, link(run_id), parents, ui_links("", exp_id, base="/")["runs_table"], VIEW_NAME,
        prefect_link))


def compare_table(uri: str | None, experiment: str, metric: str | None = None,
                  latest_only: bool = True) -> list[dict]:
    """COMPARE_COLUMNS rows from the FINISHED parent runs of `experiment` (the newest per
    recipe when latest_only): per benchmark, eval/base and eval/final with CIs and the
    paired delta; `metric` defaults to each parent's eval.primary_metric."""
    c = MlflowClient(tracking_uri=uri, registry_uri=uri) if uri else get_client()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    parents = c.search_runs([exp.experiment_id],
                            "tags.`grpo.pipeline` = 'parent' and attributes.status = 'FINISHED'",
                            order_by=["attributes.start_time DESC"], max_results=1000)
    rows, seen = [], set()
    for parent in parents:
        recipe = parent.data.tags.get("recipe", "?")
        if latest_only and recipe in seen:
            continue
        seen.add(recipe)
        m = metric or parent.data.params.get("eval.primary_metric", "greedy_accuracy")
        rows += _recipe_rows(c, parent, recipe, m)
    return sorted(rows, key=lambda r: (r["recipe"], r["benchmark"]))


def _recipe_rows(c: MlflowClient, parent, recipe: str, m: str) -> list[dict]:
    mk = sanitize_key(m)
    kids = {stage_of(r): r for r in child_runs(parent.info.run_id, c)}
    if "eval/final" not in kids:
        return []
    fm = kids["eval/final"].data.metrics
    bm = kids["eval/base"].data.metrics if "eval/base" in kids else {}

    def triple(metrics, key):
        keys = ci_block_keys(key)
        return metrics.get(keys["mean"]), metrics.get(keys["lo"]), metrics.get(keys["hi"])

    return [table_row(recipe, bench, m, triple(bm, f"{bench}/{mk}"), triple(fm, f"{bench}/{mk}"),
                      triple(fm, delta_key(f"{bench}/{mk}")))
            for bench in benchmarks_in(fm, mk)]
