"""The eval budget that decides a delta (issue 46, item 1): `eval_budget_truncates` fires
when the earlier model of a delta was cut off at eval.max_new_tokens in more than
eval.max_truncated of its completions and more often than the later one, and names the
budget to re-evaluate at. The two models' results come from the real metrics code
(grpo_core.eval.metrics.summarise) over constructed per-problem records: one model cut off
in half of its completions, the other in none."""
from grpo_core.eval.metrics import summarise
from grpo_core.eval.score import BenchmarkScore
from grpo_core.findings import ACTIONS, count_findings
from grpo_core.train.eval_budget import budget_findings, truncated_share


def _result(cut_every: int, n: int = 20, k: int = 4) -> BenchmarkScore:
    """The score (summarise's metrics) of n problems x k samples; every `cut_every`-th
    completion (greedy and samples, in order) cut off at the budget (0: none)."""
    records, i = [], 0
    for p in range(n):
        flags = []
        for _ in range(k + 1):
            flags.append(bool(cut_every) and i % cut_every == 0)
            i += 1
        records.append({"greedy_correct": p % 3 == 0, "greedy_truncated": flags[0],
                        "sample_correct": [p % 2 == 0] * k, "sample_answers": ["1"] * k,
                        "sample_truncated": flags[1:]})
    return BenchmarkScore(metrics=summarise(records, n_resamples=20))


def test_the_finding_fires_when_the_earlier_model_was_cut_off():
    cut, whole = _result(cut_every=2), _result(cut_every=0)
    assert truncated_share(cut) == 0.5 and truncated_share(whole) == 0.0
    (f,) = budget_findings(("eval/base", {"synthetic": cut}), ("eval/final", {"synthetic": whole}),
                           max_new_tokens=40, max_truncated=0.05)
    assert f.code == "eval_budget_truncates" and f.severity == "warn"
    assert f.evidence["earlier_truncated"] == 0.5 and f.evidence["later_truncated"] == 0.0
    line = f.line()
    assert "eval/base was cut off at eval.max_new_tokens=40 in 50% of its completions" in line
    assert "eval/final in 0%" in line and "eval.max_new_tokens=80" in line, line
    assert f.action == ACTIONS["eval_budget_truncates"]
    assert count_findings([f]) == "1 finding (1 warn)"


def test_no_finding_when_the_budget_did_not_cut_the_earlier_model_more():
    cut, little, whole = _result(cut_every=2), _result(cut_every=25), _result(cut_every=0)
    assert truncated_share(little) == 0.04  # 4 of 100 completions: under 5%
    assert budget_findings(("a", {"s": little}), ("b", {"s": whole}), 40, 0.05) == []
    # the later model cut off as often: the budget treats both alike
    assert budget_findings(("a", {"s": cut}), ("b", {"s": cut}), 40, 0.05) == []
    # the other way round: the earlier model was let finish
    assert budget_findings(("a", {"s": whole}), ("b", {"s": cut}), 40, 0.05) == []
    # a benchmark the earlier model was not evaluated on says nothing
    assert budget_findings(("a", {}), ("b", {"s": whole}), 40, 0.05) == []
