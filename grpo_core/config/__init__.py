"""The pipeline's config: YAML validated by pydantic, one section per concern.

- `grpo:` / `sft:` are TRL's own GRPOConfig / SFTConfig fields, by TRL's names, with the
  pipeline's defaults layered on TRL's (trl_sections.py; docs/configs.md's table says why);
  any other field of the installed TRL class passes straight through.
- What only the pipeline has lives in its own small sections (pipeline_only.py): rounds,
  algorithm, dynamic_sampling, in_round_eval, diagnosis, sft_stage.
- The rest (project, model, data, rollout, filter, rewards, eval, train, tracking) is in
  sections.py; the whole, its loading and the cross-section rules in pipeline.py.
"""
from grpo_core.config.base import ConfigError, Section
from grpo_core.config.pipeline import (
    PipelineConfig,
    config_from_dict,
    generation_batch,
    load_config,
    parse_override,
    recipe_config,
)
from grpo_core.config.pipeline_only import (
    AlgorithmConfig,
    DiagnosisConfig,
    DynamicSamplingConfig,
    InRoundEvalConfig,
    KLSchedule,
    RoundsConfig,
    SFTStageConfig,
)
from grpo_core.config.sections import DataSource, RewardsConfig
from grpo_core.config.trl_sections import GRPOSection, SFTSection, TRLSection, trl_fields

__all__ = [
    "AlgorithmConfig", "ConfigError", "DataSource", "DiagnosisConfig", "DynamicSamplingConfig",
    "GRPOSection", "InRoundEvalConfig", "KLSchedule", "PipelineConfig", "RewardsConfig",
    "RoundsConfig", "SFTSection", "SFTStageConfig", "Section", "TRLSection", "config_from_dict",
    "generation_batch", "load_config", "parse_override", "recipe_config", "trl_fields",
]
