"""R1-Zero that can start (issue 33): the zero-RL reward sees the answers a base model writes
without tags, the filter counts a success as that reward does, and a round that would
start with every group's reward equal stops before training."""
from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_core.config import ConfigError, config_from_dict, load_config
from grpo_core.data.stage_split import prompts_per_update
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.difficulty import filter_problems, problem_seed, sampling_key
from grpo_core.generation.rollout import Completion, SamplingParams
from grpo_core.generation.sampling import sample_seeded
from grpo_core.prompts import render_prompt
from grpo_core.train.diagnosis import CollapsedStart, start_collapse
from grpo_core.verify.rewards import build_reward_funcs

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "configs/models/smollm2-135m-cpu.yaml"
G = 8


class ProseBase:
    """A base model that never writes a tag: it answers in prose, right in the even samples
    of each problem and one off in the odd ones (what SmolLM2-Instruct does under the
    R1-Zero and chat templates: flexible accuracy 0.285, strict 0)."""

    def __init__(self, problems, template: str = "r1_zero"):
        self.by_prompt = {render_prompt(p.problem, template): p for p in problems}

    def sample(self, prompts, n, params):
        out = []
        for prompt in prompts:
            gold = int(self.by_prompt[prompt].answer)
            out.append([Completion(f" Let me work it out. The result is {gold + j % 2}.", 12, "stop")
                        for j in range(n)])
        return out


def zero_rl(**rewards) -> object:
    return config_from_dict({"rewards": {"extraction": "flexible", "funcs": ["accuracy", "format"],
                                         "weights": [1.0, 0.2], **rewards}})


def strict(**rewards) -> object:
    return config_from_dict({"rewards": {"funcs": ["accuracy", "format"], "weights": [1.0, 0.2],
                                         **rewards}})


def _k(cfg):
    cfg.filter.k, cfg.filter.band = G, (0.125, 0.875)
    return cfg


def group_stds(cfg, problems, base) -> list[float]:
    """Per problem: the std of TRL's total reward (weighted sum) over its G completions."""
    funcs, weights = build_reward_funcs(cfg.rewards, cfg.grpo.max_completion_length)
    stds = []
    for p in problems:
        prompt = render_prompt(p.problem, "r1_zero")
        texts = [c.text for c in sample_seeded(base, [prompt], G, SamplingParams(seed=1),
                                               [problem_seed(0, p)])[0]]
        per_fn = [f(texts, answer=[p.answer] * G, prompts=[prompt] * G) for f in funcs]
        totals = [sum(w * (v or 0.0) for w, v in zip(weights, vals)) for vals in zip(*per_fn)]
        stds.append(statistics.stdev(totals))
    return stds


def test_zero_rl_reward_varies_where_the_strict_one_is_constant():
    """Acceptance (issue 33): completions carrying correct answers without tags give every
    group reward variance under the zero-RL reward, none under the strict one."""
    problems = generate_problems("train", 6, levels=[1, 2], seed=0)
    base = ProseBase(problems)
    assert all(s > 0.4 for s in group_stds(zero_rl(), problems, base))  # 1/0 halves: ~0.53
    assert group_stds(strict(), problems, base) == [0.0] * len(problems)
    # accuracy alone, no format bonus: the same variance
    assert all(s > 0.4 for s in group_stds(zero_rl(funcs=["accuracy"], weights=[1.0]),
                                           problems, base))


def test_the_filter_counts_a_success_as_the_accuracy_reward_does():
    problems = generate_problems("train", 6, levels=[1, 2], seed=0)
    base = ProseBase(problems)
    zero_rl_cfg, strict_cfg = _k(zero_rl()), _k(strict())
    flexible = filter_problems(base, problems, "fp", zero_rl_cfg, "r1_zero")
    strictly = filter_problems(base, problems, "fp", strict_cfg, "r1_zero")
    assert [r["pass_rate"] for r in flexible.estimates] == [0.5] * 6
    assert flexible.counts["in_band"] == 6
    assert [r["pass_rate"] for r in strictly.estimates] == [0.0] * 6
    assert strictly.counts == {"too_easy": 0, "in_band": 0, "too_hard": 6}
    # estimates scored one way are never reused for the other
    assert sampling_key(zero_rl_cfg, "r1_zero") != sampling_key(strict_cfg, "r1_zero")
    # strict keeps the key it always had: stores keep their estimates
    assert sampling_key(strict_cfg, "r1_zero") == sampling_key(_k(config_from_dict({})), "r1_zero")
    assert start_collapse([r["pass_rate"] for r in flexible.estimates], zero_rl_cfg) is None
    finding = start_collapse([r["pass_rate"] for r in strictly.estimates], strict_cfg)
    assert finding.code == "reward_collapse_zero" and "rewards.extraction" in finding.action


def test_smollm2_r1_zero_runs_the_zero_rl_reward_and_sft_grpo_the_strict_one():
    from flows.recipes import expand_recipes

    by = {c.project.recipe: c for c in expand_recipes(load_config(SMOLLM2))}
    zero, sft = by["r1_zero"], by["sft_grpo"]
    assert zero.rewards.extraction == "flexible" and not zero.sft_stage.enabled
    assert sft.rewards.extraction == "strict" and sft.sft_stage.enabled
    assert zero.diagnosis.stop_on_collapsed_start and sft.diagnosis.stop_on_collapsed_start
    assert not zero.project.recipe_overrides and not sft.project.recipe_overrides
    # the same eval protocol, data and template: the recipes' finals stay comparable
    for section in ("model", "data", "eval", "rollout"):
        assert getattr(zero, section) == getattr(sft, section), section
    # a config that runs r1_zero alone gets its overrides too
    alone = expand_recipes(load_config(SMOLLM2, ["project.recipes=[]"]))
    assert [(c.project.recipe, c.rewards.extraction) for c in alone] == [("r1_zero", "flexible")]


def test_recipe_overrides_are_checked_at_load():
    with pytest.raises(ConfigError, match=r"project.recipe_overrides.sft_grpo.rewards.extraction"):
        config_from_dict({"project": {"recipe_overrides": {"sft_grpo": {
            "rewards": {"extraction": "loose"}}}}})
    with pytest.raises(ConfigError, match=r"project.recipe_overrides.r1_zero.project"):
        config_from_dict({"project": {"recipe_overrides": {"r1_zero": {"project": {"seed": 1}}}}})
    with pytest.raises(ConfigError, match=r"project.recipe_overrides.r1_zero.grpo.num_generations"):
        config_from_dict({"project": {"recipe_overrides": {"r1_zero": {
            "grpo": {"num_generations": 1}}}}})


def _filter_round(cfg, monkeypatch, kept):
    """flows.pipeline.filter_round with the filter stage's result given (no Prefect run)."""
    import flows.pipeline as pipeline

    monkeypatch.setattr(pipeline, "run_stage", lambda *a, **kw: kept)
    from tasks.launch import LaunchPlan

    ctx = SimpleNamespace(cfg=cfg, store=None, ws=SimpleNamespace(root="."),
                          launch_plan=lambda: LaunchPlan("in-process"))
    pool = [f"p{i}" for i in range(40)]
    return pipeline.filter_round(ctx, "model", pool, 1, log=None)


def test_a_round_that_starts_collapsed_stops_before_training_on_the_builtin_model(
        tmp_path, monkeypatch):
    """The built-in model's base under strict rewards on level-5 problems solves nothing:
    with diagnosis.stop_on_collapsed_start the round stops with reward_collapse_zero naming
    the fix; without it, the old fallback (all the round's candidates, a note)."""
    from grpo_core.eval.difficulty import run_filter
    from grpo_core.modeling.loading import resolve_model_path

    path = resolve_model_path("builtin:tiny-arith", tmp_path / "models")
    cfg = load_config(ROOT / "configs/recipes/r1_zero.yaml",
                      ["filter.k=4", "filter.max_problems=6", "rollout.max_new_tokens=24",
                       "rollout.backend=hf", "diagnosis.stop_on_collapsed_start=true"])
    report = run_filter(path, generate_problems("train", 12, levels=[5], seed=3), cfg)
    rates = [r["pass_rate"] for r in report.estimates]
    assert len(rates) == 6 and set(rates) == {0.0}, rates
    from tasks.stage_results import FilterResult

    kept = FilterResult(kept=0, considered=len(rates), pass_rates=rates,
                        need=prompts_per_update(cfg))  # as the filter stage sets it
    with pytest.raises(CollapsedStart) as stop:
        _filter_round(cfg, monkeypatch, kept)
    line = str(stop.value)
    assert line.startswith("reward_collapse_zero [stop]"), line
    assert "none of 6 problems" in line and "rewards.extraction: flexible" in line

    cfg.diagnosis.stop_on_collapsed_start = False
    prompts, note = _filter_round(cfg, monkeypatch, kept)
    assert len(prompts) == 40 and "all the round's candidates" in note.summary
    assert (note.code, note.stage) == ("few_in_band", "round 1")


@pytest.mark.integration
def test_grpo_run_stops_a_collapsed_start_before_any_training(tmp_path):
    """`grpo run` on the built-in model with level-5 problems only (its base solves none):
    the filter's stage, then the stop, its finding in the output; no GRPO round ran."""
    import subprocess

    from pipeline_runs import GRPO, run_env, run_names, write_config

    cfg = write_config(tmp_path, "builtin:tiny-arith",
                       data={"train": [{"source": "synthetic:arith", "limit": 40, "levels": [5]}]},
                       diagnosis={"stop_on_collapsed_start": True})
    workdir = tmp_path / "ws"
    proc = subprocess.run([GRPO, "run", str(cfg), "--quiet"], env=run_env(workdir), cwd=ROOT,
                          capture_output=True, text=True, timeout=900, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "CollapsedStart: reward_collapse_zero [stop]" in out, out[-3000:]
    assert "rewards.extraction: flexible" in out, out[-3000:]
    stages = run_names(workdir)
    assert "filter/round-1" in stages and not any(s.startswith("grpo/") for s in stages), stages
