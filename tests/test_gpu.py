"""vLLM paths: the `vllm` rollout backend and GRPO with vLLM colocated generation.

    pytest -m gpu tests/test_gpu.py        # on a GPU with the gpu extra (vllm)
    .venv-vllm/bin/python -m pytest -m vllm tests/test_gpu.py   # on CPU: `make setup-vllm`

Both use builtin:proxy-qwen2-hd32 (a Qwen2 whose 32-wide heads vLLM's CPU attention takes;
built in seconds). Skipped, with the reason, where vLLM cannot run (not installed, or its
CUDA build without a GPU).
"""
from __future__ import annotations

import gc
import importlib.util

import pytest


def _vllm_skip_reason() -> str | None:
    from grpo_core.generation.rollout import vllm_available

    if importlib.util.find_spec("vllm") is None:
        return "needs vLLM: pip install -e '.[gpu]' (GPU) or `make setup-vllm` (CPU)"
    if not vllm_available():
        return "vLLM's CUDA build needs a CUDA device (its CPU build: `make setup-vllm`)"
    return None


_REASON = _vllm_skip_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.vllm,
              pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

PROMPTS_N = 3
MAX_NEW = 16


def test_vllm_backend_has_the_rollout_interface(vllm_model_path, tmp_path):
    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.generation.rollout import Completion, SamplingParams, VLLMBackend
    from grpo_core.generation.sampling import build_backend, derive_seed, sample_seeded
    from grpo_core.prompts import render_prompt

    cfg = config_from_dict({"project": {"workdir": str(tmp_path)},
                            "rollout": {"backend": "vllm", "gpu_memory_utilization": 0.2}})
    backend, tok = build_backend(vllm_model_path, cfg)
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
    finally:  # free the engine's memory before the colocate test starts its own
        backend.shutdown()
        del backend, tok
        gc.collect()


def test_grpo_round_with_vllm_colocate(vllm_model_path, tmp_path, restore_dist_env):
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
    result = run_grpo_round(vllm_model_path, problems, cfg, tmp_path / "grpo", template="r1_zero",
                            rollout_sink=lambda step, rs: rows.extend(rs))
    assert result.steps == 2, result
    assert len(result.history) == 2, result.history
    assert len(rows) == 2 * 2 * 2  # steps x prompts x generations
    final = Path(result.output_dir)
    assert (final / "config.json").is_file()
    assert any(final.glob("*.safetensors"))
