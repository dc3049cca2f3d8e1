"""The GPU smoke's report: the machine and versions it ran on (`environment`), the summary of
the parts' records (`summarise`), its printout (`print_summary`), and the JSON report with the
parts' log tails beside it (`write_report`)."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from gpu_smoke_parts import LR


def installed_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def environment() -> dict:
    env = {"python": sys.version.split()[0], "executable": sys.executable}
    for dist in ("torch", "vllm", "trl", "transformers", "accelerate", "datasets", "triton",
                 "flashinfer-python"):
        env[dist] = installed_version(dist)
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if env["cuda_available"]:
            p = torch.cuda.get_device_properties(0)
            env.update(gpu_name=p.name, gpu_count=torch.cuda.device_count(),
                       capability=f"{p.major}.{p.minor}",
                       gpu_memory_gib=round(p.total_memory / 2**30, 1))
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        env["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           check=False, capture_output=True, text=True, timeout=20)
        env["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        env["driver"] = None
    return env


def tail_lines(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def lookup(d: dict, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def summarise(parts: dict, env: dict) -> dict:
    v_tps = lookup(parts, "vllm", "generation", "tokens_per_s")
    h_tps = lookup(parts, "hf", "generation", "tokens_per_s")
    return {
        "gpu": env.get("gpu_name"), "torch": env.get("torch"), "vllm": env.get("vllm"),
        "generation_tokens_per_s": {"vllm": v_tps, "hf": h_tps,
                                    "vllm_over_hf": round(v_tps / h_tps, 2) if v_tps and h_tps
                                    else None},
        "vllm_engine_start_s": lookup(parts, "vllm", "engine_start_s"),
        "grpo_step_s": {"vllm": lookup(parts, "grpo_vllm", "step_s_median"),
                        "hf": lookup(parts, "grpo_hf", "step_s_median")},
        "grpo_train_s": {"vllm": lookup(parts, "grpo_vllm", "train_s"),
                         "hf": lookup(parts, "grpo_hf", "train_s")},
        "eval_s": {"vllm": lookup(parts, "eval_vllm", "eval", "seconds"),
                   "vllm_base": lookup(parts, "vllm", "eval_base", "seconds"),
                   "hf_base": lookup(parts, "hf", "eval_base", "seconds")},
        "filter_s": {"vllm": lookup(parts, "vllm", "filter", "seconds"),
                     "hf": lookup(parts, "hf", "filter", "seconds")},
        "base_greedy_accuracy": {"vllm": lookup(parts, "vllm", "eval_base", "greedy_accuracy"),
                                 "hf": lookup(parts, "hf", "eval_base", "greedy_accuracy")},
        "stop_token_text_kept": lookup(parts, "vllm", "stop_token_check", "text_kept"),
        "gpu_peak_gb": {n: r.get("gpu_peak_gb") for n, r in parts.items()},
        "gpu_peak_gb_by_stage": {n: r["gpu_peak_gb_by_stage"] for n, r in parts.items()
                                 if r.get("gpu_peak_gb_by_stage")},
        "grpo_tokens_per_s": {n: lookup(parts, n, "tokens_per_s") for n in ("grpo_vllm", "grpo_hf")},
        "grpo_weights": {n: lookup(parts, n, "weights") for n in ("grpo_vllm", "grpo_hf")},
    }


def print_summary(report: dict) -> None:
    env, sm, parts = report["env"], report["summary"], report["parts"]
    print(f"\nGPU smoke on {env.get('gpu_name') or 'no GPU'} (driver {env.get('driver')}): "
          f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), vLLM {env.get('vllm')}, "
          f"trl {env.get('trl')}, transformers {env.get('transformers')}")
    for name, rec in parts.items():
        state = "ok" if rec.get("ok") else "skipped" if rec.get("skipped") else "FAILED"
        err = "" if rec.get("ok") else f"  {str(rec.get('error', ''))[:300]}"
        print(f"  {name:<10} {state:<6} {rec.get('seconds', 0):7.1f} s{err}")
    pl = parts.get("pipeline") or {}
    if pl.get("rounds"):
        from grpo_core.train.throughput import format_throughput

        print(f"pipeline, two rounds ({pl.get('backend_note')}):")
        for n, r in pl["rounds"].items():
            print(f"  round {n}: peak GPU memory {r['gpu_peak_gb']} GB vs plan {r['plan_gb']} GB "
                  f"(plan/peak {r['plan_over_peak']}); {format_throughput(r['throughput'])}")
    if not set(parts) - {"pipeline"}:
        return  # the pipeline part alone: its lines above are the summary
    g, st, ev = sm["generation_tokens_per_s"], sm["grpo_step_s"], sm["eval_s"]
    p = report["params"]
    print(f"generation tokens/s ({p['prompts']} prompts x {p['samples']} samples, <= "
          f"{p['max_new_tokens']} new tokens, T=1): vllm {g['vllm']} | hf {g['hf']} | "
          f"vllm/hf {g['vllm_over_hf']} (vLLM engine start {sm['vllm_engine_start_s']} s)")
    print(f"GRPO step time, median wall ({p['steps']} steps, 8 prompts x 8, <= 48 tokens): "
          f"vllm colocate {st['vllm']} s | hf {st['hf']} s")
    print(f"eval time (synthetic, {p['eval_problems']} problems, greedy + 4 samples): vllm "
          f"{ev['vllm']} s | vllm base {ev['vllm_base']} s | hf base {ev['hf_base']} s")
    print(f"filter time ({p['filter_problems']} problems x k=8): vllm {sm['filter_s']['vllm']} s "
          f"| hf {sm['filter_s']['hf']} s; base greedy accuracy: vllm "
          f"{sm['base_greedy_accuracy']['vllm']} | hf {sm['base_greedy_accuracy']['hf']}; "
          f"stop token kept in vllm text: {sm['stop_token_text_kept']}")
    print(f"GRPO tokens/s (prompt + completion): {sm['grpo_tokens_per_s']}; weights at lr {LR}: "
          f"{sm['grpo_weights']}")
    print(f"peak GPU memory (GB) per part: {sm['gpu_peak_gb']}; per stage: "
          f"{sm['gpu_peak_gb_by_stage']}")


def write_report(report: dict, out: Path, logs: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    text = []
    for name in report["parts"]:
        log = logs / f"{name}.log"
        if log.is_file():
            text.append(f"===== {name} ({log}) =====\n{tail_lines(log, 150)}\n")
    if text:
        out.with_suffix(".log").write_text("".join(text))
