"""Paired comparisons of two models scored on the same problems, and the recipe
comparison read back out of MLflow.

- The per-problem eval records behind a stage's result are read from the DuckDB store
  (`eval_results`): by the result's eval run id, else (results cached before they held
  one) by its protocol hash and the model's fingerprint (the newest such run).
- `paired_deltas` turns two record sets into paired deltas with 95% CIs
  (grpo_core.eval.paired.paired_delta); `delta_metrics` names them as logged on the eval/final
  run (`<bench>/<metric>_delta`, `_delta_ci_lo`, `_delta_ci_hi`, `_delta_n`).
- `table_row`: the one builder of a comparison row (COMPARE_COLUMNS), used by
  `compare_table` and by the recipe comparison flow (flows/compare.py).
- `compare_table`: base vs final metric (with CIs) and the paired delta (with its CI) per
  recipe and benchmark, from the finished parent runs of an experiment.

tasks.tracking re-exports compare_table and COMPARE_COLUMNS."""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from mlflow.tracking import MlflowClient

from grpo_core.data.records import read_eval_results, read_eval_runs
from grpo_core.data.store import Store, StoreError
from grpo_core.eval.attribution import phase_gains, stage_gains
from grpo_core.eval.metric_names import (
    HEADLINE,
    benchmarks_in,
    ci_block_keys,
    ci_cells,
    delta_key,
    shown,
)
from grpo_core.eval.paired import paired_delta, paired_metric
from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
from grpo_core.workspace import Workspace
from tasks.tracking.mlflow_client import child_runs, get_client, sanitize_key, stage_of

COMPARE_COLUMNS = ["recipe", "benchmark", "metric", "base", "base_lo", "base_hi", "final",
                   "final_lo", "final_hi", "delta", "delta_lo", "delta_hi"]


# --------------------------------------------------------------------------- records

@contextlib.contextmanager
def records_store(workdir: Workspace | str | os.PathLike, timeout: float = 0.0
                  ) -> Iterator[Store | None]:
    """The workspace's store opened read-only, or None when there is none or it stays
    locked past `timeout`: without per-problem records there is no paired number, which
    the callers report, rather than a failed pipeline at its last step."""
    root = workdir.root if isinstance(workdir, Workspace) else Path(workdir)
    path = Workspace(root).db_path
    try:
        store = Store.open(path, read_only=True, timeout=timeout) if path.exists() else None
    except StoreError:
        store = None
    try:
        yield store
    finally:
        if store is not None:
            store.close()


def find_eval_run(store: Store, protocol_hash: str | None, model_path: str) -> str | None:
    """The newest eval run of `model_path` under `protocol_hash` (the stage cache may hand
    back a result computed by an earlier pipeline: its rows are that run's)."""
    if not protocol_hash:
        return None
    fp = model_fingerprint(str(model_path))
    runs = [r for r in read_eval_runs(store, protocol_hash) if r["model_fingerprint"] == fp]
    return runs[-1]["run_id"] if runs else None


def run_records(store: Store | None, run_id: str | None) -> list[dict]:
    """The per-problem rows of one eval run ([] without a store or run id)."""
    if store is None or not run_id:
        return []
    return read_eval_results(store, run_id=run_id)


def stage_records(store: Store | None, result: Mapping, model_path: str | None) -> list[dict]:
    """The per-problem rows behind one benchmark's stage result ({"metrics",
    "protocol_hash", "eval_run_id"}) of the model at `model_path`; results cached before
    they held the eval run id are found by protocol hash and model fingerprint."""
    if store is None:
        return []
    run_id = result.get("eval_run_id")
    if not run_id and model_path is not None:
        run_id = find_eval_run(store, result.get("protocol_hash"), model_path)
    return run_records(store, run_id)


def base_records(store: Store | None, cfg, workdir, final: Mapping[str, Mapping],
                 base: Mapping[str, Mapping] | None = None,
                 base_model: str | None = None) -> dict[str, list[dict]]:
    """{bench: rows} of the pipeline's base model. Without its stage results, the base was
    evaluated under the final eval's protocol (one config, the same problems), so its run
    is found by that hash and the base model's fingerprint."""
    if store is None:
        return {}
    base = base if base is not None else {
        bench: {"protocol_hash": res.get("protocol_hash")} for bench, res in final.items()}
    if base_model is None and not all(res.get("eval_run_id") for res in base.values()):
        # Only then: resolving the built-in model builds it when it is missing.
        root = workdir.root if isinstance(workdir, Workspace) else Path(workdir)
        base_model = resolve_model_path(cfg.model.name_or_path, Workspace(root).models)
    return {bench: stage_records(store, res, base_model) for bench, res in base.items()}


# --------------------------------------------------------------------------- deltas

def paired_deltas(a: list[dict], b: list[dict], names: Iterable[str],
                  n_resamples: int = 1000, seed: int = 0) -> dict[str, dict]:
    """{metric: {"delta", "lo", "hi", "n"}} of a minus b for each name that can be paired.
    A metric the records cannot pair (other problems or sample counts, rows stored
    without flexible verdicts) is left out: the table then shows no CI for it rather
    than an unpaired one."""
    if not a or not b:
        return {}
    from grpo_core.eval.evaluation import vote_key  # maj@k votes as the evaluation did

    # Every maj@k of both extractions votes on the same answers again: canonicalise each
    # distinct answer once (math parsing is the slow part).
    canon = functools.lru_cache(maxsize=None)(vote_key)
    out = {}
    for name in names:
        if paired_metric(name):
            with contextlib.suppress(ValueError):
                out[name] = paired_delta(a, b, name, canon=canon, n_resamples=n_resamples,
                                         seed=seed)
    return out


def delta_metrics(deltas: Mapping[str, Mapping[str, Mapping]]) -> dict[str, float]:
    """{bench: {metric: delta}} -> the MLflow metrics `compare_table` reads back."""
    out = {}
    for bench, by_metric in deltas.items():
        for name, d in by_metric.items():
            keys = ci_block_keys(delta_key(f"{bench}/{sanitize_key(name)}"))
            out.update({keys[sub]: d["delta" if sub == "mean" else sub] for sub in keys})
    return out


def stage_attribution(store: Store | None, cfg, stages: Sequence[tuple[str, Mapping, str | None]]
                      ) -> dict:
    """Which stage earned the gain, on the first benchmark and the primary metric:
    {"benchmark", "metric", "stages": grpo_core.eval.attribution.stage_gains (each with the
    stage's and the previous stage's metric block), "phases": phase_gains}. `stages`:
    (eval label, {bench: stage result}, model path) in pipeline order. A stage whose eval
    run is the previous one's (eval/final of the last round's model: one cached eval) adds
    nothing and is dropped."""
    bench, metric = next(iter(cfg.eval.benchmarks), None), cfg.eval.primary_metric
    kept, blocks, last_run = [], {}, None
    for label, results, model in stages:
        res = (results or {}).get(bench)
        if not res or (res.get("eval_run_id") and res.get("eval_run_id") == last_run):
            continue
        last_run = res.get("eval_run_id")
        kept.append((label, stage_records(store, res, model)))
        blocks[label] = ci_triple((res.get("metrics") or {}).get(metric))
    kw = {"n_resamples": cfg.eval.bootstrap, "seed": cfg.project.seed}
    gains = [{**g, "value": blocks[g["stage"]], "before": blocks[g["over"]]}
             for g in stage_gains(kept, metric, **kw)]
    return {"benchmark": bench, "metric": metric, "stages": gains,
            "phases": phase_gains(kept, metric, **kw)}


def attribution_rows(recipe: str, attribution: Mapping) -> list[dict]:
    """Comparison rows (COMPARE_COLUMNS) of a recipe's stage gains: `<recipe> - sft over
    base`, base = the stage before, final = the stage, delta paired."""
    def short(label: str) -> str:
        return label.removeprefix("eval/")

    return [table_row(f"{recipe} - {short(g['stage'])} over {short(g['over'])}",
                      attribution["benchmark"], attribution["metric"], g["before"], g["value"],
                      (g["delta"], g["lo"], g["hi"]))
            for g in attribution.get("stages") or []]


# --------------------------------------------------------------------------- table

Triple = tuple[float | None, float | None, float | None]  # (value, lo, hi)


def table_row(recipe: str, benchmark: str, metric: str, base: Triple, final: Triple,
              delta: Triple = (None, None, None)) -> dict:
    """One comparison row (COMPARE_COLUMNS) from (value, lo, hi) triples. Without a paired
    delta the delta is final minus base, without a CI (not an unpaired one)."""
    b, blo, bhi = base
    f, flo, fhi = final
    d, dlo, dhi = delta
    if d is None and f is not None and b is not None:
        d = f - b
    return dict(zip(COMPARE_COLUMNS, (recipe, benchmark, metric, b, blo, bhi, f, flo, fhi,
                                      d, dlo, dhi), strict=True))


def cell_number(x) -> float | None:
    """A table cell as a number: rows read back from CSV hold strings, "" for none."""
    if x is None or x == "":
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def ci_text(v: float | None, lo: float | None, hi: float | None, sign: str = "") -> str:
    """"0.136 [0.102, 0.171]" ("+0.083 [...]" with sign="+"); "-" for no value, no
    brackets without both bounds. One format for every table cell of a comparison."""
    if v is None:
        return "-"
    return f"{v:{sign}.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def comparison_metrics(rows: Iterable[Mapping]) -> dict[str, float]:
    """The comparison table as metrics: `<recipe>/<benchmark>/{base,final,delta}` and
    their `_lo` / `_hi` (recipe-vs-recipe rows are named `A vs B`)."""
    out = {}
    for r in rows:
        prefix = sanitize_key(f"{r['recipe']}/{r['benchmark']}")
        for col in HEADLINE:
            for cell in ci_cells(col):
                x = cell_number(r.get(cell))
                if x is not None:
                    out[f"{prefix}/{cell}"] = shown(x)
    return out


def comparison_params(rows: Sequence[Mapping]) -> dict[str, str]:
    """The comparison table as readable params, one per row ("base 0.054 [0.035, 0.072]
    -> final 0.136 [...]; delta +0.082 [...]"), and the metric the table is on."""
    def cell(r, col, sign=""):
        return ci_text(*(cell_number(r.get(cell)) for cell in ci_cells(col)), sign=sign)

    out = {"metric": rows[0]["metric"]} if rows else {}
    for r in rows:
        out[sanitize_key(f"{r['recipe']}/{r['benchmark']}")] = (
            f"base {cell(r, 'base')} -> final {cell(r, 'final')}; delta {cell(r, 'delta', '+')}")
    return out


def ci_triple(block: Mapping | None, value: str = "mean") -> Triple:
    """(value, lo, hi) of a CI block: {"mean", "lo", "hi"} (a metric's), or with
    value="delta" a paired delta's {"delta", "lo", "hi"}; Nones for no block."""
    block = block or {}
    return block.get(value), block.get("lo"), block.get("hi")


def _triple_from(metrics: Mapping[str, float], key: str) -> Triple:
    keys = ci_block_keys(key)
    return metrics.get(keys["mean"]), metrics.get(keys["lo"]), metrics.get(keys["hi"])


def compare_table(uri: str | None, experiment: str, metric: str | None = None,
                  latest_only: bool = True) -> list[dict]:
    """Rows (COMPARE_COLUMNS) from the FINISHED parent runs of `experiment`: per recipe (the
    newest parent when latest_only) and benchmark, the metric on eval/base and eval/final
    with CIs, and the paired delta with its CI when the pipeline logged one (else the
    difference of the means, without a CI). `metric` defaults to each parent's
    eval.primary_metric param."""
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
    final = kids.get("eval/final")
    if final is None:
        return []
    base = kids.get("eval/base")
    fm, bm = final.data.metrics, base.data.metrics if base else {}
    return [table_row(recipe, bench, m, _triple_from(bm, f"{bench}/{mk}"),
                      _triple_from(fm, f"{bench}/{mk}"), _triple_from(fm, delta_key(f"{bench}/{mk}")))
            for bench in benchmarks_in(fm, mk)]

