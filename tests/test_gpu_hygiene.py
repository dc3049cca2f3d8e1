"""GPU hygiene between in-process stages (grpo_core.modeling.gpu, issue 12 item 3), on CPU.

vLLM cannot be installed here (it needs a CUDA torch), so the engine shutdown is checked on
small fake backends and a fake `LLM` standing in for vLLM's: what is checked is that the hook
is called, not that a real engine frees its memory (that needs the GPU smoke).
"""
from __future__ import annotations

import contextlib
import os
import types

import pytest

from grpo_core.eval.score import BenchmarkScore
from grpo_core.generation.rollout import HFBackend, VLLMBackend
from grpo_core.modeling import gpu
from tasks.stage_results import EvalResult, GrpoStageResult


class FakeEngine:
    """Stands in for a vLLM-backed rollout backend: something with shutdown()."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1
        if self.fail:
            raise RuntimeError("engine already dead")


def test_env_set_inside_is_removed_and_changed_is_restored(monkeypatch):
    monkeypatch.setenv("GRPO_T_KEEP", "old")
    monkeypatch.delenv("GRPO_T_NEW", raising=False)
    with gpu.stage_memory() as mem:
        os.environ["GRPO_T_NEW"] = "1"  # what TRL's colocate mode does with RANK, MASTER_PORT...
        os.environ["GRPO_T_KEEP"] = "changed"
    assert "GRPO_T_NEW" not in os.environ
    assert os.environ["GRPO_T_KEEP"] == "old"
    assert mem.env_restored == ["GRPO_T_KEEP", "GRPO_T_NEW"]


def test_env_restored_on_exception(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GRPO_T_GONE", "x")
    with pytest.raises(ValueError), gpu.stage_memory():
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_PORT="29500")
        del os.environ["GRPO_T_GONE"]
        raise ValueError("stage failed")
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT"} & set(os.environ)
    assert os.environ["GRPO_T_GONE"] == "x"


def test_tracked_backend_is_shut_down_at_block_end():
    eng = FakeEngine()
    with gpu.stage_memory() as mem:
        assert gpu.track(eng) is eng
        assert eng.shutdowns == 0
    assert eng.shutdowns == 1 and mem.released == 1


def test_shutdown_also_on_exception_and_errors_do_not_mask():
    eng, bad = FakeEngine(), FakeEngine(fail=True)
    with pytest.raises(KeyError), gpu.stage_memory() as mem:
        gpu.track(eng)
        gpu.track(bad)
        raise KeyError("the stage's own error")
    assert eng.shutdowns == 1 and bad.shutdowns == 1 and mem.released == 1


def test_outside_a_block_nothing_is_tracked_and_nested_blocks_own_theirs():
    loose = gpu.track(FakeEngine())
    outer_eng, inner_eng = FakeEngine(), FakeEngine()
    with gpu.stage_memory():
        gpu.track(outer_eng)
        with gpu.stage_memory():
            gpu.track(inner_eng)
        assert inner_eng.shutdowns == 1 and outer_eng.shutdowns == 0
    assert outer_eng.shutdowns == 1 and loose.shutdowns == 0


def test_a_dropped_backend_is_not_kept_alive():
    with gpu.stage_memory() as mem:
        gpu.track(FakeEngine())  # no reference left: collected, nothing to shut down
    assert mem.released == 0


def test_vllm_backend_shutdown_stops_the_engine():
    class FakeLLM:  # vllm.LLM with its shutdown(); the real one needs a GPU
        stopped = 0

        def shutdown(self):
            FakeLLM.stopped += 1

    b = VLLMBackend.__new__(VLLMBackend)  # skip __init__: it builds a real engine
    b.llm = FakeLLM()
    b.shutdown()
    b.shutdown()  # idempotent
    assert FakeLLM.stopped == 1 and b.llm is None


def test_a_dropped_vllm_backend_stops_its_engine():
    """A stage that drops its backend before its end (no shutdown call): the engine's
    worker processes must not outlive it (they did: tests/test_vllm_cpu.py counts them)."""
    import gc

    class FakeLLM:
        stopped = 0

        def shutdown(self):
            FakeLLM.stopped += 1

    b = VLLMBackend.__new__(VLLMBackend)
    b.own_engine(FakeLLM())
    del b
    gc.collect()
    assert FakeLLM.stopped == 1
    kept = VLLMBackend.__new__(VLLMBackend)
    kept.own_engine(FakeLLM())
    kept.shutdown()
    del kept
    gc.collect()
    assert FakeLLM.stopped == 2  # shut down once, not again when collected


def test_vllm_backend_shutdown_older_engine_core():
    core = types.SimpleNamespace(calls=0)
    core.shutdown = lambda: setattr(core, "calls", core.calls + 1)
    b = VLLMBackend.__new__(VLLMBackend)
    b.llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(engine_core=core))
    b.shutdown()
    assert core.calls == 1


def test_hf_backend_shutdown_drops_the_model():
    b = HFBackend.__new__(HFBackend)
    b.model = object()
    with gpu.stage_memory() as mem:
        gpu.track(b)
    assert b.model is None and mem.released == 1


def test_no_peak_on_cpu():
    import torch

    assert not torch.cuda.is_available()  # this test is about a CPU-only machine
    with gpu.stage_memory() as mem:
        torch.ones(1000).sum()
    assert mem.peak_gb is None
    assert gpu.peak_metrics({"seconds": 1.0}) == {}
    assert gpu.peak_metrics({"gpu_peak_gb": 2.5}) == {gpu.GPU_PEAK_METRIC: 2.5}


def _stage_harness(monkeypatch, tmp_path):
    from tasks import runner
    from tasks.cache import StageCache

    logged: list[dict] = []
    monkeypatch.setattr(runner.tracking, "child_run", lambda parent, name: "run-1")
    monkeypatch.setattr(runner.tracking, "has_metrics", lambda run: False)
    monkeypatch.setattr(runner.tracking, "end_run", lambda run, *a, **k: None)

    def log_metrics(run, m):  # the stage's own time and RSS are there too; not checked here
        logged.append({k: v for k, v in m.items()
                       if k not in ("stage/seconds", "system/rss_peak_gb")})

    monkeypatch.setattr(runner.tracking, "log_metrics", log_metrics)
    ctx = types.SimpleNamespace(parent_run="parent", cache=StageCache(tmp_path / "cache"))
    return runner, ctx, logged


def test_cached_stage_logs_no_gpu_metric_on_cpu(monkeypatch, tmp_path):
    stages, ctx, logged = _stage_harness(monkeypatch, tmp_path)
    eng = FakeEngine()
    monkeypatch.delenv("GRPO_T_STAGE", raising=False)

    def compute(run):
        gpu.track(eng)
        os.environ["GRPO_T_STAGE"] = "1"
        return GrpoStageResult(model_dir=str(tmp_path), steps=3)

    out = stages.cached_stage(ctx, "k1", "grpo/round-1", GrpoStageResult, compute)
    assert logged == [{"grpo/steps": 3, "grpo/findings": 0}] and out.gpu_peak_gb is None
    assert eng.shutdowns == 1 and "GRPO_T_STAGE" not in os.environ


def test_cached_stage_logs_peak_when_measured(monkeypatch, tmp_path):
    stages, ctx, logged = _stage_harness(monkeypatch, tmp_path)

    @contextlib.contextmanager
    def measured():  # what stage_memory yields on a CUDA machine
        rec = gpu.StageMemory()
        yield rec
        rec.peak_gb = 12.345

    monkeypatch.setattr(stages, "stage_memory", measured)
    scored = {"synthetic": BenchmarkScore(metrics={"n": 1})}
    out = stages.cached_stage(ctx, "k2", "eval/base", EvalResult,
                              lambda run: EvalResult(benchmarks=scored))
    assert out.gpu_peak_gb == 12.345 and not out.cached
    assert logged == [{"synthetic/n": 1, "system/gpu_peak_gb": 12.345}]
    # A hit from the cache logs the stored peak into a run that has no metrics yet.
    again = stages.cached_stage(ctx, "k2", "eval/base", EvalResult,
                                lambda run: pytest.fail("recomputed"))
    assert again.cached and logged[-1] == {"synthetic/n": 1, "system/gpu_peak_gb": 12.345}
    assert again.benchmarks == scored and again.mlflow_run == "run-1"


def test_nested_blocks_keep_the_outer_peak(monkeypatch):
    class FakeCuda:  # torch.cuda's peak counter on one device, as CUDA keeps it
        def __init__(self):
            self.peak = 0

        def device_count(self):
            return 1

        def reset_peak_memory_stats(self, d):
            self.peak = 0

        def max_memory_allocated(self, d):
            return self.peak

        def empty_cache(self):
            pass

    cuda = FakeCuda()
    monkeypatch.setattr(gpu, "_torch_cuda", lambda: cuda)
    with gpu.stage_memory() as outer:
        cuda.peak = 3e9
        with gpu.stage_memory() as inner:  # resets the counter: the outer must not lose 3 GB
            cuda.peak = 1e9
        cuda.peak = 2e9
    assert inner.peak_gb == 1.0 and outer.peak_gb == 3.0
