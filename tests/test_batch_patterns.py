"""A completion pattern repeated across most of a batch is `reward_hacking_suspect` evidence
(grpo_core/train/batch_patterns.py, the rule in grpo_core/train/diagnosis.py; issue 24
item 4): measured on constructed batches, judged on a round's history, and logged by a
real GRPO round."""
from __future__ import annotations

from test_diagnosis import codes, healthy

from grpo_core.config import config_from_dict
from grpo_core.findings import ACTIONS
from grpo_core.train.batch_patterns import (
    SHARE_METRICS,
    normalise,
    repeated_patterns,
    share_metrics,
)
from grpo_core.train.diagnosis import diagnose

pytest_plugins = ["fixtures_models"]

PLACEHOLDER = "the sum </think> <answer> here </answer>"


def _rows(completions_per_problem: dict[str, list[str]], golds: dict[str, str]) -> list[dict]:
    return [{"problem_id": pid, "prompt": f"Q {pid}", "completion": c, "answer": golds[pid]}
            for pid, completions in completions_per_problem.items() for c in completions]


GOLDS = {f"p{i}": str(10 + i) for i in range(4)}


def gamed_batch() -> list[dict]:
    """Three of four problems answered with the template's placeholder, as a SmolLM2
    round did (issue 24); the fourth right."""
    return _rows({"p0": [PLACEHOLDER, PLACEHOLDER, "x </think> <answer> 3 </answer>"],
                  "p1": [PLACEHOLDER, "y </think> <answer> 7 </answer>"],
                  "p2": ["other words </think> <answer> Here. </answer>"],
                  "p3": ["<answer> 13 </answer>", "<answer> 13 </answer>"]}, GOLDS)


def diverse_batch(seed: int = 0) -> list[dict]:
    """Wrong answers that differ from problem to problem (one repeated within a group:
    that is no pattern across problems), and the same right text under every problem."""
    return _rows({pid: [f"{pid} </think> <answer> {1000 * seed + 100 * i + j % 2} </answer>" for j in range(3)]
                  + ["ok </think> <answer> 5 </answer>"] * 2
                  for i, pid in enumerate(GOLDS)}, dict.fromkeys(GOLDS, "5"))


def test_a_placeholder_under_most_prompts_is_measured() -> None:
    found = repeated_patterns(gamed_batch())
    assert found["answer"].pattern == "here" and found["answer"].share == 0.75
    assert found["text"].pattern == normalise(PLACEHOLDER) and found["text"].share == 0.5
    assert share_metrics(found) == {SHARE_METRICS["answer"]: 0.75, SHARE_METRICS["text"]: 0.5}


def test_a_diverse_batch_and_right_answers_are_not_patterns() -> None:
    found = repeated_patterns(diverse_batch())
    assert found["answer"].share == 0.25 and found["text"].share == 0.25
    # every problem answered "5", and 5 is right for each: not a hack
    same_gold = _rows({pid: ["<answer> 5 </answer>"] * 2 for pid in GOLDS}, dict.fromkeys(GOLDS, "5"))
    assert share_metrics(repeated_patterns(same_gold)) == dict.fromkeys(SHARE_METRICS.values(), 0.0)
    # the round's accuracy reward decides right and wrong when it ran
    paid = [{**r, "rewards": {"accuracy": 1.0}} for r in gamed_batch()]
    assert repeated_patterns(paid) == {}
    # too few prompts to tell a pattern across problems from one group's agreement
    assert repeated_patterns(gamed_batch()[:3]) is None and share_metrics(None) == {}


def _history(batches: list[list[dict]]) -> list[dict]:
    rows = healthy(len(batches))
    for row, batch in zip(rows, batches):
        row.update(share_metrics(repeated_patterns(batch)))
    return rows


def test_the_rule_fires_on_repeated_patterns_and_stays_quiet_on_diverse_batches() -> None:
    n = 8
    diverse = _history([diverse_batch(seed) for seed in range(n)])
    assert codes(diagnose(diverse)) == []
    # the placeholder takes over from step 4 on
    gamed = _history([diverse_batch(s) for s in range(3)] + [gamed_batch()] * (n - 3))
    found = [f for f in diagnose(gamed) if f.code == "reward_hacking_suspect"]
    assert len(found) == 1, found
    assert found[0].evidence["pattern"] == "answer" and found[0].evidence["share"] == 0.75
    assert found[0].steps == [4, 5, 6, 7, 8]
    assert "under 75% of a batch's prompts" in found[0].line() and "rollouts" in ACTIONS[found[0].code]
    # the threshold is the config field
    strict = config_from_dict({"diagnosis": {"repeated_pattern_share": 0.8}})
    assert not [f for f in diagnose(gamed, strict) if f.code == "reward_hacking_suspect"]


def test_a_real_round_logs_the_shares_of_its_batches(tiny_model_path, tmp_path) -> None:
    """A real TRL round writing its rollouts to a real DuckDB store (the stage's buffering
    sink, flushed through the pattern watch): each step's logged share is the share of
    the batch stored under that step (the same step numbers). The policy, a random tiny
    model sampled near-greedily, writes one degenerate text whatever the problem: the
    round's findings name it and the rule fires on the round's own history."""
    from grpo_core.data.records import read_rollouts, rollout_sink
    from grpo_core.data.store import Store
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    cfg = config_from_dict({
        "grpo": {"max_steps": 2, "save_steps": 10, "max_completion_length": 6, "temperature": 0.05,
                 "per_device_train_batch_size": 12, "num_generations": 4},
        "rewards": {"funcs": ["accuracy", "tag_count"], "weights": [1.0, 0.5]}})
    with Store.open(tmp_path / "store.duckdb") as store:
        result = run_grpo_round(tiny_model_path, generate_problems("train", 6, levels=[1]), cfg,
                                tmp_path / "round", "r1_zero", rollout_sink=rollout_sink(store, "run"))
        batches: dict[int, list[dict]] = {}
        for row in read_rollouts(store, "run"):
            batches.setdefault(row["step"], []).append(row)
    logged = {h["step"]: {k: h[k] for k in SHARE_METRICS.values()} for h in result.history}
    assert sorted(batches) == sorted(logged) == [1, 2]
    for step, rows in batches.items():
        assert len({r["problem_id"] for r in rows}) == 3
        assert logged[step] == share_metrics(repeated_patterns(rows))
    assert [f for f in result.findings if f.code == "repeated_output"
            and f.summary.startswith("repeated text ") and "under 100% of the 3 prompts" in f.summary]
    found = [f for f in diagnose(result.history, cfg) if f.code == "reward_hacking_suspect"]
    assert [f.evidence["pattern"] for f in found] == ["text"] and found[0].steps == [1, 2]
