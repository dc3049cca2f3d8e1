"""dynamic_sampling (DAPO): the pure helpers (which groups teach, how TRL batches of
different padded widths splice), then real TRL steps on a tiny random model: dropped groups
are regenerated, the trained batch keeps its size, advantages stay TRL's, and off (or on
with nothing to drop) trains exactly as without it."""
import math
import types

import pytest
import torch

from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train.dynamic_sampling import (
    METRICS,
    dynamic_sampler,
    fresh_rows,
    informative_groups,
    pick_groups,
    rescale_batch_advantages,
    splice,
)
from grpo_core.train.grpo import run_grpo_round
from grpo_core.train.trainer_internals import weighted_rewards

pytest_plugins = ["fixtures_models"]

G = 4
PAD = 0


# ----------------------------------------------------------------------------- helpers


def test_informative_groups_from_rewards():
    rewards = [1, 1, 1, 1,  0, 1, 0, 0,  0.5, 0.5 + 1e-9, 0.5, 0.5,  float("nan"), 2, float("nan"), 2]
    assert informative_groups(rewards, G) == [False, True, False, False]
    # one scored row is not a spread; two different scored rows are
    assert informative_groups([float("nan")] * 3 + [1.0, float("nan"), 0.0, float("nan"), 1.0], G) == [False, True]
    with pytest.raises(ValueError, match="whole groups"):
        informative_groups([1.0] * 6, G)


def test_weighted_rewards_match_trls_sum():
    nan = float("nan")
    per_func = torch.tensor([[1.0, 0.5], [nan, 0.5], [nan, nan]])
    total = weighted_rewards(per_func, torch.tensor([1.0, 2.0]))
    assert total[:2].tolist() == [2.0, 1.0] and math.isnan(total[2])  # unscorable stays NaN


def test_pick_groups_prefers_informative_then_fills_from_the_first_pass():
    assert pick_groups([[True, False, True], [True, True]], 3) == [(0, 0), (0, 2), (1, 0)]
    # cap hit: informative first, then the first pass's uninformative groups
    assert pick_groups([[False, True, False], [False], [True]], 3) == [(0, 1), (2, 0), (0, 0)]
    assert pick_groups([[False, False], [False, False]], 2) == [(0, 0), (0, 1)]


def _part(prompt_lens, completion_lens, adv, seed):
    """A TRL-shaped scored batch (left-padded prompts, right-padded completions)."""
    g = torch.Generator().manual_seed(seed)
    P, C = max(prompt_lens), max(completion_lens)
    prompt_ids = torch.full((len(prompt_lens), P), PAD)
    prompt_mask = torch.zeros((len(prompt_lens), P), dtype=torch.long)
    completion_ids = torch.full((len(completion_lens), C), PAD)
    completion_mask = torch.zeros((len(completion_lens), C), dtype=torch.long)
    logps = torch.zeros((len(completion_lens), C))
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        prompt_ids[i, P - p:] = torch.randint(5, 50, (p,), generator=g)
        prompt_mask[i, P - p:] = 1
        completion_ids[i, :c] = torch.randint(5, 50, (c,), generator=g)
        completion_mask[i, :c] = 1
        logps[i, :c] = -torch.rand(c, generator=g)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor(adv, dtype=torch.float32),
            "num_items_in_batch": completion_mask.sum(), "ref_per_token_logps": logps}


def test_splice_pads_prompts_left_and_completions_right():
    a = _part([3, 2, 3, 1, 2, 2, 2, 2], [2, 4, 1, 3, 2, 2, 2, 2], [1.0, -1.0, 0.5, -0.5] + [0.0] * 4, 1)
    b = _part([5, 4, 5, 5], [6, 1, 2, 3], [0.2, -0.2, 0.3, -0.3], 2)
    out = splice([a, b], [(0, 0), (1, 0)], G, PAD)
    assert list(out) == list(a)  # TRL's key order
    assert out["prompt_ids"].shape == (8, 5) and out["completion_ids"].shape == (8, 6)
    for i in range(4):  # a's rows: 2 more pads on the left, 2 more on the right
        n_p, n_c = int(a["prompt_mask"][i].sum()), int(a["completion_mask"][i].sum())
        assert out["prompt_ids"][i, 5 - n_p:].tolist() == a["prompt_ids"][i, 3 - n_p:].tolist()
        assert out["prompt_ids"][i, :5 - n_p].eq(PAD).all() and out["prompt_mask"][i].sum() == n_p
        assert out["prompt_mask"][i, 5 - n_p:].eq(1).all()
        assert out["completion_ids"][i, :n_c].tolist() == a["completion_ids"][i, :n_c].tolist()
        assert out["completion_mask"][i, n_c:].eq(0).all() and out["completion_ids"][i, n_c:].eq(PAD).all()
        assert out["ref_per_token_logps"][i, :4].tolist() == a["ref_per_token_logps"][i].tolist()
        assert out["ref_per_token_logps"][i, 4:].eq(0).all()
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "ref_per_token_logps"):
        assert torch.equal(out[key][4:], b[key][:4])  # the widest part is untouched
    assert out["advantages"].tolist() == pytest.approx([1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.3, -0.3])
    assert int(out["num_items_in_batch"]) == 2 + 4 + 1 + 3 + 6 + 1 + 2 + 3


def test_splice_keeps_sequence_ratios_and_refuses_unknown_keys():
    a = _part([2] * 4, [2] * 4, [0.0] * 4, 1)
    b = _part([2] * 4, [3] * 4, [0.0] * 4, 2)
    for p, ratio in ((a, 0.9), (b, 1.1)):
        p["importance_sampling_ratio"] = torch.full((4, 1), ratio)  # sequence-level: (B, 1)
        p["tool_mask"] = torch.ones_like(p["completion_mask"])
    out = splice([a, b], [(1, 0), (0, 0)], G, PAD)
    assert out["importance_sampling_ratio"].shape == (8, 1)
    assert out["tool_mask"].shape == (8, 3) and out["tool_mask"].eq(1).all()  # TRL pads tool_mask with 1
    a["pixel_values"] = b["pixel_values"] = torch.zeros(1)
    with pytest.raises(ValueError, match="pixel_values"):
        splice([a, b], [(0, 0)], G, PAD)


def test_batch_scaled_advantages_are_trls_on_the_spliced_batch():
    """TRL's scale_rewards=batch: (r - group mean) / (nanstd(all rewards) + 1e-4)."""
    from trl.trainer.utils import nanstd

    def trl_batch(r):
        centered = r - r.view(-1, G).mean(1).repeat_interleave(G)
        return centered / (nanstd(r) + 1e-4)

    r1 = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    r2 = torch.tensor([0.0, 0.0, 0.0, 2.0, 3.0, 3.0, 3.0, 3.0])
    kept = torch.cat([r1[:4], r2[:4]])
    adv = torch.cat([trl_batch(r1)[:4], trl_batch(r2)[:4]])
    pass_std = torch.cat([nanstd(r1).expand(4), nanstd(r2).expand(4)])
    scaled = rescale_batch_advantages(adv, pass_std, float(nanstd(kept)))
    assert scaled.tolist() == pytest.approx(trl_batch(kept).tolist(), rel=1e-5)


def test_fresh_rows_are_seeded_per_step_and_skip_the_steps_prompts():
    from datasets import Dataset

    ds = Dataset.from_list([{"prompt": f"p{i}", "answer": str(i)} for i in range(6)])
    take = lambda it, n: [next(it)["prompt"] for _ in range(n)]  # noqa: E731
    first = take(fresh_rows(ds, 0, 3, {"p0", "p1"}), 4)
    assert first == take(fresh_rows(ds, 0, 3, {"p0", "p1"}), 4)  # resumable: same draw
    assert sorted(first) == ["p2", "p3", "p4", "p5"]
    assert take(fresh_rows(ds, 0, 4, set()), 6) != take(fresh_rows(ds, 0, 3, set()), 6)
    more = take(fresh_rows(ds, 0, 3, {"p0", "p1"}), 9)  # pool exhausted: repeats, no stall
    assert more[:4] == first and set(more[4:]) <= {"p0", "p1"}


def test_more_than_one_process_is_refused():
    cfg = config_from_dict({"dynamic_sampling": {"enabled": True}})
    two = types.SimpleNamespace(accelerator=types.SimpleNamespace(num_processes=2))
    with pytest.raises(ValueError, match="train.num_processes: 1"):
        dynamic_sampler(cfg, two)
    assert dynamic_sampler(config_from_dict({}), two) is None  # off: nothing to refuse


# ----------------------------------------------------------------------------- real steps


def _flat_reward(monkeypatch, flat: set[str]):
    """`score`: the same reward for every completion of a problem in `flat` (a group that
    teaches nothing), a spread of 0, 0.25, 0.5, 0.75 otherwise."""
    from grpo_core.verify import rewards

    def score(completions, problem_id, **kw):
        return [1.0 if pid in flat else 0.25 * (i % G) for i, pid in enumerate(problem_id)]

    monkeypatch.setitem(rewards.REWARDS, "score", score)


def _cfg(enabled=True, skip_update_below=None, **grpo):
    base = {"max_steps": 2, "save_steps": 100, "max_completion_length": 6,
            "per_device_train_batch_size": 4 * G, "num_generations": G, "learning_rate": 1e-3}
    return config_from_dict({"grpo": {**base, **grpo}, "rewards": {"funcs": ["score"]},
                             "rounds": {"skip_update_below": skip_update_below},
                             "dynamic_sampling": {"enabled": enabled, "max_regenerations": 3}})


def _trained_groups(rows):
    return [rows[i:i + G] for i in range(0, len(rows), G)]


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_uninformative_groups_are_dropped_and_refilled(scale, tiny_model_path, tmp_path, monkeypatch):
    problems = generate_problems("train", 24, levels=[1])
    _flat_reward(monkeypatch, {p.id for p in problems[::2]})  # half the pool teaches nothing
    steps: dict[int, list] = {}
    result = run_grpo_round(tiny_model_path, problems, _cfg(scale_rewards=scale), tmp_path / "r",
                            "r1_zero", rollout_sink=lambda step, rows: steps.setdefault(step, []).append(rows))
    assert result.steps == 2 and len(result.history) == 2
    for h in result.history:
        assert set(METRICS) <= set(h)
        # the trained batch: 4 groups (one generation batch), whatever was generated
        assert h["dynamic_sampling/completions_generated"] / G - h["dynamic_sampling/groups_dropped"] == 4
    assert any(h["dynamic_sampling/groups_dropped"] > 0 for h in result.history)
    assert any(h["dynamic_sampling/completions_generated"] > 4 * G for h in result.history)

    # once a step, numbered as the logs number it
    assert sorted(steps) == [h["step"] for h in result.history] == [1, 2]
    assert all(len(calls) == 1 for calls in steps.values())
    rows = [r for calls in steps.values() for r in calls[0]]
    assert len(rows) == sum(h["dynamic_sampling/completions_generated"] for h in result.history)
    for h, (step, calls) in zip(result.history, sorted(steps.items())):
        trained = [r for r in calls[0] if r["trained"]]
        assert len(trained) == 4 * G
        assert all(len({r["problem_id"] for r in g}) == 1 for g in _trained_groups(trained))  # whole groups
        good = sum(len({r["reward"] for r in g}) > 1 for g in _trained_groups(trained))
        assert h["dynamic_sampling/informative_share"] == good / 4
        if good < 4:  # only when the cap was hit
            assert h["dynamic_sampling/passes"] == 4
        # the advantages trained on are TRL's, over the trained batch
        rewards = torch.tensor([r["reward"] for r in trained])
        centered = rewards - rewards.view(-1, G).mean(1).repeat_interleave(G)
        std = rewards.view(-1, G).std(1).repeat_interleave(G) if scale == "group" else rewards.std()
        assert [r["advantage"] for r in trained] == pytest.approx((centered / (std + 1e-4)).tolist(),
                                                                  rel=1e-4, abs=1e-5)
    dropped = [r for r in rows if not r["trained"]]
    assert dropped and all(len({r["reward"] for r in g}) == 1 for g in _trained_groups(dropped))


def test_cap_trains_on_what_it_has(tiny_model_path, tmp_path, monkeypatch):
    problems = generate_problems("train", 8, levels=[1])
    _flat_reward(monkeypatch, {p.id for p in problems})  # nothing teaches
    result = run_grpo_round(tiny_model_path, problems, _cfg(max_steps=1), tmp_path / "r", "r1_zero")
    h = result.history[0]
    assert result.steps == 1 and h["dynamic_sampling/passes"] == 4  # 1 + max_regenerations
    assert h["dynamic_sampling/completions_generated"] == 4 * 4 * G
    assert h["dynamic_sampling/groups_dropped"] == 12 and h["dynamic_sampling/informative_share"] == 0.0


def test_off_and_on_with_nothing_to_drop_train_exactly_as_before(tiny_model_path, tmp_path, monkeypatch):
    """Every group informative: on generates once and returns TRL's batch untouched, so the
    round is the same as with dynamic sampling off, metric for metric; off logs no
    dynamic_sampling keys."""
    problems = generate_problems("train", 8, levels=[1])
    _flat_reward(monkeypatch, set())
    off = run_grpo_round(tiny_model_path, problems, _cfg(enabled=False), tmp_path / "off", "r1_zero")
    on = run_grpo_round(tiny_model_path, problems, _cfg(enabled=True), tmp_path / "on", "r1_zero")
    assert not any(k.startswith("dynamic_sampling/") for h in off.history for k in h)
    assert all(h["dynamic_sampling/passes"] == 1 for h in on.history)
    drop = ("dynamic_sampling/", "step_time", "throughput/")  # step_time, throughput/: wall clock
    strip = [[{k: v for k, v in h.items() if not k.startswith(drop)} for h in r.history] for r in (off, on)]
    assert strip[0] == strip[1]
    assert {k for h in off.history for k in h} == {k for h in on.history for k in h} - set(METRICS)


def test_normalize_then_sum_is_refused_before_training(tiny_model_path, tmp_path, monkeypatch):
    _flat_reward(monkeypatch, set())
    cfg = _cfg(multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="sum_then_normalize"):
        run_grpo_round(tiny_model_path, generate_problems("train", 8, levels=[1]), cfg,
                       tmp_path / "r", "r1_zero")
    assert not (tmp_path / "r" / "final").exists()


def test_skip_update_below_judges_the_trained_batch(tiny_model_path, tmp_path, monkeypatch):
    problems = generate_problems("train", 8, levels=[1])
    _flat_reward(monkeypatch, {p.id for p in problems[::2]})  # every reward <= 1
    rows = []
    result = run_grpo_round(tiny_model_path, problems, _cfg(max_steps=1, skip_update_below=5.0),
                            tmp_path / "r", "r1_zero", rollout_sink=lambda step, batch: rows.extend(batch))
    assert any(f.code == "skipped_updates" and f.summary.startswith("skipped 1 updates")
               for f in result.findings), result.findings
    assert all(r["advantage"] == 0.0 for r in rows if r["trained"])
