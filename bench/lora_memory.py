"""Peak CPU memory of a few GRPO steps with and without LoRA (model.peft), side by side.

Each run is its own process (peak RSS is a per-process high-water mark): run_grpo_round
on the same problems and config, LoRA off and on, on builtin:proxy-qwen2 (tiny: the
libraries dominate) and on a wider random Qwen2 of the same recipe (~45M params), where
what LoRA saves shows: gradients and Adam state for the adapters alone, and no reference
copy (TRL uses the base with adapters disabled).

    .venv/bin/python bench/lora_memory.py [--steps 3] [--models proxy,wide]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, load

WIDE = {"hidden_size": 1024, "intermediate_size": 2816, "num_layers": 4, "num_heads": 16,
        "num_kv_heads": 2, "warm_steps": 0}  # random weights: memory, not learning


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(model: str, lora: bool, steps: int, out: str) -> dict:
    """One GRPO round in this process; its numbers as a dict."""
    import torch

    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    torch.set_num_threads(1)
    cfg = config_from_dict({
        "model": {"peft": {"enabled": lora, "r": 16, "alpha": 32}},
        "grpo": {"max_steps": steps, "save_steps": steps, "max_completion_length": 16,
                 "per_device_train_batch_size": 8, "num_generations": 4, "learning_rate": 1e-4,
                 "beta": 0.04},
        "rewards": {"funcs": ["accuracy", "format"]}})
    seen: dict = {}

    def hook(trainer):
        seen["trainable"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        seen["params"] = sum(p.numel() for p in trainer.model.parameters())
        seen["ref_model"] = trainer.ref_model is not None
        # the high-water mark before any step: loading and wrapping the model
        seen["peak_before_training_mib"] = round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)

    base = _rss_mib()  # libraries imported, no model yet
    t0 = time.perf_counter()
    result = run_grpo_round(model, generate_problems("train", 8, levels=[1]), cfg, out, "chat",
                            trainer_hook=hook)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"steps": result.steps, "seconds": round(time.perf_counter() - t0, 1),
            "rss_after_imports_mib": round(base), "peak_rss_mib": round(peak),
            "training_mib": round(peak - base), **seen}


def build_wide(cache: Path) -> str:
    from grpo_core.modeling.proxy import ProxyRecipe, build_proxy_qwen2

    return str(build_proxy_qwen2(cache / "proxy-wide", ProxyRecipe(**WIDE)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--models", default="proxy,wide")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "LORA", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, lora, out = args.child
        print(json.dumps(child(model, lora == "1", args.steps, out)))
        return

    from grpo_core.modeling.loading import resolve_model_path

    rows = []
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        paths = {"proxy": resolve_model_path("builtin:proxy-qwen2", Path(tmp) / "models"),
                 "wide": None}
        for name in args.models.split(","):
            path = paths[name] or build_wide(Path(tmp) / "models")
            for lora in (False, True):
                out = Path(tmp) / f"{name}-{int(lora)}"
                proc = subprocess.run(
                    [sys.executable, __file__, "--steps", str(args.steps), "--child", path,
                     "1" if lora else "0", str(out)],
                    capture_output=True, text=True, check=True, cwd=ROOT,
                    env={**os.environ, "GRPO_TORCH_THREADS": "1"})
                rows.append({"model": name, "lora": lora,
                             **json.loads(proc.stdout.strip().splitlines()[-1])})
    print(f"GRPO, {args.steps} steps, 2 prompts x G 4, 16 tokens, beta 0.04, LoRA r 16 "
          f"all-linear; load {load()}")
    print(f"{'model':<6} {'lora':<5} {'params':>8} {'trainable':>10} {'ref copy':>8} "
          f"{'peak RSS MiB':>12} {'peak - imports':>14} {'of it at load':>13} {'seconds':>8}")
    for r in rows:
        print(f"{r['model']:<6} {'on' if r['lora'] else 'off':<5} {r['params'] / 1e6:>7.2f}M "
              f"{r['trainable'] / 1e6:>9.3f}M {'yes' if r['ref_model'] else 'no':>8} "
              f"{r['peak_rss_mib']:>12} {r['training_mib']:>14} "
              f"{r['peak_before_training_mib']:>13} {r['seconds']:>8}")
    for name in dict.fromkeys(r["model"] for r in rows):
        off, on = (next(r for r in rows if r["model"] == name and r["lora"] == v) for v in (False, True))
        print(f"{name}: LoRA peak RSS {on['peak_rss_mib']} vs {off['peak_rss_mib']} MiB "
              f"({on['peak_rss_mib'] / off['peak_rss_mib']:.2f}x); training part "
              f"{on['training_mib']} vs {off['training_mib']} MiB")


if __name__ == "__main__":
    main()
