"""How many torch intra-op threads a CPU stage uses: $GRPO_TORCH_THREADS when set, else
the count a short measurement at start finds fastest.

Why measure: torch's default (one thread per core) is the fastest on an idle machine and
several times slower when other work shares the cores (OpenMP threads spin-wait for the
slowest one: the issue saw 2 threads ~4x slower than 1 beside other jobs). Which holds
is a property of the moment, not of the machine, so it is measured, once per process:
`choose_threads` times the same small workload (the matmul shapes of a 135M decoder step
for a batch of rows) at 1 thread and at each power of two up to the core count, best of a
few repeats each, and keeps the fastest. ~0.1-0.3 s; skipped on CUDA (the GPU does the
work) and when the variable is set."""
from __future__ import annotations

import os
import time

ENV = "GRPO_TORCH_THREADS"
_chosen: int | None = None  # once per process: the measurement is a start-up cost


def candidates(cores: int) -> list[int]:
    """1, 2, 4, ... up to `cores`, and `cores` itself."""
    out, n = [], 1
    while n < cores:
        out.append(n)
        n *= 2
    return [*out, max(cores, 1)]


def time_threads(n: int, repeats: int = 3, rows: int = 32, hidden: int = 576,
                 inner: int = 1536) -> float:
    """Best-of-`repeats` seconds of a decoder-step-like workload (rows x hidden against
    hidden x inner and back, 4 times) on `n` threads."""
    import torch

    torch.set_num_threads(n)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=g)
    up = torch.randn(hidden, inner, generator=g)
    down = torch.randn(inner, hidden, generator=g)
    best = float("inf")
    with torch.inference_mode():
        (x @ up) @ down  # warm the thread pool: its start is no part of the steady state
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(4):
                (x @ up) @ down
            best = min(best, time.perf_counter() - t0)
    return best


def choose_threads(cores: int | None = None) -> tuple[int, dict[int, float]]:
    """(the fastest thread count now, {count: seconds}) over `candidates(cores)`."""
    if cores is None:  # the cores this process may run on, not the machine's
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    times = {n: time_threads(n) for n in candidates(cores)}
    return min(times, key=times.get), times


def configure_threads() -> int | None:
    """Set torch's intra-op threads: $GRPO_TORCH_THREADS when set, else (on CPU) the
    measured fastest count, measured once per process. Returns the count set (None:
    left to torch, on CUDA)."""
    global _chosen
    import torch

    n = os.environ.get(ENV)
    if n:
        torch.set_num_threads(max(1, int(n)))
        return torch.get_num_threads()
    if torch.cuda.is_available():
        return None
    if _chosen is None:
        _chosen, _ = choose_threads()
    torch.set_num_threads(_chosen)
    return _chosen
