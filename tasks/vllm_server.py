"""GRPO with vLLM in server mode: `trl vllm-serve` on dedicated GPUs, training on the rest.

With grpo.use_vllm, grpo.vllm_mode=server and train.vllm_server_launch, the GRPO stage
starts the server for the round on the first train.vllm_server_gpus visible GPUs, waits
for /health, trains through `accelerate launch` on the remaining GPUs (a subprocess, so
CUDA_VISIBLE_DEVICES can still be chosen for it), and stops the server when the round
ends, however it ends. TRL's trainer pushes the new weights to the server each step.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from grpo_core.config import PipelineConfig


def launches_server(cfg: PipelineConfig) -> bool:
    g = cfg.grpo
    return g.use_vllm and g.vllm_mode == "server" and cfg.train.vllm_server_launch


def visible_gpus(env: dict | None = None, count: int | None = None) -> list[str]:
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    if count is None:
        import torch

        count = torch.cuda.device_count()
    return [str(i) for i in range(count)]


def split_gpus(gpus: list[str], server_gpus: int) -> tuple[list[str], list[str]]:
    """(server's GPUs, training's GPUs); both must be non-empty."""
    if len(gpus) <= server_gpus:
        raise RuntimeError(
            f"train.vllm_server_gpus={server_gpus} leaves no GPU for training ({len(gpus)} "
            f"visible: {gpus or 'none'}); use vllm_mode=colocate on a single GPU")
    return gpus[:server_gpus], gpus[server_gpus:]


def server_command(cfg: PipelineConfig, model_path: str) -> list[str]:
    """trl vllm-serve on train.vllm_server_gpus GPUs: vllm_server_data_parallel_size
    replicas, each tensor-parallel over the rest; the server's own memory share."""
    g, t = cfg.grpo, cfg.train
    dp = t.vllm_server_data_parallel_size
    return [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", model_path,
            "--tensor_parallel_size", str(t.vllm_server_gpus // dp), "--data_parallel_size", str(dp),
            "--host", g.vllm_server_host, "--port", str(g.vllm_server_port),
            "--gpu_memory_utilization", str(t.vllm_server_gpu_memory_utilization)]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def vllm_server(cfg: PipelineConfig, model_path: str, log_path: Path) -> Iterator[dict]:
    """Run the server for the duration; yields the env the training ranks need
    ({"CUDA_VISIBLE_DEVICES": ...}), or {} when this config launches no server."""
    if not launches_server(cfg):
        yield {}
        return
    server, train = split_gpus(visible_gpus(), cfg.train.vllm_server_gpus)
    g = cfg.grpo
    url = f"http://{g.vllm_server_host}:{g.vllm_server_port}/health"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        proc = subprocess.Popen(server_command(cfg, model_path),
                                env={**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(server)},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + g.vllm_server_timeout
            while not _healthy(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"trl vllm-serve exited with {proc.returncode}; see {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server not healthy at {url} after "
                                       f"{g.vllm_server_timeout:g} s; see {log_path}")
                time.sleep(2)
            yield {"CUDA_VISIBLE_DEVICES": ",".join(train)}
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
