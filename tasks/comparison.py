"""Read the recipe comparison back out of MLflow: base vs final metric (with CIs) per
recipe and benchmark from the finished parent runs of an experiment. Split out of
tasks.tracking, which re-exports compare_table and COMPARE_COLUMNS."""
from __future__ import annotations

from collections.abc import Mapping

from mlflow.tracking import MlflowClient

COMPARE_COLUMNS = ["recipe", "benchmark", "metric", "base", "base_lo", "base_hi", "final",
                   "final_lo", "final_hi", "delta"]


def _triple_from(metrics: Mapping[str, float], key: str) -> tuple:
    return metrics.get(key), metrics.get(f"{key}_ci_lo"), metrics.get(f"{key}_ci_hi")


def compare_table(uri: str | None, experiment: str, metric: str | None = None,
                  latest_only: bool = True) -> list[dict]:
    """Rows (COMPARE_COLUMNS) from the FINISHED parent runs of `experiment`: per recipe (the
    newest parent when latest_only) and benchmark, the metric on eval/base and eval/final
    with CIs. `metric` defaults to each parent's eval.primary_metric param."""
    c = MlflowClient(tracking_uri=uri, registry_uri=uri) if uri else _client()
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
        mk = sanitize_key(m)
        kids = {r.info.run_name: r for r in _children(parent.info.run_id, c)}
        final = kids.get("eval/final")
        if final is None:
            continue
        base = kids.get("eval/base")
        fm, bm = final.data.metrics, base.data.metrics if base else {}
        benches = sorted(k[: -len(mk) - 1] for k in fm
                         if k.endswith("/" + mk) and "/" not in k[: -len(mk) - 1])
        for bench in benches:
            f, flo, fhi = _triple_from(fm, f"{bench}/{mk}")
            b, blo, bhi = _triple_from(bm, f"{bench}/{mk}")
            rows.append({"recipe": recipe, "benchmark": bench, "metric": m, "base": b,
                         "base_lo": blo, "base_hi": bhi, "final": f, "final_lo": flo,
                         "final_hi": fhi, "delta": f - b if f is not None and b is not None else None})
    return sorted(rows, key=lambda r: (r["recipe"], r["benchmark"]))


# The core helpers, imported last: tasks.tracking imports this module at its own end to
# re-export it, so binding them here only after this module's names exist lets either
# module be imported first.
from tasks.tracking import _children, _client, sanitize_key
