"""`grpo.trl` / `sft.trl`: any field of the installed TRL config reaches TRL; unknown keys
and keys the pipeline sets from its own fields are config errors (exit 2 in the CLI)."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_core.config import ConfigError, GRPOConfig, SFTConfig, config_from_dict
from grpo_core.train.trl_args import checkpointing_field

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["fixtures_models"]


def test_unknown_key_names_the_field():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"grpo": {"trl": {"no_such_field": 1}}})
    assert err.value.field == "grpo.trl.no_such_field" and "GRPOConfig" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config_from_dict({"sft": {"trl": {"no_such_field": 1}}})
    assert err.value.field == "sft.trl.no_such_field"


@pytest.mark.parametrize(("section", "key", "owner"), [
    ("grpo", "learning_rate", "grpo.learning_rate"),
    ("grpo", "beta", "grpo.beta"),
    ("grpo", "num_generations", "grpo.num_generations"),
    ("grpo", "gradient_checkpointing", "grpo.gradient_checkpointing"),
    ("grpo", "steps_per_generation", "grpo.gradient_accumulation_steps"),
    ("grpo", "bf16", "train.precision"),
    ("sft", "learning_rate", "sft.learning_rate"),
])
def test_key_set_from_a_first_class_field_names_both(section, key, owner):
    with pytest.raises(ConfigError) as err:
        config_from_dict({section: {"trl": {key: 1}}})
    assert err.value.field == f"{section}.trl.{key}" and owner in str(err.value)


def test_owned_keys_are_what_the_pipeline_sets(tmp_path):
    """TRL_OWNED (what grpo.trl refuses) is exactly what trl_grpo_args sets from our
    config, plus the TRL fields derived from those; every one is a real TRL field."""
    import trl

    from grpo_core.train.trl_args import owned_grpo_args

    cfg = config_from_dict({})
    derived = {"steps_per_generation", "generation_batch_size", "gradient_checkpointing",
               "reward_weights", "model_init_kwargs"}
    assert set(owned_grpo_args(cfg, str(tmp_path))) | derived == set(GRPOConfig.TRL_OWNED)
    for cls, owned in ((trl.GRPOConfig, GRPOConfig.TRL_OWNED), (trl.SFTConfig, SFTConfig.TRL_OWNED)):
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(owned) <= fields, set(owned) - fields


def _args_spy():
    """A callback that keeps the TRL config object the trainer runs with."""
    from transformers import TrainerCallback

    class Spy(TrainerCallback):
        args = None

        def on_train_begin(self, args, state, control, **kw):
            Spy.args = args

    return Spy()


def test_values_reach_the_grpo_config_run_grpo_round_builds(tiny_model_path, tmp_path):
    from trl import GRPOConfig as TRLGRPOConfig

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    cfg = config_from_dict({"grpo": {
        "max_steps": 1, "prompts_per_step": 2, "num_generations": 2, "max_completion_length": 4,
        "trl": {"max_grad_norm": 0.5, "lr_scheduler_type": "constant",
                "top_k": 5}}})
    spy = _args_spy()
    result = run_grpo_round(tiny_model_path, generate_problems("train", 2, levels=[1]), cfg,
                            tmp_path / "r", "r1_zero", extra_callbacks=[spy])
    assert result.steps == 1
    args = spy.args
    assert isinstance(args, TRLGRPOConfig)
    assert args.max_grad_norm == 0.5 and args.top_k == 5
    assert args.lr_scheduler_type == "constant"
    # first-class fields still decide theirs; the defaults hold without an override
    assert args.num_generations == 2 and args.save_total_limit == 2
    assert getattr(args, checkpointing_field()) is False  # builtin:* default
    on = config_from_dict({"model": {"name_or_path": "some/hub-model"}})
    assert owned_args(on, tmp_path)[checkpointing_field()] is True  # real models: on
    off = config_from_dict({"model": {"name_or_path": "some/hub-model"}},
                           ["grpo.gradient_checkpointing=false"])
    assert owned_args(off, tmp_path)[checkpointing_field()] is False


def owned_args(cfg, tmp_path):
    from grpo_core.train.trl_args import owned_grpo_args

    return owned_grpo_args(cfg, str(tmp_path))


def test_sft_values_reach_the_sft_config(tiny_model_path, tmp_path):
    from trl import SFTConfig as TRLSFTConfig

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.sft import run_sft

    cfg = config_from_dict({"sft": {"max_steps": 1, "batch_size": 2,
                                    "trl": {"warmup_steps": 0, "max_grad_norm": 0.5}}})
    spy = _args_spy()
    result = run_sft(tiny_model_path, generate_problems("train", 4), cfg, tmp_path / "s", "r1_zero",
                     extra_callbacks=[spy])
    assert result.steps == 1 and isinstance(spy.args, TRLSFTConfig)
    assert spy.args.warmup_steps == 0 and spy.args.max_grad_norm == 0.5
    assert spy.args.lr_scheduler_type == "cosine"  # the pipeline's default, not overridden


def test_cli_exits_2_naming_an_unknown_trl_key(tmp_path):
    env = {**os.environ, "GRPO_WORKDIR": str(tmp_path / "w")}
    proc = subprocess.run([str(Path(sys.executable).parent / "grpo"), "run",
                           str(ROOT / "configs/quickstart.yaml"), "--set", "grpo.trl.no_such_field=1"],
                          check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "grpo.trl.no_such_field" in proc.stdout + proc.stderr


def test_checkpointing_goes_under_the_installed_transformers_name():
    """transformers 5.17 (the GPU image) has only `gradient_checkpointing`; newer ones add
    `activation_checkpointing` and warn on the old name: passing a name the installed
    TrainingArguments lacks is a TypeError (seen on the lent H200)."""
    @dataclasses.dataclass
    class Old:
        gradient_checkpointing: bool = True

    @dataclasses.dataclass
    class New:
        gradient_checkpointing: bool = True
        activation_checkpointing: bool = True

    assert checkpointing_field(Old) == "gradient_checkpointing"
    assert checkpointing_field(New) == "activation_checkpointing"
    from transformers import TrainingArguments

    assert checkpointing_field() in {f.name for f in dataclasses.fields(TrainingArguments)}
