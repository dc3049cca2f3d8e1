"""The gate after each GRPO round (grpo_core/eval/round_gate.py): which model what follows
starts from, and the findings that say so. The same gate in a real pipeline run:
tests/test_pipeline.py::test_a_regressed_round_rolls_back_to_the_best_model."""
from grpo_core.eval.round_gate import Evaluated, gate_round, regressions
from grpo_core.eval.score import BenchmarkScore
from grpo_core.findings import ACTIONS

M = "avg@4"


def ev(label: str, mean: float, lo: float, bench: str = "synthetic") -> Evaluated:
    block = {"mean": mean, "lo": lo, "hi": mean + (mean - lo)}
    return Evaluated(label, {bench: BenchmarkScore(metrics={M: block})}, f"/models/{label}")


BASE = ev("eval/base", 0.10, 0.08)


def test_a_round_below_the_previous_ci_rolls_back_to_the_best_model():
    gate = gate_round(1, BASE, BASE, ev("eval/round-1", 0.05, 0.03), M, rollback=True)
    assert gate.rolled_back and gate.start == gate.best == BASE
    assert [f.line() for f in gate.findings] == [
        "round 1: round_regressed [warn]: synthetic avg@4 fell below the previous CI (0.050 < "
        "0.080); rolled back: what follows starts from eval/base's model "
        "(rounds.rollback_on_regression) -> " + ACTIONS["round_regressed"]]


def test_the_rollback_goes_to_the_best_model_not_the_round_it_started_from():
    # round 1 a little worse than the base (inside its CI): kept, but the base stays best
    one = gate_round(1, BASE, BASE, ev("eval/round-1", 0.09, 0.07), M, rollback=True)
    assert not one.rolled_back and one.findings == []
    assert one.start.label == "eval/round-1" and one.best is BASE
    # round 2 below round 1's CI: back to the base, the best so far
    two = gate_round(2, one.start, one.best, ev("eval/round-2", 0.06, 0.04), M, rollback=True)
    assert two.rolled_back and two.start is BASE and two.best is BASE
    assert "synthetic avg@4 fell below the previous CI (0.060 < 0.070)" in two.findings[0].summary
    assert two.findings[0].stage == "round 2"


def test_a_better_round_becomes_the_best():
    up = ev("eval/round-1", 0.20, 0.17)
    gate = gate_round(1, BASE, BASE, up, M, rollback=True)
    assert gate.start is up and gate.best is up and not gate.rolled_back and gate.findings == []
    same = ev("eval/round-2", 0.20, 0.18)  # a tie keeps the earlier model as the best
    assert gate_round(2, up, up, same, M, rollback=True).best is up


def test_without_rollback_the_finding_only():
    down = ev("eval/round-1", 0.05, 0.03)
    gate = gate_round(1, BASE, BASE, down, M, rollback=False)
    assert not gate.rolled_back and gate.start is down and gate.best is BASE
    assert [(f.stage, f.code, f.summary) for f in gate.findings] == [
        ("round 1", "round_regressed", "synthetic avg@4 fell below the previous CI (0.050 < "
         "0.080); training goes on from this round's model (rounds.rollback_on_regression off)")]


def test_missing_numbers_never_roll_back():
    no_metric = Evaluated("eval/round-1", {"synthetic": BenchmarkScore()}, "/m")
    assert not gate_round(1, BASE, BASE, no_metric, M, rollback=True).rolled_back
    other_bench = ev("eval/round-1", 0.0, 0.0, bench="gsm8k")  # the base never scored it
    assert regressions(1, BASE.benchmarks, other_bench.benchmarks, M) == []
    assert not gate_round(1, BASE, BASE, other_bench, M, rollback=True).rolled_back


def test_regressions_name_each_benchmark_that_fell():
    before = {b: BenchmarkScore(metrics={M: {"mean": 0.5, "lo": 0.4}}) for b in "ab"}
    after = {"a": BenchmarkScore(metrics={M: {"mean": 0.3}}),
             "b": BenchmarkScore(metrics={M: {"mean": 0.45}})}
    fell = regressions(1, before, after, M)
    assert [(f.stage, f.summary, f.evidence["benchmark"]) for f in fell] == [
        ("round 1", "a avg@4 fell below the previous CI (0.300 < 0.400)", "a")]
