"""algorithm.name: ppo (critic, GAE), rloo (TRL's RLOOTrainer), grpo_vhead (value head in
the baseline) next to grpo. The pure steps (GAE, clipped value loss, the mixed baseline),
the refusals at load, then real TRL steps on a tiny random model: each algorithm trains 2
steps and moves the policy (ppo its value model too), and grpo_vhead with weight 0 is
plain GRPO, advantage for advantage and weight for weight."""
import types

import pytest
import torch
from safetensors.torch import load_file

from grpo_core.config import ConfigError, config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train.auxiliary import AUX_FILE, check_one_process
from grpo_core.train.grpo import run_grpo_round
from grpo_core.train.ppo import clipped_value_loss, completion_values, gae, terminal_rewards, whiten
from grpo_core.train.vhead import mixed_advantages

pytest_plugins = ["fixtures_models"]

G = 4


# ----------------------------------------------------------------------------- pure steps


def test_terminal_reward_sits_on_the_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    r = terminal_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert r.tolist() == [[0, 0, 2, 0], [-1, 0, 0, 0], [0, 0, 0, 0]]


def test_gae_is_monte_carlo_at_lambda_1_and_td_at_lambda_0():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    values = torch.tensor([[0.1, 0.4, -0.2, 9.0], [0.3, 0.5, 9.0, 9.0]])
    r = terminal_rewards(torch.tensor([1.0, 0.5]), mask)
    adv, ret = gae(r, values, mask, gamma=1.0, lam=1.0)
    # every token's return is the sequence reward; padding (values 9) never leaks in
    assert torch.allclose(ret, torch.tensor([[1.0, 1, 1, 0], [0.5, 0.5, 0, 0]]))
    assert torch.allclose(adv, (torch.tensor([[1.0], [0.5]]) - values) * mask)
    adv0, _ = gae(r, values, mask, gamma=0.9, lam=0.0)
    assert torch.allclose(adv0[0, :3], torch.tensor([0.9 * 0.4 - 0.1, 0.9 * -0.2 - 0.4, 1.0 + 0.2]))
    w = whiten(adv, mask)
    assert abs(float(w[mask.bool()].mean())) < 1e-6 and w[0, 3] == 0


def test_value_loss_clips_around_the_rollout_values():
    old = torch.zeros(1, 2)
    ret = torch.ones(1, 2)
    mask = torch.ones(1, 2)
    # V moved past the clip towards the return: the clipped (worse) error counts
    loss, frac = clipped_value_loss(torch.tensor([[0.5, 0.1]]), old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.5 * ((1 - 0.2) ** 2 + 0.9 ** 2) / 2)
    assert frac.item() == 0.5
    assert completion_values(torch.arange(6.0).view(1, 6), 2).tolist() == [[1, 2, 3, 4]]


def test_head_correction_is_zero_at_weight_0_and_scaled_otherwise():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, float("nan"), 0.0, 0.0, 0.0])
    trl = torch.randn(12)
    pred = torch.tensor([0.2, 0.6, 0.0])
    assert torch.equal(mixed_advantages(trl, rewards, pred, G, 0.0, "group"), trl)
    out = mixed_advantages(trl, rewards, pred, G, 0.5, "group")
    std = rewards[:4].std()
    assert torch.allclose(out[:4], trl[:4] + 0.5 * (0.5 - 0.2) / (std + 1e-4))
    # an all-solved group: GRPO gives it nothing; the head's correction uses the batch std
    batch_std = rewards[~rewards.isnan()].std()
    assert torch.allclose(out[4:8], trl[4:8] + 0.5 * (1.0 - 0.6) / (batch_std + 1e-4))
    assert out[8] == trl[8]  # unscorable: TRL's 0 stays
    none = mixed_advantages(trl, rewards, pred, G, 1.0, "none")
    assert torch.allclose(none[:4], trl[:4] + (0.5 - 0.2))


# ----------------------------------------------------------------------------- refusals


ON = {"enabled": True}


@pytest.mark.parametrize(("algorithm", "tree", "field", "words"), [
    ("ppo", {"dynamic_sampling": ON}, "dynamic_sampling", "ppo"),
    ("rloo", {"dynamic_sampling": ON}, "dynamic_sampling", "rloo"),
    ("rloo", {"grpo": {"loss_type": "dapo"}}, "grpo.loss_type", "RLOOTrainer"),
    ("rloo", {"grpo": {"top_entropy_quantile": 0.5}}, "grpo.top_entropy_quantile", "RLOOConfig"),
    ("grpo_vhead", {"grpo": {"num_generations": 1}}, "grpo.num_generations", "ppo"),
    ("a2c", {}, "algorithm.name", "grpo_vhead"),
])
def test_unsupported_combinations_are_refused_at_load(algorithm, tree, field, words):
    with pytest.raises(ConfigError, match=words) as err:
        config_from_dict({"algorithm": {"name": algorithm}, **tree})
    assert err.value.field == field


def test_ppo_takes_one_sample_per_prompt_and_vhead_takes_dynamic_sampling():
    ppo = config_from_dict({"algorithm": {"name": "ppo"}, "grpo": {"num_generations": 1}})
    assert ppo.grpo.num_generations == 1
    config_from_dict({"algorithm": {"name": "grpo_vhead"}, "dynamic_sampling": ON})
    # an RLOOConfig field passes under rloo
    config_from_dict({"algorithm": {"name": "rloo"}, "grpo": {"reward_clip_range": [-1.0, 1.0]}})
    with pytest.raises(ConfigError, match="scale_rewards"):
        config_from_dict({"algorithm": {"name": "rloo"}, "grpo": {"normalize_advantages": True}})


def test_modules_beside_the_policy_need_one_process():
    two = types.SimpleNamespace(accelerator=types.SimpleNamespace(num_processes=2))
    with pytest.raises(ValueError, match="train.num_processes: 1"):
        check_one_process(two, "ppo")


# ----------------------------------------------------------------------------- real steps


ALGORITHM_FIELDS = ("vhead_weight", "gae_gamma", "gae_lambda", "value_clip", "value_loss_coef",
                    "value_learning_rate", "vhead_learning_rate")


def _cfg(algorithm: str, **grpo):
    base = {"max_steps": 2, "save_steps": 100, "max_completion_length": 8,
            "per_device_train_batch_size": 2 * grpo.get("num_generations", G),  # 2 prompts
            "num_generations": G, "learning_rate": 1e-3}
    algo = {"name": algorithm, **{k: grpo.pop(k) for k in list(grpo) if k in ALGORITHM_FIELDS}}
    return config_from_dict({"grpo": {**base, **grpo}, "algorithm": algo,
                             "rewards": {"funcs": ["accuracy", "format", "tag_count"],
                                         "weights": [1.0, 1.0, 0.5]}})


def _run(model, tmp_path, name, cfg, problems=None):
    """(result, rollout rows per step, the trainer, its auxiliary modules' weights at start)."""
    steps: dict[int, list] = {}
    held: dict = {}

    def hook(trainer):
        held["trainer"] = trainer
        held["aux0"] = {k: {n: t.detach().clone() for n, t in m.state_dict().items()}
                        for k, (m, _) in getattr(trainer, "aux", {}).items()}

    result = run_grpo_round(model, problems or generate_problems("train", 8, levels=[1]), cfg,
                            tmp_path / name, "r1_zero", trainer_hook=hook,
                            rollout_sink=lambda step, rows: steps.setdefault(step, []).extend(rows))
    return result, steps, held["trainer"], held["aux0"]


def _weights(path) -> dict:
    return load_file(f"{path}/model.safetensors")


def _moved(before: dict, after: dict) -> bool:
    return any(not torch.equal(before[k], after[k].to(before[k])) for k in before)


# The algorithms trained two steps below; plain grpo trains in test_vhead_weight_0_is_plain_grpo_exactly.
TRAINED = [("ppo", {}), ("ppo", {"num_generations": 1}), ("rloo", {}),
           ("grpo_vhead", {"vhead_weight": 0.5})]


@pytest.mark.parametrize(("algorithm", "extra"), TRAINED)
def test_each_algorithm_trains_two_steps_and_moves_the_weights(algorithm, extra, tiny_model_path, tmp_path):
    from grpo_core.train.algorithms import ALGORITHMS

    result, steps, trainer, aux0 = _run(tiny_model_path, tmp_path, algorithm, _cfg(algorithm, **extra))
    assert isinstance(trainer, ALGORITHMS[algorithm].trainer)  # algorithm.name chose the path
    assert result.steps == 2 and len(result.history) == 2 and not result.stopped_early
    assert _moved(_weights(tiny_model_path), _weights(result.output_dir))
    g = extra.get("num_generations", G)
    assert sorted(steps) == [1, 2] and all(len(rows) == 2 * g for rows in steps.values())
    assert all(r["advantage"] is not None for rows in steps.values() for r in rows)
    for h in result.history:  # every training path measures its steps (issue 23 item 5)
        assert h["throughput/gen_tokens_per_s"] > 0 and h["throughput/train_tokens_per_s"] > 0
    for name, (module, _) in trainer.aux.items() if algorithm != "rloo" else ():
        now = module.state_dict()
        assert _moved(aux0[name], now), f"{name} did not train"
    if algorithm == "ppo":
        assert set(aux0) == {"value_model"}
        assert {"ppo/value_loss", "ppo/value_mean", "aux/grad_norm"} <= set(result.history[-1])
        # the value model is the policy's stack plus a scalar head, in the optimizer
        stack = sum(p.numel() for p in trainer.model.base_model.parameters())
        value = sum(p.numel() for p in trainer.value_model.parameters())
        assert value == stack + trainer.model.config.hidden_size + 1
        assert len(trainer.optimizer.param_groups) == 3
    if algorithm == "rloo":
        from trl import RLOOTrainer

        assert isinstance(trainer, RLOOTrainer)
        for rows in steps.values():  # leave-one-out: r_i minus the mean of the others
            for k in range(0, len(rows), G):
                r = [row["reward"] for row in rows[k:k + G]]
                loo = [r[i] - (sum(r) - r[i]) / (G - 1) for i in range(G)]
                # RLOO's reward holds the KL penalty too (beta x sequence KL): close, not equal
                assert [row["advantage"] for row in rows[k:k + G]] == pytest.approx(loo, abs=0.05)
    if algorithm == "grpo_vhead":
        assert {"vhead/loss", "vhead/prediction_mean"} <= set(result.history[-1])


def test_vhead_weight_0_is_plain_grpo_exactly(tiny_model_path, tmp_path):
    from grpo_core.train.algorithms import ALGORITHMS

    plain, plain_steps, plain_trainer, _ = _run(tiny_model_path, tmp_path, "grpo", _cfg("grpo"))
    assert type(plain_trainer) is ALGORITHMS["grpo"].trainer  # TRL's loss, nothing replaced
    head, head_steps, trainer, aux0 = _run(tiny_model_path, tmp_path, "vhead0",
                                           _cfg("grpo_vhead", vhead_weight=0.0))
    assert sorted(head_steps) == sorted(plain_steps) == [1, 2]  # steps count from 1
    for step in (1, 2):
        assert [r["advantage"] for r in head_steps[step]] == [r["advantage"] for r in plain_steps[step]]
        assert [r["completion"] for r in head_steps[step]] == [r["completion"] for r in plain_steps[step]]
    a, b = _weights(plain.output_dir), _weights(head.output_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _moved(aux0["vhead"], trainer.vhead.state_dict())  # the head did train, aside


def test_ppo_checkpoints_the_value_model_and_resumes(tiny_model_path, tmp_path):
    problems = generate_problems("train", 8, levels=[1])
    first, _, _, _ = _run(tiny_model_path, tmp_path, "ppo", _cfg("ppo", save_steps=1), problems)
    ckpt = tmp_path / "ppo" / "checkpoint-2"
    saved = torch.load(ckpt / AUX_FILE.format(name="value_model"), weights_only=True)
    from transformers import TrainerCallback

    at_start: dict = {}

    def hook(trainer):
        class Snapshot(TrainerCallback):  # after the Trainer loads the checkpoint
            def on_train_begin(self, args, state, control, **kw):
                at_start.update({k: v.clone() for k, v in trainer.value_model.state_dict().items()})

        trainer.add_callback(Snapshot())

    more = run_grpo_round(tiny_model_path, problems, _cfg("ppo", save_steps=1, max_steps=3),
                          tmp_path / "ppo", "r1_zero", resume=True, trainer_hook=hook)
    assert first.steps == 2 and more.steps == 3
    assert saved.keys() == at_start.keys() and all(torch.equal(saved[k], at_start[k]) for k in saved)
    assert (tmp_path / "ppo" / "checkpoint-3" / AUX_FILE.format(name="value_model")).is_file()


def test_every_configurable_algorithm_has_a_training_path():
    """algorithm.name's choices are the registry's names (grpo_core.train.algorithms), and
    each one trains in a test of this file (TRAINED, and plain grpo)."""
    import typing

    from grpo_core.train.algorithms import ALGORITHMS

    section = config_from_dict({}).algorithm
    choices = typing.get_args(type(section).model_fields["name"].annotation)
    assert set(choices) == set(ALGORITHMS)
    assert {name for name, _ in TRAINED} | {"grpo"} == set(ALGORITHMS)
