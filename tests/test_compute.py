"""Compute beside every gain (grpo_core/eval/compute.py, the pipeline's ledger
tasks.stage_results.Compute, grpo_core.train.throughput.training_compute): what a stage
spent, summed per recipe, the table under the comparison and the verdict's clause."""
from __future__ import annotations

import pytest

from grpo_core.eval.compute import compute_markdown, match_clause, training_seconds
from grpo_core.train.throughput import training_compute
from tasks.stage_results import (
    Compute,
    EvalResult,
    FilterResult,
    GrpoStageResult,
    SftStageResult,
)


def test_training_compute_reads_a_rounds_rows_and_sfts_flos():
    rows = [{"num_tokens": 1000.0, "throughput/gen_tokens_per_s": 100.0,
             "throughput/gen_seconds": 2.0, "throughput/train_tflops": 0.5,
             "throughput/train_seconds": 4.0},
            {"num_tokens": 2500.0, "throughput/gen_tokens_per_s": 50.0,
             "throughput/gen_seconds": 2.0, "throughput/train_tflops": 0.25,
             "throughput/train_seconds": 4.0}]
    assert training_compute(rows) == {"train_tokens": 2500.0, "gen_tokens": 300.0,
                                      "train_tflop": 3.0}
    sft = [{"loss": 1.0, "num_tokens": 800.0}]  # SFT logs no throughput: its flos count
    assert training_compute(sft, total_flos=4.2e12) == {"train_tokens": 800.0, "train_tflop": 4.2}
    assert training_compute([]) == {}


def test_the_ledger_adds_each_stage_kind():
    c = Compute()
    c.add(FilterResult(kept=3, considered=8, sampled=64, seconds=5.0))
    c.add(SftStageResult(model_dir="m", steps=300, seconds=60.0,
                         compute={"train_tokens": 1e6, "train_tflop": 2.0}))
    c.add(GrpoStageResult(model_dir="m", steps=80, seconds=100.0,
                          compute={"train_tokens": 2e6, "gen_tokens": 5e5, "train_tflop": 4.0}))
    assert c.add("a folder") == "a folder"  # the base model's stage: passes through
    c.add(EvalResult(benchmarks={}, seconds=9.0))
    assert (c.filter_s, c.filter_samples, c.sft_steps, c.grpo_steps, c.eval_s) == (5, 64, 300, 80, 9)
    assert c.train_tflop == 6.0 and c.gen_tokens == 5e5 and c.train_tokens == 3e6
    assert training_seconds(c.model_dump()) == 165.0  # eval is not training compute


def test_match_clause_says_whether_the_recipes_were_matched():
    r1 = {"train_tflop": 4.0, "grpo_s": 100.0, "filter_s": 10.0}
    sft = {"train_tflop": 6.0, "sft_s": 60.0, "grpo_s": 100.0, "filter_s": 10.0}
    said = match_clause(r1, sft, "r1_zero", "sft_grpo")
    assert said.startswith("; not compute-matched: sft_grpo spent 1.50x r1_zero's training TFLOP")
    assert "training seconds 170 vs 110" in said
    assert match_clause(r1, {**sft, "train_tflop": 4.2}, "r1_zero", "sft_grpo").startswith(
        "; compute-matched: ")
    assert match_clause(r1, {}, "r1_zero", "sft_grpo") == ""  # not measured: nothing claimed


def test_compute_table_has_a_row_per_measured_recipe():
    md = compute_markdown({"r1_zero": {"grpo_s": 100.0, "grpo_steps": 160, "train_tflop": 4.0,
                                       "train_tokens": 2.5e6, "gen_tokens": 4.1e5},
                           "sft_grpo": {"sft_s": 60.0, "sft_steps": 300, "grpo_s": 95.0,
                                        "grpo_steps": 160, "train_tflop": 6.0}, "none": {}})
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| recipe | SFT s (steps)")
    assert rows[1] == "| r1_zero | 0 (0) | 0 (0) | 100 (160) | 2.5M | 410k | 4 | 100 |"
    assert rows[2].startswith("| sft_grpo | 60 (300) |") and rows[2].endswith("| 6 | 155 |")
    assert len(rows) == 3 and compute_markdown({}) == ""


@pytest.mark.parametrize("value,said", [(999, "999"), (5300, "5.3k"), (1.234e6, "1.23M")])
def test_counts_read_short(value, said):
    from grpo_core.eval.compute import short_count

    assert short_count(value) == said


def test_matching_steps_spend_the_sfts_tflop_on_grpo():
    from grpo_core.eval.compute import matching_steps

    sft_grpo = {"train_tflop": 10.0, "sft_tflop": 4.0, "grpo_steps": 160}  # GRPO 6 / 160 steps
    assert matching_steps(sft_grpo, rounds=2) == 53  # 4 / (6/160) = 106.7 steps, over 2 rounds
    assert matching_steps({**sft_grpo, "sft_tflop": 0.0}, rounds=2) == 0
    assert matching_steps({"sft_tflop": 4.0}, rounds=2) == 0  # no GRPO step measured


@pytest.mark.integration
def test_compute_match_gives_r1_zero_the_sfts_cost_in_grpo_steps(tmp_path):
    """`grpo run --set project.compute_match=true` (the main job, shrunk as the main_job
    fixture does): sft_grpo runs first, r1_zero then trains more GRPO steps, and the verdict
    says how close the two recipes' training TFLOP came."""
    import re
    import subprocess

    from fixtures_models import MAIN_JOB_SHRINK
    from pipeline_runs import GRPO, ROOT, run_env

    workdir = tmp_path / "ws"
    sets = [a for s in [*MAIN_JOB_SHRINK, "project.compute_match=true"] for a in ("--set", s)]
    run = subprocess.run([GRPO, "run", "--quiet", "--workdir", str(workdir), *sets],
                         env=run_env(workdir), cwd=ROOT, capture_output=True, text=True,
                         timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    said = run.stdout + run.stderr
    m = re.search(r"compute_match: r1_zero gets (\d+) more GRPO steps a round \(2 -> (\d+)\)", said)
    assert m and int(m[1]) >= 1 and int(m[2]) == 2 + int(m[1]), said[-3000:]
    order = [said.index(f"Flow run '{r}-") for r in ("sft_grpo", "r1_zero")]
    assert order[0] < order[1]  # the SFT recipe first: its cost sets the steps
    rows = dict(re.findall(r"^\| (r1_zero|sft_grpo) \| \d+ \(\d+\) \| [^|]+ \| [\d.]+ \((\d+)\) \|",
                           run.stdout, flags=re.M))
    assert rows == {"r1_zero": str(2 * int(m[2])), "sft_grpo": "4"}, run.stdout[-3000:]
    verdict = next(line for line in run.stdout.splitlines() if line.startswith("verdict: "))
    assert "compute-matched: sft_grpo spent" in verdict
    assert verdict.index("sft_grpo") < verdict.index("r1_zero")  # the configured order
