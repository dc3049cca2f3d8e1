"""TRL's colocated vLLM engine: project.seed reaches its seed, and it is stopped after a round
(grpo_core/train/vllm_engine.py). vLLM cannot be installed beside a CPU torch, so the engine
class is the one thing faked here (a recorder in place of vllm.LLM); TRL's own
VLLMGeneration._init_vllm builds it, on a real single-process accelerate state."""
from __future__ import annotations

import inspect

import pytest

from grpo_core.train.vllm_engine import engine_seed, release_engine, seeded_engines


class FakeLLM:
    """Stands in for vllm.LLM: records its arguments; shutdown() is counted."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        FakeLLM.built.append(kwargs)
        self.stopped = 0

    def shutdown(self):
        self.stopped += 1


def _colocated_generation(monkeypatch, tp: int = 1):
    """TRL's VLLMGeneration in colocate mode, its engine built by TRL's _init_vllm."""
    from accelerate import Accelerator
    from trl.generation import vllm_generation as tv

    monkeypatch.setattr(tv, "is_vllm_available", lambda: True)
    monkeypatch.setattr(tv, "LLM", FakeLLM, raising=False)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    gen = tv.VLLMGeneration.__new__(tv.VLLMGeneration)
    gen.model = type("M", (), {"name_or_path": "m", "named_modules": lambda self: []})()
    gen.accelerator = Accelerator(cpu=True)
    gen.mode, gen.tensor_parallel_size = "colocate", tp
    gen.gpu_memory_utilization, gen.max_model_length, gen.max_num_seqs = 0.3, None, 8
    gen.enable_sleep_mode, gen.model_impl, gen.trust_remote_code = False, "auto", False
    return gen


def test_trl_builds_its_colocated_engine_with_a_seed_argument():
    """What seeded_engines relies on: TRL passes `seed=` to vllm.LLM in _init_vllm."""
    from trl.generation.vllm_generation import VLLMGeneration

    src = inspect.getsource(VLLMGeneration._init_vllm)
    assert "self.llm = LLM(" in src and "seed=accelerator.process_index" in src


@pytest.mark.parametrize("project_seed", [0, 7])
def test_project_seed_reaches_the_colocated_engine(monkeypatch, project_seed):
    FakeLLM.built.clear()
    gen = _colocated_generation(monkeypatch)
    with seeded_engines(project_seed):
        gen._init_vllm()
    # TRL's seed on a single process is 0 (process_index // tp); ours shifts it by project.seed
    assert FakeLLM.built[-1]["seed"] == engine_seed(project_seed, 0) == project_seed * 100_003
    gen2 = _colocated_generation(monkeypatch)
    gen2._init_vllm()  # outside the block: TRL's own seed again
    assert FakeLLM.built[-1]["seed"] == 0


def test_release_engine_stops_the_colocated_engine(monkeypatch):
    gen = _colocated_generation(monkeypatch)
    gen._init_vllm()
    engine = gen.llm
    trainer = type("T", (), {})()
    trainer.vllm_generation = gen
    assert release_engine(trainer) is True
    assert engine.stopped == 1 and gen.llm is None
    assert release_engine(trainer) is False  # idempotent
    assert release_engine(type("NoVllm", (), {})()) is False  # hf generation: nothing to stop
