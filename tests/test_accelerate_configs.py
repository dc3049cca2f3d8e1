"""Every shipped accelerate file with every shipped preset, through accelerate's and
transformers' own code (on CPU, nothing launched):

- the file resolves through `accelerate launch`'s own argument handling into the
  environment each rank gets; under that environment each preset's GRPOConfig and SFTConfig
  build (TrainingArguments reads the DeepSpeed / FSDP plugin from it);
- for the DeepSpeed files, transformers' HfTrainerDeepSpeedConfig fills the "auto" fields
  from each preset's trainer arguments and finalizes: the check that refused GRPO's
  gradient_accumulation_steps when the files fixed it at 1 (accelerate#3369).

Without DeepSpeed installed, transformers' own fill/compare methods run on the base class
they have with DeepSpeed (accelerate's HfDeepSpeedConfig); with DeepSpeed installed
(`DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed` builds on a CPU-only machine)
it runs as is.
"""
from __future__ import annotations

import copy
import os
import types
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
ACCEL = ROOT / "infra" / "accelerate"
PRESETS = sorted((ROOT / "configs" / "models").glob("*.yaml"))
FILES = sorted(ACCEL.glob("*.yaml"))
DEEPSPEED_FILES = ["zero2.yaml", "zero3.yaml"]


def _rank_env(name: str) -> dict:
    """The ACCELERATE_* variables `accelerate launch --config_file NAME` gives each rank."""
    from accelerate_launch import resolved_launch

    env = resolved_launch(ACCEL / name)[2]
    # this machine has no GPU: the ranks' arguments are built as on CPU (bf16 off)
    return {k: v for k, v in env.items() if k.startswith("ACCELERATE_") and k != "ACCELERATE_MIXED_PRECISION"}


def _hf_trainer_ds_config(config: dict):
    """transformers' HfTrainerDeepSpeedConfig for `config`. Without DeepSpeed installed,
    transformers defines its base class as `object` and checks the package's version: then its
    own methods are put on the base it has with DeepSpeed (accelerate's HfDeepSpeedConfig)."""
    from transformers.integrations import deepspeed as hf_ds

    if hf_ds.is_deepspeed_available():
        return hf_ds.HfTrainerDeepSpeedConfig(config)
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    own = hf_ds.HfTrainerDeepSpeedConfig.__dict__
    cls = type("HfTrainerDeepSpeedConfig", (HfDeepSpeedConfig,),
               {k: own[k] for k in ("is_auto", "fill_match", "fill_only", "trainer_config_process",
                                    "trainer_config_finalize", "dtype")})
    ds = cls(config)
    ds._dtype, ds.mismatches = None, []
    return ds


def _trainer_args(preset: Path, stage: str, tmp_path: Path):
    from grpo_core.config import load_config
    from grpo_core.train.trl_args import trl_grpo_args, trl_sft_args

    cfg = load_config(preset)
    build = trl_grpo_args if stage == "grpo" else trl_sft_args
    return build(cfg, str(tmp_path / stage))


def test_deepspeed_files_leave_gradient_accumulation_to_the_trainer():
    from accelerate.utils import DeepSpeedPlugin

    for name in DEEPSPEED_FILES:
        with mock.patch.dict(os.environ, _rank_env(name)):
            plugin = DeepSpeedPlugin()
        assert plugin.gradient_accumulation_steps == "auto", name
        assert plugin.deepspeed_config["gradient_accumulation_steps"] == "auto", name
        assert plugin.deepspeed_config["train_batch_size"] == "auto", name


@pytest.mark.parametrize("stage", ["grpo", "sft"])
@pytest.mark.parametrize("name", DEEPSPEED_FILES)
def test_transformers_accepts_each_preset_under_each_deepspeed_file(name, stage, tmp_path):
    from accelerate.utils import DeepSpeedPlugin

    with mock.patch.dict(os.environ, _rank_env(name)):
        plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision("bf16")  # what the Accelerator does with the file's mixed_precision
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=896))
    for preset in PRESETS:
        args = _trainer_args(preset, stage, tmp_path)
        # On a GPU train.precision auto gives bf16, as the files' mixed_precision says.
        args.bf16, args.fp16 = True, False
        ds = _hf_trainer_ds_config(copy.deepcopy(plugin.deepspeed_config))
        ds.trainer_config_process(args)
        ds.trainer_config_finalize(args, model, num_training_steps=10)  # raises on a mismatch
        assert ds.config["gradient_accumulation_steps"] == args.gradient_accumulation_steps, preset.name
        assert ds.config["train_micro_batch_size_per_gpu"] == args.per_device_train_batch_size
        assert ds.config["bf16"]["enabled"] is True, preset.name


@pytest.mark.parametrize("name", [p.name for p in FILES])
def test_each_preset_builds_its_trainer_arguments_under_each_file(name, tmp_path):
    """Each preset's GRPO and SFT arguments build under each file's rank environment
    (TrainingArguments reads ACCELERATE_USE_DEEPSPEED and builds the DeepSpeed plugin then)."""
    from transformers.integrations.deepspeed import is_deepspeed_available

    env = _rank_env(name)
    if env.get("ACCELERATE_USE_DEEPSPEED") == "true" and not is_deepspeed_available():
        pytest.skip("TrainingArguments needs the deepspeed package under a DeepSpeed launch")
    for preset in PRESETS:
        for stage in ("grpo", "sft"):
            with mock.patch.dict(os.environ, env):
                args = _trainer_args(preset, stage, tmp_path)
            assert args.gradient_accumulation_steps >= 1, (name, preset.name)
