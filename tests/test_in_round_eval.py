"""In-round evaluation (in_round_eval.every): the held-out slice, the best-checkpoint choice and
the early stop, and real GRPO rounds that hand on their best model.

The constructed case (an earlier checkpoint better than the last) scripts the scores only:
the round, its saving and the choice are real TRL steps on builtin:proxy-qwen2 (a
bf16-stored Qwen2 with multi-token tags and a chat template)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train import grpo as grpo_mod
from grpo_core.train.grpo import run_grpo_round
from grpo_core.train.in_round_eval import BEST_DIR, METRIC, BestTracker, split_held_out

pytest_plugins = ["fixtures_models"]


def test_tracker_picks_the_best_and_stops_after_patience_falls():
    t = BestTracker(patience=2)
    assert t.observe(5, 0.2) == (True, False)
    assert t.observe(10, 0.5) == (True, False)
    assert t.observe(15, 0.5) == (False, False)  # a tie keeps the earlier step
    assert t.observe(20, 0.1) == (False, True)  # second evaluation in a row below the best
    assert (t.best_step, t.best_score) == (10, 0.5)
    assert "chose step 10 (0.500) over the last step 20 (0.100)" in t.choice(20)
    again = BestTracker.from_json(json.loads(json.dumps(t.to_json())), patience=2)
    assert again == t
    assert BestTracker().observe(1, 0.0) == (True, False)
    never = BestTracker(patience=None)
    never.observe(1, 1.0)
    assert [never.observe(s, 0.0)[1] for s in range(2, 50)] == [False] * 48


def test_held_out_slice_is_fixed_disjoint_and_order_free():
    pool = generate_problems("train", 40, levels=[1, 2])
    train, held = split_held_out(pool, 8, seed=3)
    assert len(held) == 8 and len(train) == 32
    assert not {p.id for p in train} & {p.id for p in held}
    _, held_reversed = split_held_out(list(reversed(pool)), 8, seed=3)
    assert {p.id for p in held_reversed} == {p.id for p in held}
    assert {p.id for p in split_held_out(pool, 8, seed=4)[1]} != {p.id for p in held}
    with pytest.raises(ValueError, match="in_round_eval.problems"):
        split_held_out(pool, 40, seed=3)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_round_hands_on_the_earlier_better_checkpoint(proxy_model_path, tmp_path, monkeypatch):
    """Scores scripted 0.2, 0.6, 0.1 at steps 1-3: the round's model is step 2's, saved in
    the checkpoint's stored dtype (bf16) with its tokenizer, and the report line names it."""
    scripted = iter([0.2, 0.6, 0.1])
    seen: dict[int, dict] = {}

    class ScriptedEvaluator(grpo_mod.InRoundEvaluator):
        def __call__(self, model, tokenizer):
            seen[len(seen) + 1] = _weights(model)
            return next(scripted)

    monkeypatch.setattr(grpo_mod, "InRoundEvaluator", ScriptedEvaluator)
    # Long enough completions that the proxy's samples differ in format: every step moves.
    cfg = config_from_dict({"model": {"template": "chat"}, "grpo": {
        "max_steps": 3, "save_steps": 10, "max_completion_length": 48, "per_device_train_batch_size": 8,
        "num_generations": 4, "learning_rate": 1e-4, "gradient_accumulation_steps": 2},
        "in_round_eval": {"every": 1, "problems": 4}})
    out = tmp_path / "round"
    result = run_grpo_round(proxy_model_path, generate_problems("train", 12, levels=[1]), cfg,
                            out, "chat")
    assert result.steps == 3 and result.best_step == 2
    assert result.output_dir == str(out / BEST_DIR)
    assert [s for s, _ in result.in_round_evals] == [1, 2, 3]
    assert any(f.code == "in_round_choice" and "chose step 2 (0.600) over the last step 3 (0.100)"
               in f.summary for f in result.findings)
    assert [h.get(METRIC) for h in result.history] == [0.2, 0.6, 0.1]
    assert result.in_round_protocol and len(result.in_round_protocol) >= 12
    from transformers import AutoModelForCausalLM, AutoTokenizer

    best = AutoModelForCausalLM.from_pretrained(result.output_dir, dtype=torch.float32)
    assert json.loads((out / BEST_DIR / "config.json").read_text())["dtype"] == "bfloat16"
    AutoTokenizer.from_pretrained(result.output_dir)  # the tokenizer is there
    stored = {k: v for k, v in best.state_dict().items()}
    for name in ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight"):
        step2 = seen[2][name].to(torch.bfloat16).float()
        assert torch.equal(stored[name], step2), name
    assert not all(torch.equal(seen[2][k], seen[3][k]) for k in seen[2])  # step 3 moved on
    assert not all(torch.equal(stored[k], seen[3][k].to(torch.bfloat16).float()) for k in stored)


def test_real_in_round_eval_on_held_out_problems(tiny_model_path, tmp_path):
    """The real evaluator: greedy strict accuracy logged per evaluation (steps 2 and the
    last, 3), the held-out problems never trained on, patience stopping a falling round."""
    rows: list[dict] = []
    pool = generate_problems("train", 14, levels=[1])
    cfg = config_from_dict({"grpo": {
        "max_steps": 3, "save_steps": 10, "max_completion_length": 8, "per_device_train_batch_size": 8,
        "num_generations": 4, "learning_rate": 1e-3}, "in_round_eval": {"every": 2, "problems": 6}})
    result = run_grpo_round(tiny_model_path, pool, cfg, tmp_path / "r", "r1_zero",
                            rollout_sink=lambda step, batch: rows.extend(batch))
    assert [s for s, _ in result.in_round_evals] == [2, 3]
    assert all(0.0 <= v <= 1.0 for _, v in result.in_round_evals)
    logged = {h["step"]: h[METRIC] for h in result.history if METRIC in h}
    assert logged == dict(result.in_round_evals)
    _, held = split_held_out(pool, 6, cfg.project.seed)
    assert {r["problem_id"] for r in rows}.isdisjoint({p.id for p in held})
    assert Path(result.output_dir).is_dir() and result.best_step in (2, 3)


def test_patience_stops_the_round(tiny_model_path, tmp_path, monkeypatch):
    scripted = iter([0.5, 0.4, 0.3, 0.9, 0.9])

    class Falling(grpo_mod.InRoundEvaluator):
        def __call__(self, model, tokenizer):
            return next(scripted)

    monkeypatch.setattr(grpo_mod, "InRoundEvaluator", Falling)
    cfg = config_from_dict({"grpo": {
        "max_steps": 5, "save_steps": 10, "max_completion_length": 8, "per_device_train_batch_size": 8,
        "num_generations": 4}, "in_round_eval": {"every": 1, "problems": 2, "patience": 2}})
    result = run_grpo_round(tiny_model_path, generate_problems("train", 8, levels=[1]), cfg,
                            tmp_path / "r", "r1_zero")
    assert result.steps == 3 and result.best_step == 1
    assert any(f.code == "in_round_stopped" and "stopped at step 3" in f.summary
               for f in result.findings)
