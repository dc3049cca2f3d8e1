"""The whole config: `PipelineConfig`, its loading (YAML, `extends:`, `--set` overrides)
and the rules that span two sections. `load_config(path, overrides)` returns a
`PipelineConfig` or raises `ConfigError`, whose message names the offending field, so
the CLI can print one line and exit 2 before any work starts."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from grpo_core.config.base import ConfigError, Section
from grpo_core.config.pipeline_only import (
    AlgorithmConfig,
    DiagnosisConfig,
    DynamicSamplingConfig,
    InRoundEvalConfig,
    ProbeConfig,
    RoundsConfig,
    SFTStageConfig,
)
from grpo_core.config.sections import (
    DataConfig,
    EvalConfig,
    FilterConfig,
    ModelConfig,
    ProjectConfig,
    RewardsConfig,
    RolloutConfig,
    TrackingConfig,
    TrainConfig,
)
from grpo_core.config.trl_sections import GRPOSection, SFTSection, check_trl_keys


class PipelineConfig(Section):
    project: ProjectConfig = Field(default_factory=ProjectConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    sft_stage: SFTStageConfig = Field(default_factory=SFTStageConfig)
    sft: SFTSection = Field(default_factory=SFTSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    rounds: RoundsConfig = Field(default_factory=RoundsConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    in_round_eval: InRoundEvalConfig = Field(default_factory=InRoundEvalConfig)
    diagnosis: DiagnosisConfig = Field(default_factory=DiagnosisConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    def hash(self) -> str:
        """Content hash of the resolved config (cache keys, MLflow tags)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(dotted, f"{part!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` -> ("a.b", c), with c parsed as YAML (numbers, lists, booleans)."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(text, "empty key in override")
    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        value = raw
    return key, value


def _first_error(err: ValidationError, prefix: str = "") -> ConfigError:
    e = err.errors()[0]
    loc = prefix + ".".join(str(p) for p in e["loc"])
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        msg = "unknown field"
    msg = msg.removeprefix("Value error, ")
    return ConfigError(loc, msg)


def config_from_dict(tree: dict, overrides: list[str] | None = None) -> PipelineConfig:
    tree = json.loads(json.dumps(tree or {}))  # deep copy, plain types
    for item in overrides or []:
        key, value = parse_override(item)
        _set_dotted(tree, key, value)
    _check_trl_sections(tree)
    try:
        cfg = PipelineConfig.model_validate(tree)
    except ValidationError as err:
        raise _first_error(err) from None
    _cross_section_checks(cfg)
    for name in cfg.project.recipe_overrides:
        recipe_config(cfg, name)  # a bad override is refused at load, named
    return cfg


def recipe_config(cfg: PipelineConfig, name: str) -> PipelineConfig:
    """`cfg` as recipe `name` runs it: project.recipe_overrides[name] merged over it (a copy;
    the recipe label and the SFT switch are flows/recipes.expand_recipes' business).
    Raises ConfigError naming `project.recipe_overrides.<name>.<field>`."""
    over = cfg.project.recipe_overrides.get(name)
    if not over:
        return cfg.model_copy(deep=True)
    prefix = f"project.recipe_overrides.{name}."
    if "project" in over:
        raise ConfigError(prefix + "project", "the recipes of one comparison share the "
                          "project section (name, seed, workdir): set it at the top level")
    try:
        over = json.loads(json.dumps(over))  # plain types, deep copy
        _check_trl_sections(over)
        out = PipelineConfig.model_validate(_deep_merge(cfg.model_dump(), over))
        _cross_section_checks(out)
    except ValidationError as err:
        raise _first_error(err, prefix) from None
    except ConfigError as err:
        field = prefix + err.field if err.field else prefix.rstrip(".")
        raise ConfigError(field, str(err).split(": ", 2)[-1]) from None
    return out


def _check_trl_sections(tree: dict) -> None:
    """The keys of `grpo:` / `sft:` against TRL's classes (rloo: RLOOConfig), before
    pydantic sees them, so a moved or unknown key is named as such."""
    algorithm = tree.get("algorithm")
    rloo_run = isinstance(algorithm, dict) and algorithm.get("name") == "rloo"
    for name, section in (("grpo", GRPOSection), ("sft", SFTSection)):
        given = tree.get(name)
        if isinstance(given, dict):
            rloo = name == "grpo" and rloo_run
            check_trl_keys(section, name, given, "RLOOConfig" if rloo else None)
            if rloo and "normalize_advantages" in given:
                raise ConfigError("grpo.normalize_advantages", "set by the pipeline from "
                                  "grpo.scale_rewards (batch: on) under algorithm.name: rloo")


def generation_batch(cfg: PipelineConfig) -> int:
    """Completions TRL generates at once (its generation_batch_size): unless set,
    per_device_train_batch_size x train.num_processes x steps_per_generation, which
    defaults to gradient_accumulation_steps (one generation per optimizer step)."""
    g = cfg.grpo
    steps = g.steps_per_generation or g.gradient_accumulation_steps
    return g.generation_batch_size or g.per_device_train_batch_size * cfg.train.num_processes * steps


def _cross_section_checks(cfg: PipelineConfig) -> None:
    """Rules that span two sections, named by the field a user would change."""
    g, n, algo = cfg.grpo, cfg.train.num_processes, cfg.algorithm.name
    if g.num_generations < 2 and algo != "ppo":
        raise ConfigError("grpo.num_generations", "a group baseline needs >= 2 completions per "
                          "prompt; 1 is only for algorithm.name: ppo (a learned critic)")
    if g.loss_type != "grpo" and algo == "rloo":
        raise ConfigError("grpo.loss_type", f"{g.loss_type!r} is a GRPOTrainer loss; algorithm.name: "
                          "rloo trains with RLOOTrainer's own sequence-level loss (leave loss_type: grpo)")
    if cfg.dynamic_sampling.enabled and algo in ("ppo", "rloo"):
        raise ConfigError("dynamic_sampling", f"dynamic sampling splices GRPOTrainer's per-sequence "
                          f"batches; algorithm.name: {algo} carries other ones (per-token advantages "
                          "and values, or RLOO's sequence log-probs): disable it or use grpo / grpo_vhead")
    per_pass = g.per_device_train_batch_size * n
    if g.generation_batch_size is not None:
        if g.steps_per_generation is not None:
            raise ConfigError("grpo.generation_batch_size", "set it or grpo.steps_per_generation, "
                              "not both (TRL refuses both)")
        if g.generation_batch_size % per_pass:
            raise ConfigError("grpo.generation_batch_size",
                              f"{g.generation_batch_size} is not a multiple of grpo.per_device_train_"
                              f"batch_size x train.num_processes = {g.per_device_train_batch_size} x {n}")
    gen = generation_batch(cfg)
    if gen % g.num_generations:
        what = ("grpo.generation_batch_size" if g.generation_batch_size is not None else
                "grpo.per_device_train_batch_size x train.num_processes x grpo.steps_per_generation"
                f" (default: gradient_accumulation_steps) = {g.per_device_train_batch_size} x {n} x "
                f"{g.steps_per_generation or g.gradient_accumulation_steps}")
        raise ConfigError("grpo.generation_batch_size" if g.generation_batch_size is not None
                          else "grpo.per_device_train_batch_size", f"a generation batch of {what} = {gen} completions is not a whole number "
                          f"of groups of grpo.num_generations = {g.num_generations}")


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_tree(p: Path, chain: tuple[Path, ...] = ()) -> dict:
    """A YAML mapping, with `extends: other.yaml` (relative to this file) merged underneath."""
    if not p.is_file():
        raise ConfigError("config", f"file not found: {p}")
    if p.resolve() in chain:
        raise ConfigError("extends", f"cycle through {p}")
    try:
        tree = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("config", f"cannot read {p}: {exc}") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise ConfigError("config", f"{p} is not valid YAML: {first}") from None
    if not isinstance(tree, dict):
        raise ConfigError("config", f"{p} must hold a mapping at the top level")
    parent = tree.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError("extends", "must be a path to another YAML file")
        base = _read_tree((p.parent / parent), chain + (p.resolve(),))
        tree = _deep_merge(base, tree)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read, override and validate a config. No side effects; raises ConfigError."""
    tree = _read_tree(Path(path)) if path is not None else {}
    return config_from_dict(tree, overrides)
