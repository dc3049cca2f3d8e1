"""GPU paths: the `vllm` rollout backend and GRPO with vLLM colocated generation.

    pytest -m gpu tests/test_gpu.py        # needs CUDA and the gpu extra (vllm)

Both use the built-in tiny model (built into a tmp cache, well under 2 minutes). Skipped,
with the reason, unless torch sees a CUDA device and vllm is importable.
"""
from __future__ import annotations

import gc
import importlib.util
import os

import pytest


def _gpu_skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA device (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("vllm") is None:
        return "needs vLLM: pip install -e '.[gpu]'"
    return None


_REASON = _gpu_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

PROMPTS_N = 3
MAX_NEW = 16
# TRL's colocate mode writes these for vLLM's external launcher; put them back afterwards.
_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    from grpo_core.modeling.loading import resolve_model_path

    return resolve_model_path("builtin:tiny-arith", tmp_path_factory.mktemp("models"))


@pytest.fixture
def restore_dist_env():
    saved = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_vllm_backend_has_the_rollout_interface(tiny_path, tmp_path):
    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.generation.rollout import Completion, SamplingParams, VLLMBackend
    from grpo_core.generation.sampling import build_backend, derive_seed, sample_seeded
    from grpo_core.prompts import render_prompt

    cfg = config_from_dict({"project": {"workdir": str(tmp_path)},
                            "rollout": {"backend": "vllm", "gpu_memory_utilization": 0.2}})
    backend, tok = build_backend(tiny_path, cfg)
    assert isinstance(backend, VLLMBackend)
    problems = generate_problems("eval", n=4, seed=0)
    prompts = [render_prompt(p.problem, "r1_zero") for p in problems]
    try:
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW, seed=0)
        out = backend.sample(prompts, PROMPTS_N, params)
        assert len(out) == len(prompts)
        for per_prompt in out:
            assert len(per_prompt) == PROMPTS_N
            for c in per_prompt:
                assert isinstance(c, Completion)
                assert isinstance(c.text, str)
                assert c.finish_reason in ("stop", "length")
                assert 0 < c.num_tokens <= MAX_NEW
                assert c.truncated == (c.finish_reason == "length")
                if c.finish_reason == "length":
                    assert c.num_tokens == MAX_NEW

        greedy = backend.sample(prompts, 1, SamplingParams(temperature=0.0,
                                                           max_new_tokens=MAX_NEW))
        assert [len(g) for g in greedy] == [1] * len(prompts)

        # Seeded sampling: prompt i's draws depend on its seed only, not on its neighbours.
        seeds = [derive_seed(0, "gpu-test", p.fingerprint) for p in problems]
        both = sample_seeded(backend, prompts, 2, params, seeds)
        alone = sample_seeded(backend, prompts[1:2], 2, params, seeds[1:2])
        assert [c.text for c in both[1]] == [c.text for c in alone[0]]
    finally:  # free the engine's GPU memory before the colocate test starts its own
        import torch

        del backend, tok
        gc.collect()
        torch.cuda.empty_cache()


def test_grpo_round_with_vllm_colocate(tiny_path, tmp_path, restore_dist_env):
    from pathlib import Path

    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    cfg = config_from_dict({
        "project": {"workdir": str(tmp_path / "work")},
        "grpo": {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.2,
                 "max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 4,
                 "max_completion_length": MAX_NEW, "save_steps": 1000},
    })
    problems = generate_problems("train", n=8, levels=[1], seed=0)
    rows: list[dict] = []
    result = run_grpo_round(tiny_path, problems, cfg, tmp_path / "grpo", template="r1_zero",
                            rollout_sink=lambda step, rs: rows.extend(rs))
    assert result.steps == 2, result
    assert len(result.history) == 2, result.history
    assert len(rows) == 2 * 2 * 2  # steps x prompts x generations
    final = Path(result.output_dir)
    assert (final / "config.json").is_file()
    assert any(final.glob("*.safetensors"))
