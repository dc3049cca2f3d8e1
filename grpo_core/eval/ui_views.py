"""What MLflow's web UI is given to show the headline: the runs-table view and the links
that open it (pure; tasks/tracking/headline.py writes them as experiment tags).

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
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_core.eval.headline import headline_tag
from grpo_core.eval.metric_names import HEADLINE
from grpo_core.redaction import strip_userinfo

EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT = "mlflow.experimentKind", "custom_model_development"
VIEW_KEY = "grpo-headline"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_TAG = VIEW_TAG_PREFIX + VIEW_KEY
VIEW_NAME = "Headline: base, final, paired delta (95% CI)"  # as the Views menu lists it
WORKFLOW = "machine_learning"  # the UI's mode is browser-wide: links ask for this one
DEFAULT_UI = "http://127.0.0.1:5000"  # `mlflow ui`'s default address, for a local store
_STATS = ("grpo_steps", "sft_steps", "wall_min", "findings")
_MODELS = "attributes.`Models`"
CELL_PX, DELTA_PX = 210, 300  # runs-table widths of a headline cell, of the delta cell


def headline_columns(benchmarks: Iterable[str], metric: str) -> list[str]:
    """The runs table's headline columns: base, final and paired delta per benchmark (tags
    with their CI), then the run's size."""
    cols = [_MODELS]
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


def headline_view(old: str | None, benchmarks: Iterable[str], metric: str) -> str:
    """The headline view's tag value, keeping the benchmark columns of the view saved
    before (`old`: earlier configs of the experiment) and its creation time."""
    state, created = read_view(old)
    # metric columns of an earlier version's view gave way to the tags
    kept = [c for c in state.get("selectedColumns", []) if c.startswith("tags.")]
    cols = list(dict.fromkeys([*kept, *headline_columns(benchmarks, metric)]))
    stats = [f"metrics.`{s}`" for s in _STATS]  # the run's size after every benchmark
    cols = [_MODELS, *(c for c in cols if c not in (*stats, _MODELS)), *stats]
    view = {"searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False,
            "startTime": "ALL", "lifecycleFilter": "Active", "modelVersionFilter": "All Runs",
            "datasetsFilter": [], "selectedColumns": cols, "columnOrder": cols,
            # MLflow's default column (~90 px) cuts "0.054 [0.035, 0.072]" to "0.054 [0.03...":
            # wide enough for a value with its CI, and the comparison's recipe names
            "columnWidths": {c: DELTA_PX if c.endswith(" paired`") else CELL_PX
                             for c in cols if c.startswith("tags.")}}
    return saved_view(view, VIEW_NAME, created)


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


def comparison_links(exp_id: str, parents: Iterable[tuple[str, str]],
                     prefect_run: Mapping[str, str | None] | None) -> tuple[str, str, str]:
    """(parent runs as markdown links, the Prefect flow run's link or id, the links line)
    for the comparison's descriptions; links are relative to the UI's address.
    `parents`: (run name, run id) of each parent run."""
    names = ", ".join(f"[{name}]({ui_links('', exp_id, rid, base='/')['run']})"
                      for name, rid in parents)
    prefect = prefect_run or {}
    prefect_link = (f"[Prefect flow run]({prefect['url']})" if prefect.get("url")
                    else f"Prefect flow run `{prefect['id']}`" if prefect.get("id") else "")
    return names, prefect_link, f"Parent runs: {names}" + (f"; {prefect_link}" if prefect_link else "") + "."
