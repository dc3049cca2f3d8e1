"""GPU memory hygiene between in-process stages.

    with stage_memory() as mem:      # one pipeline stage (filter, SFT, a GRPO round, eval)
        backend, tok = build_backend(...)   # registered: shut down when the block ends
        ...
    mem.peak_gb                      # peak CUDA memory of the block, None without CUDA

On leaving the block, even by an exception:
- every rollout backend that `build_backend` made inside it is shut down (`shutdown()`:
  a vLLM engine stops and its distributed state is torn down; an hf backend drops its model);
- the environment is restored: variables set inside are removed, changed ones get their old
  value back (TRL's colocated vLLM sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
  MASTER_PORT in this process; vLLM and HF_TOKEN handling set others);
- `gc.collect()`, then `torch.cuda.empty_cache()` when CUDA was initialised.

Peak memory: `torch.cuda.max_memory_allocated` over the visible devices, its counter reset at
the block's start. It counts this process's torch allocations only: a vLLM V1 engine runs in
its own process, and a stage run under `accelerate launch` runs in others. CUDA is never
initialised here just to measure (a CUDA context made before vLLM starts its workers forces
them to spawn): a block that first touches CUDA is measured from the process's start, which is
the same thing. Blocks nest (a stage and its parts): an outer block's peak includes its
inner ones'. On a CPU-only machine `peak_gb` stays None.
"""
from __future__ import annotations

import contextlib
import contextvars
import gc
import logging
import os
import sys
import weakref
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

GPU_PEAK_METRIC = "system/gpu_peak_gb"


@dataclass
class StageMemory:
    """What a stage_memory block saw: its peak (GB, 1e9 bytes) and what it cleaned up."""

    peak_gb: float | None = None
    released: int = 0  # backends shut down
    env_restored: list[str] = field(default_factory=list)  # variables put back or removed
    _engines: list = field(default_factory=list, repr=False)  # weak references
    _inner_peak: float = field(default=0.0, repr=False)  # bytes, from nested blocks' resets
    _child_peak: float = field(default=0.0, repr=False)  # bytes, stage processes that ended


_ACTIVE: contextvars.ContextVar[tuple[StageMemory, ...]] = contextvars.ContextVar(
    "grpo_stage_memory", default=())


def track(backend):
    """Register `backend` for shutdown at the end of the innermost stage_memory block (weakly:
    a backend dropped earlier is just gone). Outside any block: nothing. Returns `backend`."""
    stack = _ACTIVE.get()
    if stack:
        with contextlib.suppress(TypeError):  # an object without weakref support: not tracked
            stack[-1]._engines.append(weakref.ref(backend))
    return backend


def release(backend) -> bool:
    """Call `backend.shutdown()` when it has one; True when it did. Errors are logged, never
    raised: cleanup must not hide the stage's own result or exception."""
    stop = getattr(backend, "shutdown", None)
    if not callable(stop):
        return False
    try:
        stop()
    except Exception as exc:  # noqa: BLE001 - best effort, logged
        log.warning("shutting down %s failed: %s: %s", type(backend).__name__,
                    type(exc).__name__, exc)
        return False
    return True


def _torch_cuda():
    """torch.cuda when torch is already imported and CUDA is initialised in this process."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        return cuda if cuda.is_available() and cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken CUDA setup is the stage's problem, not ours
        return None


def _devices(cuda) -> range:
    try:
        return range(cuda.device_count())
    except Exception:  # noqa: BLE001
        return range(0)


def empty_cuda_cache() -> None:
    gc.collect()
    cuda = _torch_cuda()
    if cuda is not None:
        with contextlib.suppress(Exception):
            cuda.empty_cache()


def _restore_env(saved: dict[str, str]) -> list[str]:
    changed = []
    for k in [k for k in os.environ if k not in saved]:
        os.environ.pop(k, None)
        changed.append(k)
    for k, v in saved.items():
        if os.environ.get(k) != v:
            os.environ[k] = v
            changed.append(k)
    return sorted(changed)


def report_child_peak(peak_gb: float | None) -> None:
    """A stage's own process (tasks/launch.py) ended having peaked at `peak_gb` GB of CUDA
    memory: it counts in the peak of every open stage_memory block (this process may never
    have touched CUDA itself)."""
    if peak_gb:
        for rec in _ACTIVE.get():
            rec._child_peak = max(rec._child_peak, peak_gb * 1e9)


def process_peak_gb() -> float | None:
    """This process's peak CUDA memory since it started (GB), None without CUDA in use:
    what a stage's own process reports back (report_child_peak)."""
    cuda = _torch_cuda()
    if cuda is None:
        return None
    peaks = [0]
    for d in _devices(cuda):
        with contextlib.suppress(Exception):
            peaks.append(cuda.max_memory_allocated(d))
    return round(max(peaks) / 1e9, 3)


def _record_peak(rec) -> None:
    """rec.peak_gb: the block's peak, its nested blocks' and its stage processes' included;
    handed on to the blocks around it (this block's reset hid its peak from theirs)."""
    cuda = _torch_cuda()
    if cuda is None:
        if rec._child_peak:
            rec.peak_gb = round(rec._child_peak / 1e9, 3)
        return
    peaks = [rec._inner_peak, rec._child_peak]
    for d in _devices(cuda):
        with contextlib.suppress(Exception):
            peaks.append(cuda.max_memory_allocated(d))
    rec.peak_gb = round(max(peaks) / 1e9, 3)
    for outer in _ACTIVE.get():
        outer._inner_peak = max(outer._inner_peak, max(peaks))


@contextlib.contextmanager
def stage_memory(restore_env: bool = True):
    """One stage's GPU hygiene (module doc); yields a StageMemory filled in at the end."""
    rec = StageMemory()
    saved = dict(os.environ) if restore_env else None
    cuda = _torch_cuda()
    if cuda is not None:
        before = 0
        for d in _devices(cuda):
            with contextlib.suppress(Exception):
                before = max(before, cuda.max_memory_allocated(d))
                cuda.reset_peak_memory_stats(d)
        for outer in _ACTIVE.get():  # the reset would hide their peak so far
            outer._inner_peak = max(outer._inner_peak, before)
    token = _ACTIVE.set((*_ACTIVE.get(), rec))
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)
        _record_peak(rec)
        gc.collect()  # a dropped backend in a reference cycle: collected (and stopped) now
        for ref in reversed(rec._engines):
            backend = ref()
            if backend is not None and release(backend):
                rec.released += 1
        rec._engines.clear()
        if saved is not None:
            rec.env_restored = _restore_env(saved)
            if rec.env_restored:
                log.debug("stage restored environment variables %s", rec.env_restored)
        empty_cuda_cache()


def peak_metrics(value: dict) -> dict:
    """{GPU_PEAK_METRIC: gb} for a stage result that carries `gpu_peak_gb`, else {}."""
    peak = value.get("gpu_peak_gb") if isinstance(value, dict) else None
    return {GPU_PEAK_METRIC: peak} if isinstance(peak, (int, float)) else {}
