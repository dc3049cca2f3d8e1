"""`project.recipes`: one config names the recipes `grpo run` runs and compares (as the
main job compares the two shipped ones), e.g. configs/models/smollm2-135m-cpu.yaml."""
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from flows.recipes import expand_recipes
from grpo_core.config import PipelineConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "configs/models/smollm2-135m-cpu.yaml"


def test_a_config_without_recipes_is_one_run():
    cfg = PipelineConfig()
    assert expand_recipes(cfg) == [cfg]


def test_each_named_recipe_is_the_config_with_its_sft_stage_label_and_overrides_changed():
    cfg = load_config(SMOLLM2)
    assert cfg.project.recipes == ["sft_grpo", "r1_zero"]
    runs = expand_recipes(cfg)
    assert [(c.project.recipe, c.sft_stage.enabled) for c in runs] == \
        [("sft_grpo", True), ("r1_zero", False)]
    a, b = (c.model_dump() for c in runs)
    for section in ("model", "data", "rollout", "sft", "rounds", "eval"):
        assert a[section] == b[section], section
    # project.recipe_overrides.r1_zero: the zero-RL reward at T=0.7; nothing else differs
    changed = {("rewards", "extraction"): ("strict", "flexible"),
               ("filter", "temperature"): (1.0, 0.7), ("grpo", "temperature"): (1.0, 0.7),
               ("grpo", "max_completion_length"): (32, 48)}
    for (section, key), values in changed.items():
        assert (a[section][key], b[section][key]) == values
    for section in ("rewards", "filter", "grpo"):
        keys = {k for s, k in changed if s == section}
        assert {k: v for k, v in a[section].items() if k not in keys} == \
            {k: v for k, v in b[section].items() if k not in keys}, section
    # each is a plain one-recipe config (its own cache key and MLflow parent run)
    assert all(c.project.recipes == [] for c in runs)
    assert runs[0].hash() != runs[1].hash()
    assert cfg.project.recipes == ["sft_grpo", "r1_zero"]  # the loaded config is not changed


def test_an_unknown_recipe_exits_2_naming_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("GRPO_WORKDIR", str(tmp_path / "ws"))
    result = CliRunner().invoke(app, ["run", str(SMOLLM2), "--set", "project.recipes=[r1_zero,ppo]"])
    assert result.exit_code == 2, result.output
    assert "project.recipes" in result.output, result.output
    assert not (tmp_path / "ws").exists()
