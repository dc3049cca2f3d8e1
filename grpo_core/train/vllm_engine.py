"""TRL's colocated vLLM engine (grpo.use_vllm, vllm_mode colocate): seeded by project.seed,
and shut down when the round ends.

TRL 1.16 builds the engine in `trl.generation.vllm_generation.VLLMGeneration._init_vllm` as
`LLM(..., seed=accelerator.process_index // tensor_parallel_size)`: no GRPOConfig field
reaches that seed, and a `seed` in generation_kwargs would seed every request alike (TRL
samples each prompt's G copies as separate n=1 requests: the group would be one completion
G times). `seeded_engines` shifts the engine seed by project.seed while the trainer is
built, keeping TRL's per-tensor-parallel-group offset (ranks of one group must sample alike).

The engine lives as long as the trainer (`trainer.vllm_generation.llm`). A round that runs
in the pipeline's process (train.stage_process=never) would carry it, ~vllm_gpu_memory_
utilization of the GPU, into the next stage: `release_engine` stops it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

SEED_STRIDE = 100_003  # project seeds apart by more than any count of TP groups


def engine_seed(project_seed: int, trl_seed: int) -> int:
    """The engine seed for TRL's own `trl_seed` (process_index // tp) under project.seed."""
    return project_seed * SEED_STRIDE + trl_seed


@contextlib.contextmanager
def seeded_engines(project_seed: int, cpu_kv_cache_gib: int = 1,
                   threads: int | None = None) -> Iterator[None]:
    """While the block runs (the trainer's construction), every colocated engine TRL builds
    gets engine_seed(project_seed, TRL's seed), and on a CPU the CPU engine's settings
    (grpo_core.generation.vllm_cpu: plain weights for the push, eager mode, a short
    max_model_len unless grpo.vllm_max_model_length sets one). Without vLLM there is
    nothing to seed."""
    try:
        from trl.generation import vllm_generation as tv
    except ImportError:
        yield
        return
    build = getattr(tv, "LLM", None)  # imported by TRL only when vLLM is installed
    if build is None:
        yield
        return

    from grpo_core.generation import vllm_cpu

    def seeded(*args, **kwargs):
        kwargs["seed"] = engine_seed(project_seed, int(kwargs.get("seed") or 0))
        vllm_cpu.configure_process(threads, cpu_kv_cache_gib, in_process=False)
        vllm_cpu.keep_plain_weights()
        return build(*args, **vllm_cpu.engine_kwargs(kwargs))

    tv.LLM = seeded
    try:
        yield
    finally:
        tv.LLM = build


def release_engine(trainer) -> bool:
    """Stop the trainer's colocated vLLM engine, if it has one; True when it did."""
    from grpo_core.generation.rollout import stop_vllm_engine

    gen = getattr(trainer, "vllm_generation", None)
    llm = getattr(gen, "llm", None)
    if llm is None:
        return False
    gen.llm = None
    stop_vllm_engine(llm)
    return True
