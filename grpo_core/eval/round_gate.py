"""The gate after each GRPO round (flows/pipeline.py), a pure decision over the
evaluations the flow already holds.

A round regressed when its evaluation's primary metric (eval.primary_metric) falls below
the lower bound of the 95% CI of the evaluation it started from, on a benchmark both
scored. Then, with rounds.rollback_on_regression (the default), what follows (the next
round, the final evaluation, the model registered) starts from the best model evaluated
so far instead of the regressed one; without it the round's model goes on, and the
finding says so either way.

    start = best = Evaluated("eval/base", base["benchmarks"], base_model)
    for each round r:
        gate = gate_round(r, start, best, Evaluated(f"eval/round-{r}", ..., round_model),
                          primary, rollback)
        start, best = gate.start, gate.best
"""
from __future__ import annotations

from typing import NamedTuple


class Evaluated(NamedTuple):
    """A model and its evaluation: the shape of the flow's stage list."""

    label: str  # the eval stage: "eval/base", "eval/round-2"
    benchmarks: dict  # {bench: {"metrics": {metric: {"mean", "lo", "hi", ...}}}}
    model: str  # the model's folder


class Gate(NamedTuple):
    start: Evaluated  # what the next round (or the final evaluation) starts from
    best: Evaluated  # the best model evaluated so far
    findings: list[str]
    rolled_back: bool


def _metric(benchmarks: dict, bench: str, primary: str) -> dict:
    return ((benchmarks.get(bench) or {}).get("metrics") or {}).get(primary) or {}


def regressions(round_no: int, before: dict, after: dict, primary: str) -> list[str]:
    """One line per benchmark of `after` ({bench: result}) whose `primary` mean fell below
    the lower bound of `before`'s CI on it."""
    out = []
    for bench in after:
        now, was = _metric(after, bench, primary).get("mean"), _metric(before, bench, primary).get("lo")
        if now is not None and was is not None and now < was:
            out.append(f"round {round_no}: {bench} {primary} fell below the previous CI "
                       f"({now:.3f} < {was:.3f})")
    return out


def _better(a: Evaluated, b: Evaluated, bench: str, primary: str) -> bool:
    """a's primary mean on `bench` above b's (a tie keeps b, the earlier model)."""
    x = _metric(a.benchmarks, bench, primary).get("mean")
    y = _metric(b.benchmarks, bench, primary).get("mean")
    return x is not None and (y is None or x > y)


def gate_round(round_no: int, start: Evaluated, best: Evaluated, after: Evaluated,
               primary: str, rollback: bool) -> Gate:
    """Round `round_no` started from `start` and its model scored `after`; `best` is the
    best model evaluated so far (compared on `after`'s first benchmark: the per-round
    evaluations score the first benchmark only)."""
    lines = regressions(round_no, start.benchmarks, after.benchmarks, primary)
    if lines and rollback:
        lines[-1] += (f"; rolled back: what follows starts from {best.label}'s model "
                      "(rounds.rollback_on_regression)")
        return Gate(best, best, lines, True)
    if lines:
        lines[-1] += "; training goes on from this round's model (rounds.rollback_on_regression off)"
    bench = next(iter(after.benchmarks), None)
    return Gate(after, after if bench and _better(after, best, bench, primary) else best, lines, False)
