"""Paired comparisons of models scored on the same problems, and the comparison table:
pure functions over per-problem eval records and stage results (the records are read
from the store by tasks/eval_records.py; tasks/tracking logs what these decide).

- `paired_deltas`: two record sets -> paired deltas with 95% CIs
  (grpo_core.eval.paired.paired_delta); `delta_metrics` names them as logged on the
  eval/final run (`<bench>/<metric>_delta`, `_delta_ci_lo`, `_delta_ci_hi`, `_delta_n`).
- `stage_attribution`: which stage earned the gain (grpo_core.eval.attribution).
- `table_row`: the one builder of a comparison row (COMPARE_COLUMNS); `attribution_rows`,
  `comparison_metrics`, `comparison_params`: the table as rows, metrics and params.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Mapping, Sequence

from grpo_core.eval.attribution import phase_gains, stage_gains
from grpo_core.eval.metric_names import (
    HEADLINE,
    benchmarks_in,
    ci_block_keys,
    ci_cells,
    delta_key,
    sanitize_key,
    shown,
)
from grpo_core.eval.paired import paired_delta, paired_metric
from grpo_core.eval.score import BenchmarkScore, Scores

COMPARE_COLUMNS = ["recipe", "benchmark", "metric", "base", "base_lo", "base_hi", "final",
                   "final_lo", "final_hi", "delta", "delta_lo", "delta_hi"]
Triple = tuple[float | None, float | None, float | None]  # (value, lo, hi)


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


def final_vs_base(final: Scores, mine: Mapping[str, list], before: Mapping[str, list],
                  n_resamples: int = 1000, seed: int = 0) -> dict[str, dict]:
    """{bench: paired_deltas(final rows, base rows)} over every metric of each benchmark's
    final result; a benchmark with nothing paired is left out."""
    out = {}
    for bench, res in final.items():
        names = list(res.metrics)
        found = paired_deltas(mine.get(bench) or [], before.get(bench) or [], names,
                              n_resamples=n_resamples, seed=seed)
        if found:
            out[bench] = found
    return out


def delta_metrics(deltas: Mapping[str, Mapping[str, Mapping]]) -> dict[str, float]:
    """{bench: {metric: delta}} -> the MLflow metrics the comparison table reads back."""
    out = {}
    for bench, by_metric in deltas.items():
        for name, d in by_metric.items():
            keys = ci_block_keys(delta_key(f"{bench}/{sanitize_key(name)}"))
            out.update({keys[sub]: d["delta" if sub == "mean" else sub] for sub in keys})
    return out


def stage_attribution(stages: Sequence[tuple[str, BenchmarkScore | None, list[dict]]], benchmark: str | None,
                      metric: str, n_resamples: int = 1000, seed: int = 0) -> dict:
    """Which stage earned the gain, on `benchmark` and `metric`: {"benchmark", "metric",
    "stages": stage_gains (each with the stage's and the previous stage's metric block),
    "phases": phase_gains, "first", "last": the labels of the first and last stage kept}.
    `stages`: (eval label, that benchmark's stage result, its per-problem records) in
    pipeline order. A stage whose eval run is the previous one's (eval/final of the last
    round's model: one cached eval) adds nothing and is dropped."""
    kept, blocks, last_run = [], {}, None
    for label, res, rows in stages:
        if not res or (res.eval_run_id and res.eval_run_id == last_run):
            continue
        last_run = res.eval_run_id
        kept.append((label, rows))
        blocks[label] = ci_triple(res.metric(metric))
    kw = {"n_resamples": n_resamples, "seed": seed}
    gains = [{**g, "value": blocks[g["stage"]], "before": blocks[g["over"]]}
             for g in stage_gains(kept, metric, **kw)]
    return {"benchmark": benchmark, "metric": metric, "stages": gains,
            "phases": phase_gains(kept, metric, **kw),
            "first": kept[0][0] if kept else None, "last": kept[-1][0] if kept else None}


def attribution_rows(recipe: str, attribution: Mapping) -> list[dict]:
    """Comparison rows (COMPARE_COLUMNS) of a recipe's stage gains: `<recipe> - sft over
    base`, base = the stage before, final = the stage, delta paired. A gain of the last
    stage over the first (one GRPO round from the base: r1_zero) is the recipe's own row
    already, and is left out."""
    def short(label: str) -> str:
        return label.removeprefix("eval/")

    whole = (attribution.get("first"), attribution.get("last"))
    return [table_row(f"{recipe} - {short(g['stage'])} over {short(g['over'])}",
                      attribution["benchmark"], attribution["metric"], g["before"], g["value"],
                      (g["delta"], g["lo"], g["hi"]))
            for g in attribution.get("stages") or [] if (g["over"], g["stage"]) != whole]


def table_row(recipe: str, benchmark: str, metric: str, base: Triple, final: Triple,
              delta: Triple = (None, None, None)) -> dict:
    """One comparison row (COMPARE_COLUMNS) from (value, lo, hi) triples. Without a paired
    delta the delta is final minus base, without a CI (not an unpaired one)."""
    d, dlo, dhi = delta
    if d is None and final[0] is not None and base[0] is not None:
        d = final[0] - base[0]
    return dict(zip(COMPARE_COLUMNS, (recipe, benchmark, metric, *base, *final, d, dlo, dhi),
                    strict=True))


def logged_rows(recipe: str, metric: str, base: Mapping[str, float],
                final: Mapping[str, float]) -> list[dict]:
    """A recipe's comparison rows read back from its logged metrics: `base`/`final` the
    eval/base and eval/final runs' metrics (`<bench>/<metric>` with CI keys, the final's
    paired delta too), one row per benchmark the final run holds `metric` for."""
    mk = sanitize_key(metric)

    def triple(metrics, key):
        keys = ci_block_keys(key)
        return metrics.get(keys["mean"]), metrics.get(keys["lo"]), metrics.get(keys["hi"])

    return [table_row(recipe, bench, metric, triple(base, f"{bench}/{mk}"),
                      triple(final, f"{bench}/{mk}"), triple(final, delta_key(f"{bench}/{mk}")))
            for bench in benchmarks_in(final, mk)]


def ci_triple(block: Mapping | None, value: str = "mean") -> Triple:
    """(value, lo, hi) of a CI block: {"mean", "lo", "hi"} (a metric's), or with
    value="delta" a paired delta's {"delta", "lo", "hi"}; Nones for no block."""
    block = block or {}
    return block.get(value), block.get("lo"), block.get("hi")


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


def row_cell(row: Mapping, col: str, sign: str = "") -> str:
    """ci_text of one column (base, final, delta) of a row, numbers or CSV strings."""
    return ci_text(*(cell_number(row.get(cell)) for cell in ci_cells(col)), sign=sign)


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
    out = {"metric": rows[0]["metric"]} if rows else {}
    for r in rows:
        out[sanitize_key(f"{r['recipe']}/{r['benchmark']}")] = (
            f"base {row_cell(r, 'base')} -> final {row_cell(r, 'final')}; "
            f"delta {row_cell(r, 'delta', '+')}")
    return out
