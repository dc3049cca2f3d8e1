"""The experiment's views in MLflow's UI, written and read back: the headline runs-table
view, UI links, the comparison run's and the experiment's descriptions, and the
comparison table (`grpo compare`). The views, links and texts are grpo_core.eval's
(ui_views, headline); this module only reads and writes MLflow."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mlflow.tracking import MlflowClient

from grpo_core.eval.comparison import logged_rows
from grpo_core.eval.headline import comparison_description, landing_text
from grpo_core.eval.ui_views import (
    EXPERIMENT_KIND_TAG,
    MODEL_DEVELOPMENT,
    VIEW_KEY,
    VIEW_NAME,
    VIEW_TAG,
    comparison_links,
    headline_view,
    ui_links,
)
from tasks.tracking.mlflow_client import (
    child_runs,
    client_for,
    current_uri,
    get_client,
    set_tags,
    stage_of,
)

VERDICT_TAG = "grpo.verdict"


def set_experiment_view(client: MlflowClient, exp_id: str, benchmarks: Iterable[str],
                        metric: str) -> str:
    """Tag the experiment as model development and save the headline runs-table view,
    keeping earlier configs' benchmark columns; returns the view key for `ui_links`."""
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    old = client.get_experiment(exp_id).tags.get(VIEW_TAG)
    client.set_experiment_tag(exp_id, VIEW_TAG, headline_view(old, benchmarks, metric))
    return VIEW_KEY


def links_for_run(run_id: str, model: tuple[str, str] | None = None,
                  client: MlflowClient | None = None) -> dict[str, str]:
    """ui_links of `run_id` in this process's store (tasks.tracking.mlflow_client.connect)."""
    exp_id = get_client(client).get_run(run_id).info.experiment_id
    return ui_links(current_uri(), exp_id, run_id, model)


def describe_comparison(run_id: str, said: str, markdown: str, parent_runs: Sequence[str],
                        prefect_run: Mapping[str, str | None] | None = None,
                        client: MlflowClient | None = None, rows: Sequence[Mapping] = ()) -> None:
    """The comparison run's and the experiment's descriptions: the verdict first, then
    links (relative to the UI's address) to the comparison run, the parent runs, the
    headline view and the Prefect flow run; `rows`: the comparison table."""
    c = get_client(client)
    exp_id = c.get_run(run_id).info.experiment_id
    parents, prefect_link, links = comparison_links(
        exp_id, [(c.get_run(p).info.run_name, p) for p in parent_runs], prefect_run)
    prefect_id = (prefect_run or {}).get("id")
    set_tags(run_id, {"mlflow.note.content": comparison_description(said, rows, markdown, links),
                      VERDICT_TAG: said or "none",
                      **({"prefect_flow_run_id": prefect_id} if prefect_id else {})}, c)
    in_ui = ui_links("", exp_id, run_id, base="/")
    c.set_experiment_tag(exp_id, "mlflow.note.content", landing_text(
        said, in_ui["run"], parents, in_ui["runs_table"], VIEW_NAME, prefect_link))


def compare_table(uri: str | None, experiment: str, metric: str | None = None,
                  latest_only: bool = True) -> list[dict]:
    """COMPARE_COLUMNS rows from the FINISHED parent runs of `experiment` (the newest per
    recipe when latest_only): per benchmark, eval/base and eval/final with CIs and the
    paired delta; `metric` defaults to each parent's eval.primary_metric."""
    c = client_for(uri)
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
        kids = {stage_of(r): r.data.metrics for r in child_runs(parent.info.run_id, c)}
        if "eval/final" in kids:
            m = metric or parent.data.params.get("eval.primary_metric", "greedy_accuracy")
            rows += logged_rows(recipe, m, kids.get("eval/base", {}), kids["eval/final"])
    return sorted(rows, key=lambda r: (r["recipe"], r["benchmark"]))
