"""Run artifacts: text/JSON/files, plots, per-problem eval tables and the recipe
comparison run."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.eval.comparison import comparison_metrics, comparison_params
from grpo_core.eval.headline import comparison_tags
from grpo_core.workspace import artifact_root, experiment_name, slug, tracking_uri, workdir_of
from tasks.tracking.mlflow_client import (
    connect,
    experiment_id,
    get_client,
    log_metrics,
    log_params,
    set_tags,
)


def log_text(run_id: str, text: str, path: str, client: MlflowClient | None = None) -> str:
    get_client(client).log_text(run_id, text, path)
    return path


def log_json(run_id: str, obj: Any, path: str, client: MlflowClient | None = None) -> str:
    """Any JSON-able object (dataclass dicts, Paths and tuples via str/list) as an artifact."""
    return log_text(run_id, json.dumps(obj, indent=2, default=str), path, client)


def log_file(run_id: str, local_path: str | os.PathLike, artifact_dir: str | None = None,
             client: MlflowClient | None = None) -> str:
    get_client(client).log_artifact(run_id, str(local_path), artifact_dir)
    name = Path(local_path).name
    return f"{artifact_dir}/{name}" if artifact_dir else name


def copy_artifacts(src_run: str, dst_run: str, client: MlflowClient | None = None) -> None:
    """Give `dst_run` the artifacts of `src_run` (a cached stage's tables and plots)."""
    c = get_client(client)
    with tempfile.TemporaryDirectory() as tmp:
        local = c.download_artifacts(src_run, "", tmp)
        if any(Path(local).iterdir()):
            c.log_artifacts(dst_run, local)


def log_training_curves(run_id: str, history: Sequence[Mapping[str, Any]], kind: str = "grpo",
                        client: MlflowClient | None = None) -> str:
    """plots/<kind>_curves.png: tasks.plots' per-step panels."""
    from tasks.plots import figure

    path = f"plots/{slug(kind)}_curves.png"
    get_client(client).log_figure(run_id, figure(history, kind), path)
    return path


def log_passrate_histogram(run_id: str, pass_rates: Sequence[float], band: Sequence[float],
                           k: int | None = None, client: MlflowClient | None = None) -> str:
    """plots/passrate_histogram.png with the kept band shaded."""
    from tasks.plots import passrate_figure

    title = f"Estimated pass rate per prompt (k={k})" if k else "Estimated pass rate per prompt"
    path = "plots/passrate_histogram.png"
    fig = passrate_figure(list(pass_rates), (float(band[0]), float(band[1])), title=title)
    get_client(client).log_figure(run_id, fig, path)
    return path


def log_eval_table(run_id: str, per_problem: Sequence[Mapping[str, Any]], name: str,
                   max_rows: int | None = None, client: MlflowClient | None = None) -> str:
    """Per-problem eval results (grpo_core.eval.evaluation.eval_table_rows) as an MLflow
    table: artifact `name` if it ends in .json, else tables/<name>.json."""
    import pandas as pd

    from grpo_core.eval.evaluation import eval_table_rows  # imports duckdb

    path = name if name.endswith((".json", ".parquet")) else f"tables/{name}.json"
    rows = eval_table_rows(list(per_problem[:max_rows] if max_rows else per_problem))
    return _log_table(get_client(client), run_id, pd.DataFrame(rows), path)


def _log_table(c: MlflowClient, run_id: str, df, path: str) -> str:
    """MlflowClient.log_table, except that logging a table again replaces it (log_table
    alone appends the rows to the existing file)."""
    folder = os.path.dirname(path) or None
    if path not in {f.path for f in c.list_artifacts(run_id, folder)}:
        c.log_table(run_id, df, path)
        return path
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / os.path.basename(path)
        if path.endswith(".json"):
            df.to_json(local, orient="split", index=False, date_format="iso")
        else:
            df.to_parquet(local, index=False)
        c.log_artifact(run_id, str(local), folder)
    return path


def log_comparison(cfg, workspace, markdown: str, table_csv: str, chart: str | os.PathLike | None,
                   parent_runs: Sequence[str]) -> str:
    """The recipe comparison as its own run (grpo.pipeline=comparison; reused for the same
    parent runs): comparison.md, .csv, the chart and an MLflow table. Returns its id."""
    import csv
    import hashlib
    import io

    workdir = workdir_of(workspace, cfg)
    uri = tracking_uri(cfg, workdir)
    c = connect(uri)
    name = experiment_name(cfg)
    exp_id = experiment_id(c, name, artifact_root(uri, workdir, name))
    key = hashlib.sha256(",".join(sorted(parent_runs)).encode()).hexdigest()[:12]
    found = c.search_runs([exp_id], f"tags.`grpo.comparison_key` = '{key}'", max_results=1)
    if found:
        run_id = found[0].info.run_id
    else:
        run_id = c.create_run(exp_id, run_name="comparison", tags={
            "grpo.pipeline": "comparison", "grpo.comparison_key": key,
            "grpo.parent_runs": ",".join(parent_runs)}).info.run_id
    log_text(run_id, markdown, "comparison/comparison.md", c)
    log_text(run_id, table_csv, "comparison/comparison.csv", c)
    if chart is not None and Path(chart).is_file():
        log_file(run_id, chart, "comparison", c)
    rows = list(csv.DictReader(io.StringIO(table_csv)))
    if rows:
        import pandas as pd

        _log_table(c, run_id, pd.DataFrame(rows), "comparison/comparison_table.json")
    _log_comparison_numbers(run_id, rows, markdown, c)
    for p in parent_runs:
        with contextlib.suppress(MlflowException):
            set_tags(p, {"grpo.comparison_run": run_id}, c)
    c.set_terminated(run_id, "FINISHED")
    return run_id


def _log_comparison_numbers(run_id: str, rows: list[dict], markdown: str, c: MlflowClient) -> None:
    """The table on the run's page: metrics per recipe, benchmark and column (with CI
    bounds), a param per row, its runs-table tags, the markdown as its description."""
    log_metrics(run_id, comparison_metrics(rows), client=c)
    # Params cannot change once logged; the run is reused only for the same parent runs,
    # whose numbers are the same, so a clash means nothing new to say.
    with contextlib.suppress(MlflowException):
        log_params(run_id, comparison_params(rows), c)
    # its row of the runs table: the headline columns, recipe against recipe
    set_tags(run_id, {**comparison_tags(rows), "mlflow.note.content": markdown}, c)
