"""Throughput you can read (issue 23, item 5): the MFU arithmetic and the peak table
(pure), a real 2-step GRPO round's throughput/* metrics in its history and in its MLflow
run, the stage line's figures, and per-stage peak RSS."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_core.findings import Finding
from grpo_core.train import throughput as tp

pytest_plugins = ["fixtures_models"]


# ------------------------------------------------------------------ pure


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0), ("NVIDIA L40S", 362.0),
    ("NVIDIA A10G", 70.0), ("NVIDIA GeForce RTX 4090", 165.0),
    ("Tesla T4", None), (None, None),
])
def test_peak_by_device_name(name, peak):
    assert tp.peak_tflops(name) == peak


def test_config_override_wins_over_the_table():
    assert tp.peak_tflops("NVIDIA H100 PCIe", 500.0) == 500.0
    assert tp.peak_tflops(None, 91.5) == 91.5  # an unlisted device gets MFU through the override


def test_mfu_is_6_n_tokens_over_time_over_peak():
    # 1e9 params, 1e4 tokens in 0.5 s: 6e13 FLOP / 0.5 s = 1.2e14 FLOP/s = 12% of 1000 TFLOP/s
    assert tp.mfu(10**9, 10_000, 0.5, 1000.0) == pytest.approx(0.12)
    assert math.isnan(tp.mfu(10**9, 10_000, 0.0, 1000.0))


def test_step_metrics_split_trl_step_time_and_leave_mfu_out_without_a_peak():
    counts = tp.StepCounts(gen_seconds=0.6, gen_tokens=300, train_tokens=800)
    m = tp.step_metrics(counts, 1.0, 10**6, None)
    assert m[tp.GEN_SECONDS] + m[tp.TRAIN_SECONDS] == pytest.approx(1.0)
    assert m[tp.GEN_TOK_S] == pytest.approx(500.0) and m[tp.TRAIN_TOK_S] == pytest.approx(2000.0)
    assert tp.MFU not in m  # no peak: a GPU not in the table with no train.peak_tflops
    with_peak = tp.step_metrics(counts, 1.0, 10**6, 1.0)
    assert with_peak[tp.MFU] == pytest.approx(6 * 10**6 * 800 / 0.4 / 1e12)
    idle = tp.step_metrics(tp.StepCounts(), 0.2, 10**6, 1.0)  # a buffered step: no generation
    assert idle[tp.GEN_SECONDS] == 0.0 and tp.GEN_TOK_S not in idle


def test_round_summary_weights_rows_by_their_seconds():
    rows = [{tp.GEN_SECONDS: 3.0, tp.TRAIN_SECONDS: 1.0, tp.GEN_TOK_S: 100.0, tp.TRAIN_TOK_S: 1000.0},
            {tp.GEN_SECONDS: 1.0, tp.TRAIN_SECONDS: 1.0, tp.GEN_TOK_S: 500.0, tp.TRAIN_TOK_S: 3000.0,
             tp.MFU: 0.3},
            {"loss": 0.1}]  # a row without throughput (an older history) is left out
    s = tp.round_summary(rows)  # rounded to 4 decimals
    assert s["gen_share"] == pytest.approx(4 / 6, abs=1e-4)
    assert s["gen_tokens_per_s"] == pytest.approx((300 + 500) / 4)
    assert s["train_tokens_per_s"] == pytest.approx((1000 + 3000) / 2)
    assert s["mfu"] == pytest.approx(0.3)
    assert "is_ratio" not in s  # hf generation: TRL logs no importance-sampling ratio
    assert tp.round_summary([{"loss": 0.1}]) == {}
    rows[0][tp.IS_RATIO], rows[1][tp.IS_RATIO] = 0.99, 1.01  # vLLM generation (TRL's metric)
    s = tp.round_summary(rows)
    assert s["is_ratio"] == pytest.approx(1.0)
    assert tp.format_throughput(s).endswith("| IS ratio 1.000")


def test_stage_line_carries_the_figures():
    from tasks.runner import summary
    from tasks.stage_results import FilterResult, GrpoStageResult

    def grpo(**kw):
        return GrpoStageResult(model_dir="m", **kw)

    tp_ = {"gen_share": 0.62, "gen_tokens_per_s": 410.0, "train_tokens_per_s": 1234.0}
    result = grpo(steps=80, diagnosis="zero_variance", throughput=tp_, rss_peak_gb=0.63)
    assert summary(result) == ("80 steps; gen 62% | 410 tok/s gen, 1.2k tok/s train | "
                                       "peak RSS 0.6 GB; diagnosis: zero_variance")
    gpu = result.model_copy(update={"throughput": {**tp_, "mfu": 0.314}, "gpu_peak_gb": 61.2})
    assert "| MFU 31.4% | peak GPU 61.2 GB, peak RSS 0.6 GB;" in summary(gpu)
    # Other stages: their peak memory after their key number; nothing measured, nothing added.
    assert summary(FilterResult(kept=3, considered=8, rss_peak_gb=1.25)) == \
        "kept 3 of 8 (38%); peak RSS 1.2 GB"
    assert summary(FilterResult(kept=0, considered=0)) == "kept 0 of 0"  # no share of nothing
    assert summary(grpo(steps=2)) == "2 steps"
    # the round's findings counted by severity, as on its page and the parent's (issue 27)
    assert summary(grpo(steps=2, findings=[Finding("reward_fn_constant", "info", [1, 2], {}, "x")],
                                diagnosis="reward_fn_constant")) == \
        "2 steps; 1 finding (1 info); diagnosis: reward_fn_constant"


def test_rss_peak_sees_an_allocation_inside_the_block():
    with tp.rss_peak() as before:
        pass
    with tp.rss_peak() as rec:
        block = bytearray(300 * 10**6)  # 0.3 GB, touched
        block[::4096] = b"x" * len(block[::4096])
        del block
    assert rec.peak_gb is not None and rec.peak_gb >= before.peak_gb + 0.25


# ------------------------------------------------------------------ a real round


def _cfg(**grpo):
    from grpo_core.config import config_from_dict

    base = {"max_steps": 2, "save_steps": 2, "max_completion_length": 8, "logging_steps": 1,
            "per_device_train_batch_size": 8, "num_generations": 4, "learning_rate": 1e-3}
    return config_from_dict({"grpo": {**base, **grpo},
                             "rewards": {"funcs": ["accuracy", "format"], "weights": [1.0, 1.0]}})


@pytest.fixture
def tracked(tracked_config):
    from tasks import tracking as T

    cfg, wd = tracked_config
    parent = T.start_parent_run(cfg, cfg.hash(), "r1_zero", "abc1234", "flow-1", wd)
    return T.child_run(parent, "grpo/round-1"), wd


def test_a_real_round_logs_throughput_to_its_history_and_mlflow_run(tiny_model_path, tmp_path,
                                                                     tracked):
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round
    from tasks import tracking as T
    from tasks.tracking.step_logger import StepLogger

    run, wd = tracked
    logger = StepLogger(run, workspace=wd)
    try:
        result = run_grpo_round(tiny_model_path, generate_problems("train", 8, levels=[1]),
                                _cfg(), tmp_path / "round", "r1_zero", extra_callbacks=[logger])
    finally:
        logger.close()
    rows = [h for h in result.history if "reward" in h]
    assert [h["step"] for h in rows] == [1, 2]
    for h in rows:
        for key in (tp.GEN_SECONDS, tp.TRAIN_SECONDS, tp.GEN_TOK_S, tp.TRAIN_TOK_S):
            assert h[key] > 0, (key, h)
        # generation + training is TRL's step_time, by construction and to the float
        assert h[tp.GEN_SECONDS] + h[tp.TRAIN_SECONDS] == pytest.approx(h["step_time"], rel=1e-6)
        # where generation went: sampling and scoring measured inside it, never more than it
        assert h[tp.PREFIX + "sample_seconds"] > 0 and h[tp.PREFIX + "score_seconds"] > 0, h
        parts = sum(h[tp.PREFIX + p] for p in tp.STEP_PARTS)
        assert parts <= h[tp.GEN_SECONDS] + 1e-9, (parts, h[tp.GEN_SECONDS])
        # CPU: the MFU against this machine's measured matmul rate, which training stays under
        assert h[tp.PEAK] == tp.cpu_matmul_tflops(torch.get_num_threads()) > 0
        assert 0 < h[tp.MFU] < 1 and h[tp.TRAIN_TFLOPS] == pytest.approx(h[tp.MFU] * h[tp.PEAK])
        # 2 prompts x G 4 completions of at most 8 tokens each
        assert h[tp.GEN_TOK_S] * h[tp.GEN_SECONDS] <= 8 * 8 + 1e-6
    s = tp.round_summary(result.history)
    assert 0 < s["gen_share"] < 1 and s["gen_tokens_per_s"] > 0
    assert s["sample_seconds"] > 0 and 0 < s["mfu"] < 1
    assert "(sample " in tp.format_throughput(s) and "MFU " in tp.format_throughput(s)
    client = T.get_client()
    for key in (tp.GEN_SECONDS, tp.TRAIN_SECONDS, tp.GEN_TOK_S, tp.TRAIN_TOK_S, tp.MFU,
                tp.PREFIX + "sample_seconds"):
        steps = sorted(m.step for m in client.get_metric_history(run, key))
        assert steps == [1, 2], key


def test_smoke_json_rows_carry_the_figures():
    from flows.smoke import stage_figures
    from tasks.stage_results import FilterResult, GrpoStageResult

    res = GrpoStageResult(model_dir="m", steps=2, throughput={"gen_share": 0.7}, rss_peak_gb=0.6)
    assert stage_figures(res) == {"throughput": {"gen_share": 0.7}, "rss_peak_gb": 0.6}
    assert stage_figures(FilterResult(kept=3, considered=3)) == {}


def test_the_callback_logs_mfu_on_a_cuda_trainer_with_a_peak():
    """Throughput on a stand-in trainer whose training device is CUDA (no GPU needed):
    the MFU uses train.peak_tflops and the trainable parameters only."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from grpo_core.train.callbacks import Throughput

    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 1))  # 110 + 11
    model[1].weight.requires_grad_(False)  # 10 frozen
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    metrics["train"]["step_time"].append(2.0)
    trainer = SimpleNamespace(args=SimpleNamespace(device=torch.device("cuda")), model=model,
                              _metrics=metrics,
                              step_counts=tp.StepCounts(gen_seconds=1.5, gen_tokens=30,
                                                        train_tokens=1000))
    cb = Throughput(peak_override=1e-6)  # 1 MFLOP/s
    cb.bind(trainer)
    assert cb.params == 111 and cb.peak == 1e-6
    cb.on_step_end(None, None, None)
    got = {k: v[0] for k, v in metrics["train"].items() if k.startswith(tp.PREFIX)}
    assert got[tp.TRAIN_SECONDS] == pytest.approx(0.5) and got[tp.GEN_TOK_S] == pytest.approx(20)
    assert got[tp.MFU] == pytest.approx(6 * 111 * 1000 / 0.5 / 1e6)
    assert trainer.step_counts == tp.StepCounts()  # counted once: reset for the next step
    cpu = SimpleNamespace(args=SimpleNamespace(device=torch.device("cpu")), model=model)
    cb.bind(cpu)
    assert cb.peak == 1e-6  # the override wins on CPU too
    cb = Throughput()
    cb.bind(cpu)  # else this CPU's own matmul rate, measured
    assert cb.peak == tp.cpu_matmul_tflops(torch.get_num_threads()) > 0


def test_cpu_matmul_peak_is_measured_once_and_counts_threads():
    one = tp.cpu_matmul_tflops(1)
    assert 1e-4 < one < 10  # a CPU core does between 0.1 GFLOP/s and 10 TFLOP/s of fp32 GEMM
    assert tp.cpu_matmul_tflops(1) == one  # cached: a trainer built later pays nothing
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    tp.cpu_matmul_tflops.cache_clear()
    tp.cpu_matmul_tflops(1, size=64, seconds=0.01)
    assert torch.equal(torch.rand(3), want)  # measuring draws nothing from torch's generator


def test_the_step_line_says_where_the_step_went():
    from grpo_core.train.step_progress import where_the_step_went

    logs = {tp.GEN_SECONDS: 9.8, tp.TRAIN_SECONDS: 31.4, tp.PREFIX + "sample_seconds": 7.9,
            tp.PREFIX + "score_seconds": 0.3, tp.PREFIX + "logprob_seconds": 1.2,
            tp.TRAIN_TFLOPS: 0.021, tp.MFU: 0.14}
    assert where_the_step_went(logs) == ("gen 9.8 s (sample 7.9, score 0.3, logprobs 1.2)  "
                                         "train 31.4 s  0.021 TFLOP/s  MFU 14%")
    assert where_the_step_went({"loss": 1.0}) == ""  # SFT: nothing measured
    s = tp.round_summary([{**logs}])
    assert tp.format_throughput(s).startswith("gen 24% (sample 19%, score 1%, logprobs 3%) |")
