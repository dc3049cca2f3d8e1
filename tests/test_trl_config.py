"""`grpo:` / `sft:` are TRL's own GRPOConfig / SFTConfig fields: any field of the installed
class set in YAML reaches the live trainer's args; unknown keys, keys the pipeline sets
itself and keys of the old schema are config errors naming the field (exit 2 in the CLI)."""
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_core.config import (
    ConfigError,
    GRPOSection,
    SFTSection,
    config_from_dict,
    load_config,
    trl_fields,
)
from grpo_core.config.trl_sections import MOVED, PIPELINE_SET
from grpo_core.train.trl_args import checkpointing_field, trl_grpo_args

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["fixtures_models"]


def test_unknown_key_names_the_field():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"grpo": {"no_such_field": 1}})
    assert err.value.field == "grpo.no_such_field" and "GRPOConfig" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config_from_dict({"sft": {"no_such_field": 1}})
    assert err.value.field == "sft.no_such_field" and "SFTConfig" in str(err.value)


@pytest.mark.parametrize(("old", "new"), [
    ("grpo.rounds", "rounds.count"),
    ("grpo.trl", "grpo"),
    ("grpo.prompts_per_step", "grpo.per_device_train_batch_size"),
    ("grpo.per_device_micro_batch", "grpo.per_device_train_batch_size"),
    ("grpo.gradient_checkpointing", "grpo.activation_checkpointing"),
    ("grpo.algorithm", "algorithm.name"),
    ("grpo.gae_lambda", "algorithm.gae_lambda"),
    ("grpo.kl_schedule", "rounds.kl_schedule"),
    ("grpo.kl_ceiling", "rounds.kl_ceiling"),
    ("grpo.dynamic_sampling", "dynamic_sampling"),
    ("grpo.eval_every", "in_round_eval.every"),
    ("grpo.collapse_patience", "diagnosis.collapse_patience"),
    ("grpo.diagnosis", "diagnosis"),
    ("grpo.vllm_server_launch", "train.vllm_server_launch"),
    ("sft.enabled", "sft_stage.enabled"),
    ("sft.batch_size", "sft.per_device_train_batch_size"),
    ("sft.trl", "sft"),
])
def test_old_keys_name_their_new_place(old, new):
    section, key = old.split(".")
    with pytest.raises(ConfigError) as err:
        config_from_dict({section: {key: {} if key in ("trl", "kl_schedule", "dynamic_sampling",
                                                       "diagnosis") else 1}})
    assert err.value.field == old and f"moved to {new}" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "source"), [
    ("grpo.output_dir", "checkpoint folder"), ("grpo.seed", "project.seed"),
    ("grpo.bf16", "train.precision"), ("grpo.reward_weights", "rewards.weights"),
    ("grpo.report_to", "tracking"), ("sft.completion_only_loss", "SFT data"),
])
def test_keys_the_pipeline_sets_name_their_source(key, source):
    with pytest.raises(ConfigError) as err:
        config_from_dict({}, [f"{key}=1"])
    assert err.value.field == key and source in str(err.value)


def test_declared_and_refused_keys_are_trl_fields():
    """The pipeline's defaults are set on TRL's names; what it refuses is TRL's too."""
    for name, section in (("grpo", GRPOSection), ("sft", SFTSection)):
        fields = trl_fields(section.TRL_CLASS)
        declared = set(section.model_fields) - {"activation_checkpointing"}
        assert declared <= fields, declared - fields
        assert checkpointing_field() in fields
        assert set(PIPELINE_SET[name]) <= fields, set(PIPELINE_SET[name]) - fields
        assert not set(MOVED[name]) & set(section.model_fields)


def test_pipeline_defaults_layered_on_trls(tmp_path):
    import trl

    args = trl_grpo_args(config_from_dict({}), str(tmp_path))
    # the papers' values where TRL's differ
    assert (args.beta, args.loss_type, args.max_completion_length, args.logging_steps) == (0.04, "grpo", 64, 1)
    # TRL's own default where the pipeline has none
    trl_default = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False,
                                  **{checkpointing_field(): False})
    for name in ("epsilon", "top_entropy_quantile", "vllm_importance_sampling_correction",
                 "importance_sampling_level", "max_grad_norm"):
        assert getattr(args, name) == getattr(trl_default, name), name


# TRL fields users ask for, each set away from its default (none needs a GPU to construct).
TRL_KNOBS = {
    "top_entropy_quantile": 0.2,  # entropy masking
    "vllm_importance_sampling_correction": False,
    "vllm_importance_sampling_mode": "token_truncate",
    "vllm_enable_sleep_mode": True,
    "loss_type": "dr_grpo",
    "mask_truncated_completions": True,
    "importance_sampling_level": "sequence",
    "epsilon_high": 0.28,
    "max_grad_norm": 0.5,
    "lr_scheduler_type": "constant",
    "top_k": 5,
}


class _Built(Exception):
    pass


def test_each_trl_field_from_yaml_reaches_the_live_trainer(tiny_model_path, tmp_path):
    """Set from YAML, read back from the trainer run_grpo_round builds (not trained)."""
    import yaml

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"grpo": {
        "max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2,
        "max_completion_length": 4, **TRL_KNOBS}}))
    cfg = load_config(path)
    seen = {}

    def hook(trainer):
        seen["args"] = trainer.args
        raise _Built

    with pytest.raises(_Built):
        run_grpo_round(tiny_model_path, generate_problems("train", 4, levels=[1]), cfg,
                       tmp_path / "r", "r1_zero", trainer_hook=hook)
    args = seen["args"]
    for name, value in TRL_KNOBS.items():
        assert getattr(args, name) == value, name
    assert args.num_generations == 2 and args.save_total_limit == 2  # pipeline defaults hold
    assert getattr(args, checkpointing_field()) is False  # builtin:* default


def test_liger_and_checkpointing_reach_trls_args(tmp_path):
    """Liger (TRL's use_liger_kernel; the kernels need a GPU) and the per-model
    checkpointing rule, on the GRPOConfig the round builds."""
    cfg = config_from_dict({}, ["grpo.use_liger_kernel=true"])
    assert trl_grpo_args(cfg, str(tmp_path)).use_liger_kernel is True
    on = config_from_dict({"model": {"name_or_path": "some/hub-model"}})
    assert getattr(trl_grpo_args(on, str(tmp_path)), checkpointing_field()) is True  # real models
    off = config_from_dict({"model": {"name_or_path": "some/hub-model"}},
                           ["grpo.activation_checkpointing=false"])
    assert getattr(trl_grpo_args(off, str(tmp_path)), checkpointing_field()) is False


def _args_spy():
    """A callback that keeps the TRL config object the trainer runs with."""
    from transformers import TrainerCallback

    class Spy(TrainerCallback):
        args = None

        def on_train_begin(self, args, state, control, **kw):
            Spy.args = args

    return Spy()


def test_sft_values_reach_the_sft_config(tiny_model_path, tmp_path):
    from trl import SFTConfig as TRLSFTConfig

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.sft import run_sft

    cfg = config_from_dict({"sft": {"max_steps": 1, "per_device_train_batch_size": 2,
                                    "warmup_steps": 0, "max_grad_norm": 0.5}})
    spy = _args_spy()
    result = run_sft(tiny_model_path, generate_problems("train", 4), cfg, tmp_path / "s", "r1_zero",
                     extra_callbacks=[spy])
    assert result.steps == 1 and isinstance(spy.args, TRLSFTConfig)
    assert spy.args.warmup_steps == 0 and spy.args.max_grad_norm == 0.5
    assert spy.args.per_device_train_batch_size == 2
    assert spy.args.lr_scheduler_type == "cosine"  # the pipeline's default, not overridden


@pytest.mark.parametrize(("override", "named"), [
    ("grpo.no_such_field=1", "grpo.no_such_field"),
    ("grpo.rounds=2", "rounds.count"),
])
def test_cli_exits_2_naming_the_key(override, named, tmp_path):
    env = {**os.environ, "GRPO_WORKDIR": str(tmp_path / "w")}
    proc = subprocess.run([str(Path(sys.executable).parent / "grpo"), "run",
                           str(ROOT / "configs/quickstart.yaml"), "--set", override],
                          check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stdout + proc.stderr


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
