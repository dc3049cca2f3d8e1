"""The gate after each GRPO round (flows/pipeline.py), a pure decision over the
evaluations the flow already holds.

A round regressed when its evaluation's primary metric (eval.primary_metric) falls below
the lower bound of the 95% CI of the evaluation it started from, on a benchmark both
scored. Then, with rounds.rollback_on_regression (the default), what follows (the next
round, the final evaluation, the model registered) starts from the best model evaluated
so far instead of the regressed one; without it the round's model goes on, and the
finding says so either way.

    start = best = Evaluated("eval/base", base.benchmarks, base_model)
    for each round r:
        gate = gate_round(r, start, best, Evaluated(f"eval/round-{r}", ..., round_model),
                          primary, rollback)
        start, best = gate.start, gate.best
"""
from __future__ import annotations

from typing import NamedTuple

from grpo_core.eval.score import Scores, metric_of
from grpo_core.findings import Finding


class Evaluated(NamedTuple):
    """A model and its evaluation: the shape of the flow's stage list."""

    label: str  # the eval stage: "eval/base", "eval/round-2"
    benchmarks: Scores  # {bench: its score}
    model: str  # the model's folder


class Gate(NamedTuple):
    start: Evaluated  # what the next round (or the final evaluation) starts from
    best: Evaluated  # the best model evaluated so far
    findings: list[Finding]
    rolled_back: bool


def regressions(round_no: int, before: Scores, after: Scores, primary: str,
                code: str = "round_regressed", then: str = "") -> list[Finding]:
    """One finding per benchmark of `after` whose `primary` mean fell below
    the lower bound of `before`'s CI on it; `then`: what happens next, said after it."""
    out = []
    for bench in after:
        now, was = metric_of(after, bench, primary).get("mean"), metric_of(before, bench, primary).get("lo")
        if now is not None and was is not None and now < was:
            out.append(Finding.note(
                code, f"{bench} {primary} fell below the previous CI ({now:.3f} < {was:.3f})"
                f"{then}", stage=f"round {round_no}", benchmark=bench, mean=now, previous_lo=was))
    return out


def _better(a: Evaluated, b: Evaluated, bench: str, primary: str) -> bool:
    """a's primary mean on `bench` above b's (a tie keeps b, the earlier model)."""
    x = metric_of(a.benchmarks, bench, primary).get("mean")
    y = metric_of(b.benchmarks, bench, primary).get("mean")
    return x is not None and (y is None or x > y)


def gate_round(round_no: int, start: Evaluated, best: Evaluated, after: Evaluated,
               primary: str, rollback: bool) -> Gate:
    """Round `round_no` started from `start` and its model scored `after`; `best` is the
    best model evaluated so far (compared on `after`'s first benchmark: the per-round
    evaluations score the first benchmark only)."""
    then = (f"; rolled back: what follows starts from {best.label}'s model "
            "(rounds.rollback_on_regression)" if rollback else
            "; training goes on from this round's model (rounds.rollback_on_regression off)")
    fell = regressions(round_no, start.benchmarks, after.benchmarks, primary, then=then)
    if fell and rollback:
        return Gate(best, best, fell, True)
    bench = next(iter(after.benchmarks), None)
    return Gate(after, after if bench and _better(after, best, bench, primary) else best, fell, False)
