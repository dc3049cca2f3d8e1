"""Throughput arithmetic: how fast a GRPO step is, and where its time goes. Pure Python
(torch only to ask the device), so it is tested without a trainer.

Per optimizer step the round logs (grpo_core.train.callbacks.Throughput, into TRL's
metrics, hence the round's MLflow run and history):
- throughput/gen_seconds: the step's generate-and-score calls (sampling, reward scoring,
  the old/reference log-probs TRL computes with them); 0 on steps that reuse a buffered
  generation (steps_per_generation > 1, num_iterations > 1).
- throughput/train_seconds: TRL's `step_time` (its training_step calls: forward, backward,
  and the generation inside them) minus gen_seconds; the optimizer step is in neither, as
  in TRL's step_time.
- throughput/sample_seconds, score_seconds, logprob_seconds: where gen_seconds goes:
  sampling the completions (transformers or vLLM), the reward functions, and the old
  policy's and the reference model's log-prob forwards (no grad). The rest of gen_seconds
  (tokenising, advantages) is not named.
- throughput/gen_tokens_per_s: completion tokens this process generated / gen_seconds.
- throughput/train_tokens_per_s: prompt + completion tokens (padding excluded) this
  process trained on / train_seconds.
- throughput/train_tflops: 6 x trainable parameters x trained tokens / train_seconds (the
  policy's forward and backward). With LoRA, 6 x trainable parameters undercounts the frozen
  weights' passes.
- throughput/mfu: train_tflops / peak (model FLOPs utilisation of the training part). Peak:
  train.peak_tflops, else on CUDA PEAK_TFLOPS by device name (none listed: not logged), on
  CPU this machine's own fp32 matmul rate with the threads in use (cpu_matmul_tflops,
  measured once per process and logged as throughput/peak_tflops): an MFU for a CPU.
Figures are this process's (rank 0's with several processes: one device's share).

Per stage: peak memory, `system/gpu_peak_gb` (CUDA max allocated; grpo_core.modeling.gpu)
and `system/rss_peak_gb` (the process's peak resident memory during the stage, or a
launched child's when higher: `rss_peak`)."""
from __future__ import annotations

import contextlib
import functools
import math
import resource
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "throughput/"
GEN_SECONDS = PREFIX + "gen_seconds"
TRAIN_SECONDS = PREFIX + "train_seconds"
GEN_TOK_S = PREFIX + "gen_tokens_per_s"
TRAIN_TOK_S = PREFIX + "train_tokens_per_s"
MFU = PREFIX + "mfu"
TRAIN_TFLOPS = PREFIX + "train_tflops"
PEAK = PREFIX + "peak_tflops"
STEP_PARTS = ("sample_seconds", "score_seconds", "logprob_seconds")  # inside gen_seconds
RSS_PEAK_METRIC = "system/rss_peak_gb"
IS_RATIO = "sampling/importance_sampling_ratio/mean"  # TRL's, with vLLM generation
# The pipeline process's own resident memory after each round's training (step = round): flat from
# round to round when no stage leaves memory behind in it (train.stage_process).
PIPELINE_RSS_METRIC = "system/pipeline_rss_gb"
# ... and how many processes it has left running then (0: no engine or worker outlived its stage)
PIPELINE_CHILDREN_METRIC = "system/pipeline_child_processes"
# vLLM engines the filter and eval stages started, and how often the next stage on the same
# model took the running one instead (grpo_core.generation.warm_engine; rollout.reuse_engine)
ENGINE_STARTS_METRIC = "system/vllm_engine_starts"
ENGINE_REUSES_METRIC = "system/vllm_engine_reuses"

# bf16 dense peak TFLOP/s (no sparsity), by a substring of torch.cuda.get_device_name();
# the first match wins, so the more specific names come first.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM / NVL
    ("A100", 312.0),  # 40GB and 80GB alike
    ("L40S", 362.0),
    ("A10G", 70.0),
    ("RTX 4090", 165.0),
)


def peak_tflops(device_name: str | None, override: float | None = None) -> float | None:
    """The peak to compute MFU against: `override` (train.peak_tflops) when set, else the
    table's by device name; None when the device is unknown."""
    if override is not None:
        return float(override)
    if not device_name:
        return None
    for name, peak in PEAK_TFLOPS:
        if name.lower() in device_name.lower():
            return peak
    return None


def mfu(trainable_params: int, tokens: float, seconds: float, peak_tflops_: float) -> float:
    """6 x N x tokens / seconds / peak: the fraction of the peak the training did."""
    if seconds <= 0 or peak_tflops_ <= 0:
        return math.nan
    return 6.0 * trainable_params * tokens / seconds / (peak_tflops_ * 1e12)


@functools.lru_cache(maxsize=8)
def cpu_matmul_tflops(threads: int, size: int = 1024, seconds: float = 0.5) -> float:
    """This CPU's fp32 matmul rate with `threads` threads, in TFLOP/s: the best of repeated
    `size` x `size` products over about `seconds` (after one warm-up). The peak a CPU's MFU
    is measured against: what torch's own GEMM reaches here, not a datasheet figure."""
    import time

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # a generator of its own: drawing from torch's global one would shift every sample
        # the trainer draws after it (a resumed round would sample other completions)
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
        torch.mm(a, b)
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * size ** 3 / max(time.perf_counter() - t0, 1e-9))
        return best / 1e12
    finally:
        torch.set_num_threads(before)


def cuda_device_name() -> str | None:
    """The current CUDA device's name; None without CUDA (MFU is then not logged)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


@dataclass
class StepCounts:
    """What one optimizer step did, accumulated by the trainer (grpo_core.train.trainer)."""

    gen_seconds: float = 0.0
    sample_seconds: float = 0.0
    score_seconds: float = 0.0
    logprob_seconds: float = 0.0
    gen_tokens: int = 0
    train_tokens: int = 0


def step_metrics(counts: StepCounts, step_time: float, trainable_params: int,
                 peak: float | None) -> dict[str, float]:
    """The step's throughput/* metrics (module doc) from its counts and TRL's step_time."""
    gen_s = counts.gen_seconds
    train_s = max(step_time - gen_s, 0.0)
    out = {GEN_SECONDS: gen_s, TRAIN_SECONDS: train_s,
           **{PREFIX + part: getattr(counts, part) for part in STEP_PARTS}}
    if gen_s > 0:
        out[GEN_TOK_S] = counts.gen_tokens / gen_s
    if train_s > 0:
        out[TRAIN_TOK_S] = counts.train_tokens / train_s
        out[TRAIN_TFLOPS] = 6.0 * trainable_params * counts.train_tokens / train_s / 1e12
        if peak:
            out[MFU] = mfu(trainable_params, counts.train_tokens, train_s, peak)
            out[PEAK] = peak
    return out


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def round_summary(history: Sequence[dict]) -> dict[str, float]:
    """A round's figures from its logged rows: gen_share (generation's share of the step
    time), gen_tokens_per_s and train_tokens_per_s (tokens over seconds, rows weighted by
    their seconds), the seconds of each part of generation (STEP_PARTS, summed), mfu and
    train_tflops (means of the rows that have one). {} when nothing was logged."""
    rows = [r for r in history if _finite(r.get(GEN_SECONDS)) and _finite(r.get(TRAIN_SECONDS))]
    total = _sums(rows, {GEN_SECONDS: 1, TRAIN_SECONDS: 1,
                         **{PREFIX + part: 1 for part in STEP_PARTS}})
    gen_s, train_s = total[GEN_SECONDS], total[TRAIN_SECONDS]
    if gen_s + train_s <= 0:
        return {}
    out = {"gen_share": gen_s / (gen_s + train_s), "gen_seconds": gen_s, "train_seconds": train_s,
           **{part: total[PREFIX + part] for part in STEP_PARTS if total[PREFIX + part] > 0}}
    # a rate's round figure: tokens over seconds, each row's rate weighted by its seconds
    tokens = _sums(rows, {GEN_TOK_S: GEN_SECONDS, TRAIN_TOK_S: TRAIN_SECONDS})
    if gen_s > 0:
        out["gen_tokens_per_s"] = tokens[GEN_TOK_S] / gen_s
    if train_s > 0:
        out["train_tokens_per_s"] = tokens[TRAIN_TOK_S] / train_s
    for name, key in (("mfu", MFU), ("train_tflops", TRAIN_TFLOPS), ("is_ratio", IS_RATIO)):
        if (mean := _mean(history, key)) is not None:
            out[name] = mean
    return {k: round(v, 4) for k, v in out.items()}


def _sums(rows: Sequence[dict], weights: dict) -> dict[str, float]:
    """Per key, the sum over rows of row[key] x row[weight] (weight 1: the plain sum),
    skipping rows where the key is not a finite number."""
    out = dict.fromkeys(weights, 0.0)
    for row in rows:
        for key, w in weights.items():
            if _finite(row.get(key)):
                out[key] += row[key] * (1 if w == 1 else row[w])
    return out


def _mean(history: Sequence[dict], key: str) -> float | None:
    """`key`'s mean over the rows that have it. For TRL's importance-sampling ratio (vLLM
    generation): the trainer's probability of vLLM's samples over vLLM's, 1 when the engine
    samples the policy the trainer holds."""
    vals = [r[key] for r in history if _finite(r.get(key))]
    return sum(vals) / len(vals) if vals else None


def _count(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


def format_throughput(tp: dict | None) -> str:
    """`gen 62% (sample 50%, score 2%, logprobs 9%) | 410 tok/s gen, 1.2k tok/s train |
    MFU 31% | IS ratio 1.000` (what is known of it; shares of the round's step time)."""
    if not tp:
        return ""
    parts = [f"gen {tp['gen_share']:.0%}{step_split(tp)}"] if "gen_share" in tp else []
    rates = [f"{_count(tp[k])} tok/s {w}" for k, w in
             (("gen_tokens_per_s", "gen"), ("train_tokens_per_s", "train")) if k in tp]
    if rates:
        parts.append(", ".join(rates))
    if "mfu" in tp:
        parts.append(f"MFU {tp['mfu']:.1%}")
    if "is_ratio" in tp:
        parts.append(f"IS ratio {tp['is_ratio']:.3f}")
    return " | ".join(parts)


def step_split(tp: dict) -> str:
    """` (sample 50%, score 2%, logprobs 9%)`: generation's parts as shares of the step time
    (gen_seconds + train_seconds), from round_summary's (or a step's) seconds; "" if none."""
    total = (tp.get("gen_seconds") or 0) + (tp.get("train_seconds") or 0)
    named = [(label, tp.get(part)) for label, part in
             zip(("sample", "score", "logprobs"), STEP_PARTS)]
    shown = [f"{label} {v / total:.0%}" for label, v in named if _finite(v) and v > 0 and total]
    return f" ({', '.join(shown)})" if shown else ""


def format_memory(value: dict) -> str:
    """`peak GPU 12.3 GB` and/or `peak RSS 0.6 GB` from a stage result."""
    parts = [f"peak {what} {value[k]:.1f} GB" for k, what in
             (("gpu_peak_gb", "GPU"), ("rss_peak_gb", "RSS")) if _finite(value.get(k))]
    return ", ".join(parts)


# ------------------------------------------------------------------------- peak RSS

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _hwm_bytes() -> int | None:
    """The process's peak RSS since start or the last reset (Linux VmHWM)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _maxrss_bytes(who) -> int:
    kb = resource.getrusage(who).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024  # bytes on macOS, KiB elsewhere


def rss_now_gb() -> float | None:
    """This process's resident memory now (GB, 1e9 bytes; Linux VmRSS), None elsewhere."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) * 1024 / 1e9, 4)
    except OSError:
        pass
    return None


def child_processes() -> int | None:
    """How many live processes descend from this one (Linux /proc), None elsewhere. Zombies
    and multiprocessing's resource tracker (a helper that lives as long as its parent,
    holding nothing) are not counted."""
    import os

    proc = Path("/proc")
    if not proc.is_dir():
        return None
    parents: dict[int, int] = {}
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if state != "Z" and b"resource_tracker" not in cmd:
                parents[int(d.name)] = int(ppid)
    mine, count = {os.getpid()}, 0
    changed = True
    while changed:  # every descendant, whatever the depth
        changed = False
        for pid, ppid in parents.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                count += 1
                changed = True
    return count


@dataclass
class RssPeak:
    peak_gb: float | None = None


@contextlib.contextmanager
def rss_peak() -> Iterator[RssPeak]:
    """The block's peak resident memory (GB, 1e9 bytes), in rec.peak_gb at the end: the
    process's (Linux: its high-water mark reset at entry; elsewhere the peak since start),
    or a child process's that ended in the block and peaked higher (a launched stage)."""
    rec = RssPeak()
    reset = False
    with contextlib.suppress(OSError):
        _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        reset = True
    children = _maxrss_bytes(resource.RUSAGE_CHILDREN)
    try:
        yield rec
    finally:
        own = (_hwm_bytes() if reset else None) or _maxrss_bytes(resource.RUSAGE_SELF)
        child = _maxrss_bytes(resource.RUSAGE_CHILDREN)
        peak = max(own, child if child > children else 0)
        rec.peak_gb = round(peak / 1e9, 3)


def training_compute(history: Sequence[dict], total_flos: float | None = None) -> dict[str, float]:
    """What a training stage spent, from its logged rows: `train_tokens` (TRL's cumulative
    num_tokens, its last row: prompt + completion tokens through the policy), `gen_tokens`
    (GRPO: the sum of gen_tokens_per_s x gen_seconds) and `train_tflop` (GRPO: the sum of
    train_tflops x train_seconds, i.e. 6 x parameters x tokens; SFT: the trainer's
    `total_flos`, the same estimate). {} when nothing was logged."""
    out: dict[str, float] = {}
    tokens = [r["num_tokens"] for r in history if _finite(r.get("num_tokens"))]
    if tokens:
        out["train_tokens"] = float(tokens[-1])
    gen = _sums(history, {GEN_TOK_S: GEN_SECONDS, TRAIN_TFLOPS: TRAIN_SECONDS})
    if gen[GEN_TOK_S] > 0:
        out["gen_tokens"] = gen[GEN_TOK_S]
    if gen[TRAIN_TFLOPS] > 0:
        out["train_tflop"] = gen[TRAIN_TFLOPS]
    elif total_flos:
        out["train_tflop"] = total_flos / 1e12
    return {k: round(v, 3) for k, v in out.items()}
