"""The memorisation probe's measurement (grpo_core/train/memorisation.py) on a real stage:
SFT of the built-in model on 8 problems for many epochs is a stage that memorises; its
gain on those 8 is far above its gain on 16 problems of the same levels it never saw, and
`memorisation_gap` fires. A prompt trained more than probe.max_prompt_repeats times fires
`prompt_repeats`. Real training (TRL's SFTTrainer), real sampling; nothing mocked."""
from __future__ import annotations

from grpo_core.config import PipelineConfig
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.evaluation import score_problems
from grpo_core.generation.sampling import build_backend
from grpo_core.modeling.loading import resolve_model_path
from grpo_core.prompts import resolve_template
from grpo_core.train.memorisation import (
    gap_findings,
    gap_of,
    repeat_findings,
    sampled_only,
    score_sets,
)
from grpo_core.train.sft import run_sft


def _scores(path: str, sets: dict, cfg) -> dict[str, list[float]]:
    backend, tokenizer = build_backend(path, cfg)
    template = resolve_template(cfg.model.template, tokenizer)
    return score_sets(lambda ps: score_problems(backend, tokenizer, ps, sampled_only(cfg), template),
                      sets, cfg.rewards.extraction)


def test_a_memorising_stage_fires_memorisation_gap(tmp_path):
    cfg = PipelineConfig.model_validate({
        "project": {"workdir": str(tmp_path / "ws")},
        "model": {"name_or_path": "builtin:tiny-arith", "template": "r1_zero"},
        "sft": {"max_steps": 150, "learning_rate": 3e-3, "per_device_train_batch_size": 8},
        "eval": {"samples": 4, "temperature": 0.6, "max_new_tokens": 40}})
    base = resolve_model_path("builtin:tiny-arith", tmp_path / "models")
    problems = generate_problems("train", n=24, levels=[2, 3], seed=11)
    sets = {"trained": problems[:8], "unseen": problems[8:]}
    out = run_sft(base, sets["trained"], cfg, tmp_path / "sft", cfg.model.template)
    result = gap_of("sft", _scores(base, sets, cfg), _scores(out.output_dir, sets, cfg))
    print(result.line())
    assert result.trained - result.trained_before > 0.3  # it learnt its 8 problems by heart
    assert result.gap > 0.2 and result.gap - 1.96 * result.gap_se > 0
    (finding,) = gap_findings(result, cfg.probe.gap_threshold)
    assert finding.code == "memorisation_gap" and "sft.max_steps" in finding.line()
    # the same numbers under a threshold above the gap: silent
    assert gap_findings(result, result.gap + 0.01) == []
    assert set(result.metrics()) >= {"memorisation/trained", "memorisation/unseen",
                                     "memorisation/gap", "memorisation/trained_gain"}


def test_prompt_repeats_fires_past_the_configured_limit():
    uses = {"a": 2.0, "b": 5.0, "c": 9.0}
    (finding,) = repeat_findings("grpo/round-1", uses, limit=4)
    assert finding.code == "prompt_repeats" and finding.evidence["over_limit"] == 2
    assert "filter.max_problems" in finding.line()
    assert repeat_findings("grpo/round-1", uses, limit=9) == []


def test_the_comparison_report_carries_each_stage_probe():
    from flows.compare import memorisation_markdown
    from grpo_core.train.memorisation import GapResult
    from tasks.stage_results import PipelineResult, ProbeResult

    probe = ProbeResult(gap=GapResult("grpo/round-2", 0.62, 0.35, 0.50, 0.34, 64, 64, 0.02, 0.36))
    run = {"parent_run": "p", "model_dir": "m", "final": {}}
    md = memorisation_markdown({"sft_grpo": PipelineResult(**run, memorisation=[probe]),
                                "r1_zero": PipelineResult(**run)})
    assert "| sft_grpo | grpo/round-2 | 0.620 (+0.120) | 0.350 (+0.010) | +0.110 +/- 0.039 | 0.360 |" in md
    assert memorisation_markdown({"r1_zero": PipelineResult(**run)}) == ""
