"""The grammar of metric names, written down once: what evaluation reports, and the names
the pipeline logs them under.

An evaluation metric (grpo_core.eval.metrics, evaluation.score, eval.primary_metric):

    [<extraction>/]<kind>[@<k>]
        extraction   strict (the template's own format; the default, written without a
                     prefix) or flexible (the standard evaluators' chain)
        kind@k       greedy_accuracy (no k), avg@k, maj@k, pass@k, and G-Pass@k at a
                     threshold tau as gpass50@k, gpass75@k, gpass100@k (tau in percent),
                     with k >= 1 (decimal, no leading zero: one spelling of each metric)

As logged (tasks/ logs them, through its sanitize_key: "pass@4" -> "pass_at_4"):

    <bench>/<metric>{,_ci_lo,_ci_hi,_n}            an eval run's metric with its CI block
    <bench>/<metric>_delta{,_ci_lo,_ci_hi,_n}      the paired delta (final minus base)
    final/<bench>/<metric>...                      the parent run's copy of the final eval
    <bench>/{base,final,delta}{,_lo,_hi}           the parent's headline (primary metric)
    <recipe>/<bench>/{base,final,delta}{,_lo,_hi}  a comparison run's table

Pure string work: no tracking import (the names are MLflow's, the grammar is ours)."""
from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from grpo_core.eval.score import Scores

EXTRACTIONS = ("strict", "flexible")
GREEDY = "greedy_accuracy"
# G-Pass@k's thresholds tau (the share of k samples that must be right), as lighteval
# reports them beside pass@k (which is tau -> 0); each is a kind of its own: gpass75@8.
GPASS_TAUS = {"gpass50": 0.5, "gpass75": 0.75, "gpass100": 1.0}
SAMPLED = ("avg", "maj", "pass", *GPASS_TAUS)  # kinds scored on k samples per problem

FINAL_PREFIX = "final/"  # the parent run's copy of the final evaluation
DELTA_SUFFIX = "_delta"  # the paired delta of a metric, final minus base
CI_BLOCK = (("mean", ""), ("lo", "_ci_lo"), ("hi", "_ci_hi"), ("n", "_n"))  # a CI block's keys
HEADLINE = ("base", "final", "delta")  # headline and comparison columns
CI_SUFFIXES = ("", "_lo", "_hi")  # a headline or comparison cell: value, 95% CI bounds


class MetricName(NamedTuple):
    """A parsed evaluation metric name. Orders by extraction, kind, then k."""

    extraction: str  # "strict" | "flexible"
    kind: str  # "greedy_accuracy" | "avg" | "maj" | "pass" | "gpass50" | "gpass75" | "gpass100"
    k: int | None  # None for greedy_accuracy

    @property
    def base(self) -> str:
        """The name without extraction prefix: "avg@8", "greedy_accuracy"."""
        return self.kind if self.k is None else f"{self.kind}@{self.k}"

    @property
    def name(self) -> str:
        """The one spelling: strict without prefix, "flexible/<base>" otherwise."""
        return self.base if self.extraction == "strict" else f"{self.extraction}/{self.base}"

    @property
    def record_suffix(self) -> str:
        """The suffix of the per-problem record fields that score it: greedy_correct
        (strict) or greedy_correct_flexible, sample_correct[_flexible], ..."""
        return "" if self.extraction == "strict" else f"_{self.extraction}"


def parse_metric(name: str) -> MetricName | None:
    """The parts of an evaluation metric name, None when `name` is not one (format_adherence,
    truncation_rate, n_problems, "pass@0", "avg@04", "/avg@4", "strict/flexible/avg@4", ...)."""
    extraction, sep, base = name.rpartition("/")
    extraction = extraction if sep else "strict"
    if extraction not in EXTRACTIONS:
        return None
    if base == GREEDY:
        return MetricName(extraction, GREEDY, None)
    kind, at, k = base.partition("@")
    if kind in SAMPLED and at and k.isascii() and k.isdigit() and k[0] != "0":
        return MetricName(extraction, kind, int(k))
    return None


def report_order(name: str) -> tuple:
    """Sort key of metric names as reports list them: by extraction and kind, G-Pass@k's
    thresholds right after pass@k (tau 0.5, 0.75, 1.0), then k. Non-metrics sort last."""
    m = parse_metric(name)
    if m is None:
        return ("~", "", 0.0, 0)
    kind, tau = ("pass", GPASS_TAUS[m.kind]) if m.kind in GPASS_TAUS else (m.kind, 0.0)
    return m.extraction, kind, tau, m.k or 0


def metric_name(kind: str, k: int | None = None, extraction: str = "strict") -> str:
    """The name of `kind` (at k samples) under `extraction`: ("avg", 8) -> "avg@8",
    ("greedy_accuracy", None, "flexible") -> "flexible/greedy_accuracy"."""
    return MetricName(extraction, kind, k).name


def reported_at(name: str, samples: int) -> bool:
    """Whether an evaluation at `samples` samples per problem reports `name`: greedy
    accuracy, avg@<samples>, maj@j, pass@j and gpass*@j for j <= samples, either extraction."""
    m = parse_metric(name)
    if m is None:
        return False
    return m.k is None or (m.k == samples if m.kind == "avg" else m.k <= samples)


def at_samples(name: str, samples: int) -> str:
    """`name` as an evaluation at `samples` samples reports it: avg@16 -> avg@<samples>,
    maj@8 -> maj@min(8, samples); greedy accuracy and non-metrics unchanged."""
    m = parse_metric(name)
    if m is None or m.k is None:
        return name
    return m._replace(k=samples if m.kind == "avg" else min(m.k, samples)).name


# --------------------------------------------------------------------------- logged names

def ci_block_keys(key: str) -> dict[str, str]:
    """{"mean": key, "lo": key_ci_lo, "hi": key_ci_hi, "n": key_n}: where a CI block
    ({"mean", "lo", "hi", "n"}) of metric `key` is logged."""
    return {sub: key + suffix for sub, suffix in CI_BLOCK}


def delta_key(key: str) -> str:
    """Where the paired delta of metric `key` (<bench>/<metric>) is logged."""
    return key + DELTA_SUFFIX


def ci_cells(key: str) -> tuple[str, str, str]:
    """(key, key_lo, key_hi): a headline or comparison cell's value and 95% CI bounds."""
    return tuple(key + s for s in CI_SUFFIXES)


def benchmarks_in(keys: Iterable[str], metric_key: str) -> list[str]:
    """The benchmarks b (sorted) with a key "b/<metric_key>" in `keys`, b one segment:
    the benchmarks an eval run logged `metric_key` for, or (metric_key "final") the
    benchmarks of a parent run's headline."""
    tail = "/" + metric_key
    return sorted(k[: -len(tail)] for k in keys
                  if k.endswith(tail) and k[: -len(tail)] and "/" not in k[: -len(tail)])


def shown(x: float) -> float:
    """A number as logged for people to read: rounded to 10 decimals, which drops binary
    float noise (0.18121874999999998 -> 0.18121875) and keeps every digit a mean of
    per-problem scores has."""
    return round(float(x), 10)


# --------------------------------------------------------------------------- as logged

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
MAX_KEY_LENGTH = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH


def sanitize_key(name: str) -> str:
    """A valid MLflow metric/param/tag name: alphanumerics, `_ - . /` and space only
    ("pass@4" -> "pass_at_4", other characters -> "_"), no empty or dot path segments."""
    name = _BAD_CHARS.sub("_", str(name).replace("@", "_at_"))
    parts = [p for p in name.split("/") if p not in ("", ".", "..")]
    return ("/".join(parts) or "_")[:MAX_KEY_LENGTH]


def _number(v) -> float | None:
    if v is None or isinstance(v, str):
        return None
    if isinstance(v, bool):
        return float(v)
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:  # numpy / torch scalars
        with contextlib.suppress(Exception):
            v = v.item()
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def flatten_metrics(metrics: Mapping, prefix: str = "") -> dict[str, float]:
    """Nested metric dicts to flat numbers. A CI block {"mean", "lo", "hi", "n"} becomes
    name, name_ci_lo, name_ci_hi, name_n; other nesting joins with "/"; strings, lists,
    None and NaN are dropped."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            if "mean" in v and ("lo" in v or "hi" in v):
                out.update({key + suffix: x for sub, suffix in CI_BLOCK
                            if (x := _number(v.get(sub))) is not None})
            else:
                out.update(flatten_metrics(v, key))
        elif (x := _number(v)) is not None:
            out[key] = x
    return out


def flatten(tree: Mapping, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """{"grpo": {"beta": 0.04}} -> {"grpo.beta": 0.04}. Lists of scalars stay one value;
    lists holding mappings are indexed ("data.train.0.source")."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key, sep))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Mapping) for x in v):
            for i, x in enumerate(v):
                if isinstance(x, Mapping):
                    out.update(flatten(x, f"{key}{sep}{i}", sep))
                else:
                    out[f"{key}{sep}{i}"] = x
        else:
            out[key] = v
    return out


def eval_metrics(benchmarks: Scores) -> dict[str, float]:
    """An evaluation's scores -> "<bench>/<metric>" numbers, e.g. synthetic/greedy_accuracy,
    synthetic/greedy_accuracy_ci_lo, synthetic/pass_at_4."""
    out: dict[str, float] = {}
    for bench, score in benchmarks.items():
        m = score.metrics
        out.update({sanitize_key(k): v for k, v in flatten_metrics(m, str(bench)).items()})
    return out
