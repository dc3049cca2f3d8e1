"""Every shipped YAML validates; broken configs fail with one message naming the field."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.config import ConfigError, PipelineConfig, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
YAMLS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert len(YAMLS) >= 6


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_validates(path):
    cfg = load_config(path)
    assert isinstance(cfg, PipelineConfig)
    assert cfg.model.name_or_path


def test_defaults_are_the_papers():
    g = PipelineConfig().grpo
    assert (g.num_generations, g.beta, g.learning_rate, g.loss_type) == (8, 0.04, 1e-6, "grpo")
    assert g.scale_rewards == "group"
    assert PipelineConfig().filter.band == (0.3, 0.7)


def test_recipes_differ_only_in_sft_and_label():
    r1 = load_config(ROOT / "configs/recipes/r1_zero.yaml").model_dump()
    sg = load_config(ROOT / "configs/recipes/sft_grpo.yaml").model_dump()
    for section in ("data", "filter", "grpo", "rounds", "rewards", "eval", "model", "rollout", "sft"):
        assert r1[section] == sg[section], section
    assert not r1["sft_stage"]["enabled"] and sg["sft_stage"]["enabled"]


BROKEN = [
    ({"grpo": {"bogus": 1}}, "grpo.bogus"),
    ({"nope": {}}, "nope"),
    ({"grpo": {"num_generations": 1}}, "grpo.num_generations"),
    ({"grpo": {"beta": -0.1}}, "grpo.beta"),
    ({"grpo": {"beta": "high"}}, "grpo.beta"),
    ({"grpo": {"loss_type": "ppo"}}, "grpo.loss_type"),
    ({"filter": {"band": [0.8, 0.2]}}, "filter.band"),
    ({"filter": {"band": [0.1, 1.5]}}, "filter.band"),
    ({"filter": {"k": 0}}, "filter.k"),
    ({"model": {"name_or_path": None}}, "model.name_or_path"),
    ({"model": {"template": "alpaca"}}, "model.template"),
    ({"rewards": {"funcs": ["accuracy", "vibes"]}}, "rewards"),
    ({"rewards": {"funcs": ["accuracy"], "weights": [1.0, 2.0]}}, "rewards"),
    ({"rewards": {"funcs": []}}, "rewards"),
    ({"rewards": {"length": {"min_tokens": 900, "max_tokens": 100}}}, "rewards.length"),
    ({"eval": {"top_p": 0}}, "eval.top_p"),
    ({"eval": {"samples": 4, "primary_metric": "avg@8"}}, "eval"),
    ({"rollout": {"backend": "tgi"}}, "rollout.backend"),
    ({"data": {"train": [{"limit": 3}]}}, "data.train.0.source"),
    ({"rounds": {"kl_schedule": {"kind": "exp"}}}, "rounds.kl_schedule.kind"),
    ({"rounds": {"count": 0}}, "rounds.count"),
    ({"algorithm": {"name": "a2c"}}, "algorithm.name"),
    ({"in_round_eval": {"every": 0}}, "in_round_eval.every"),
    ({"sft_stage": {"max_examples": 0}}, "sft_stage.max_examples"),
    # a generation batch must hold whole groups: 5 completions x 1 process x 1 pass, G 8
    ({"grpo": {"per_device_train_batch_size": 5}}, "grpo.per_device_train_batch_size"),
    ({"grpo": {"per_device_train_batch_size": 0}}, "grpo.per_device_train_batch_size"),
    ({"grpo": {"per_device_train_batch_size": 4, "steps_per_generation": 3}},
     "grpo.per_device_train_batch_size"),
    ({"grpo": {"per_device_train_batch_size": 4}, "train": {"num_processes": 3}},
     "grpo.per_device_train_batch_size"),
    ({"grpo": {"generation_batch_size": 48}, "train": {"num_processes": 4}},
     "grpo.generation_batch_size"),
    ({"grpo": {"generation_batch_size": 64, "steps_per_generation": 2}}, "grpo.generation_batch_size"),
]


@pytest.mark.parametrize("tree,field", BROKEN, ids=[f for _, f in BROKEN])
def test_broken_config_names_the_field(tree, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict(tree)
    assert err.value.field.startswith(field)
    assert "\n" not in str(err.value)


def test_override_parses_yaml_values():
    cfg = config_from_dict({}, ["grpo.beta=0.02", "filter.band=[0.2, 0.8]", "sft_stage.enabled=true"])
    assert cfg.grpo.beta == 0.02 and cfg.filter.band == (0.2, 0.8) and cfg.sft_stage.enabled


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_extends_merges_and_detects_cycles(tmp_path):
    (tmp_path / "a.yaml").write_text("grpo: {beta: 0.1, max_steps: 3}\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\ngrpo: {beta: 0.2}\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert (cfg.grpo.beta, cfg.grpo.max_steps) == (0.2, 3)
    (tmp_path / "c.yaml").write_text("extends: d.yaml\n")
    (tmp_path / "d.yaml").write_text("extends: c.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "c.yaml")


def test_hash_is_stable_and_sensitive():
    assert PipelineConfig().hash() == PipelineConfig().hash()
    assert PipelineConfig().hash() != config_from_dict({}, ["grpo.beta=0.05"]).hash()


@pytest.mark.parametrize("args", [
    ["config", "show", "--set", "grpo.beta=-1"],
    ["config", "show", "--set", "grpo.typo=1"],
    ["config", "show", "configs/does-not-exist.yaml"],
    ["config", "show", "--set", "novalue"],
    ["config", "show", "configs/models/qwen2.5-0.5b-instruct.yaml", "--set",
     "grpo.generation_batch_size=100"],
    ["config", "show", "--set", "grpo.rounds=2"],
])
def test_cli_config_errors_exit_2_with_one_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("GRPO_WORKDIR", str(tmp_path / "ws"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: config error:"), result.output
    assert not (tmp_path / "ws").exists()  # nothing created before validation


def test_cli_config_show_prints_resolved_yaml(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, ["config", "show", "configs/recipes/sft_grpo.yaml"])
    assert result.exit_code == 0
    assert "recipe: sft_grpo" in result.output and "primary_metric: avg@8" in result.output
