"""The device kit's pipeline part (infra/device/gpu_smoke.py --parts pipeline): a two-round `grpo run`
of a GPU-shaped config on builtin:proxy-qwen2, read back from its MLflow store.

GPU-shaped: configs/models/qwen2.5-0.5b-instruct.yaml as it is (fp32 master weights with bf16
autocast, TRL's colocated vLLM for GRPO generation, the vLLM rollout backend for filter and
eval, train.stage_process auto: each stage in its own process on CUDA) with the model swapped
for the proxy, synthetic data and sizes cut to minutes. Where vLLM does not import, both vLLM
switches are off (hf backend, transformers generation) and the part says so.

    cfg = pipeline_config(workdir, use_vllm)      # validated PipelineConfig (what --dry-run checks)
    path = write_config(cfg_tree, path)           # the YAML `grpo run` reads
    check_with_cli(path)                          # `grpo config show PATH`: the CLI's validation
    run_pipeline(s, rec)                          # the part: run, read back, check

Per round it prints and records the peak CUDA memory the round's process reached
(system/gpu_peak_gb of grpo/round-N) against grpo_core.modeling.memory_plan's plan for the
config, and the round's throughput (throughput/round/*: generation share, generated and
trained tokens/s, MFU); the pipeline process's own RSS after each round
(system/pipeline_rss_gb). Checks: the run exits 0, each round has its throughput, on CUDA
each round has a peak and round 2's is within ROUND_MARGIN of round 1's (nothing of round 1
is held into round 2).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "configs" / "models" / "qwen2.5-0.5b-instruct.yaml"
ROUND_MARGIN = 0.10  # round 2's peak may exceed round 1's by this share (allocator noise)
TOKENS = 48


def config_tree(workdir: str | Path, use_vllm: bool) -> dict:
    """The preset, extended: the proxy, synthetic data, 2 rounds of 4 steps, small evals."""
    work = Path(workdir) / "pipeline"
    return {
        "extends": str(PRESET),
        "project": {"name": "gpu-smoke-pipeline", "workdir": str(work), "seed": 0},
        "model": {"name_or_path": "builtin:proxy-qwen2"},
        "data": {"train": [{"source": "synthetic:arith", "limit": 96, "levels": [1, 2]}]},
        "rollout": {"backend": "vllm" if use_vllm else "hf", "max_new_tokens": TOKENS,
                    "batch_size": 256},
        "filter": {"k": 4, "max_problems": 32},
        "sft_stage": {"enabled": False},
        "grpo": {"max_steps": 4, "save_steps": 1000, "max_completion_length": TOKENS,
                 "per_device_train_batch_size": 16, "gradient_accumulation_steps": 2,
                 "logging_steps": 1, "use_vllm": use_vllm},
        "rounds": {"count": 2},
        "eval": {"benchmarks": ["synthetic"], "limit": 32, "samples": 4,
                 "max_new_tokens": TOKENS, "primary_metric": "flexible/avg@4", "bootstrap": 100},
        "tracking": {"tracking_uri": f"sqlite:///{work.resolve()}/mlflow.db"},
    }


def write_config(tree: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def pipeline_config(workdir: str | Path, use_vllm: bool):
    """The part's config, validated as `grpo run` would load it (extends resolved)."""
    from grpo_core.config import load_config

    return load_config(write_config(config_tree(workdir, use_vllm),
                                    Path(workdir) / "pipeline.yaml"))


def check_with_cli(path: str | Path, timeout: float = 300) -> tuple[bool, str]:
    """`grpo config show PATH`, the CLI's own validation of what the part will run."""
    r = subprocess.run([sys.executable, "-m", "flows.cli", "config", "show", str(path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    return r.returncode == 0, " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])


def vllm_choice() -> tuple[bool, str]:
    """(use vLLM, what the output says): vLLM where it imports and CUDA is there."""
    from grpo_core.generation.rollout import vllm_available

    if vllm_available():
        return True, "vLLM imports: GRPO generation on TRL's colocated vLLM, filter/eval on vLLM"
    return False, "vLLM does not import here (or no CUDA): the hf backend and transformers generation"


def _round_runs(tracking_uri: str, experiment: str) -> tuple[dict, dict]:
    """{round: its grpo run's metrics}, {round: pipeline RSS after it}."""
    from mlflow.tracking import MlflowClient

    from tasks.tracking.mlflow_client import stage_of

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id]) if exp else []
    rounds = {}
    for run in runs:
        stage = stage_of(run)
        if stage.startswith("grpo/round-"):
            rounds[int(stage.rsplit("-", 1)[1])] = dict(run.data.metrics)
    parent = next((r for r in runs if "mlflow.parentRunId" not in r.data.tags), None)
    rss = {m.step: m.value for m in client.get_metric_history(parent.info.run_id,
                                                               "system/pipeline_rss_gb")} \
        if parent else {}
    return rounds, rss


def gpu_gb() -> float | None:
    """The first GPU's memory (GB, 1e9 bytes), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.get_device_properties(0).total_memory / 1e9, 1)


def missing_services() -> list[str]:
    """What `grpo run` needs beyond the smoke's own imports: Prefect and MLflow (the lent
    device image has neither, and they do not fit its 64 MiB carry: infra/device/README.md)."""
    import importlib.util

    return [m for m in ("prefect", "mlflow") if importlib.util.find_spec(m) is None]


def run_pipeline(s: dict, rec: dict, timeout: float = 300) -> None:
    """The part (gpu_smoke_parts.PART_FUNCS["pipeline"]): fills rec, appends failed checks."""
    from grpo_core.modeling.memory_plan import memory_plan
    from grpo_core.train.throughput import PREFIX, format_throughput

    if missing := missing_services():
        rec.setdefault("failed_checks", []).append(
            f"`grpo run` needs {' and '.join(missing)}: install the project (make setup)")
        return

    use_vllm, said = vllm_choice()
    print(f"pipeline: {said}", flush=True)
    cfg = pipeline_config(s["workdir"], use_vllm)
    path = Path(s["workdir"]) / "pipeline.yaml"
    rec.update(backend="vllm" if use_vllm else "hf", backend_note=said, config=str(path))
    cuda_gb = gpu_gb()
    plan = memory_plan(cfg, gpu_gb=cuda_gb or 80.0)  # colocated vLLM reserves a share of it
    rec["plan_gb"] = plan.get("total_gb")
    r = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(path), "--quiet"],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    print(r.stdout[-4000:], r.stderr[-4000:], sep="\n", flush=True)
    checks = rec.setdefault("failed_checks", [])
    if r.returncode != 0:
        checks.append(f"grpo run exited {r.returncode}")
        return
    rounds, rss = _round_runs(cfg.tracking.tracking_uri, cfg.tracking.experiment or cfg.project.name)
    rec["rounds"], rec["pipeline_rss_gb"] = {}, rss
    for n in (1, 2):
        m = rounds.get(n, {})
        tp = {k.removeprefix(f"{PREFIX}round/"): v for k, v in m.items()
              if k.startswith(f"{PREFIX}round/")}
        peak = m.get("system/gpu_peak_gb")
        ratio = round(rec["plan_gb"] / peak, 2) if peak and rec["plan_gb"] else None
        rec["rounds"][n] = {"gpu_peak_gb": peak, "plan_gb": rec["plan_gb"], "plan_over_peak": ratio,
                            "rss_peak_gb": m.get("system/rss_peak_gb"), "throughput": tp}
        print(f"round {n}: peak GPU memory {peak} GB vs plan {rec['plan_gb']} GB "
              f"(plan/peak {ratio}); {format_throughput(tp) or 'no throughput logged'}; "
              f"pipeline RSS after it {rss.get(n)} GB", flush=True)
        if not tp.get("gen_tokens_per_s") or not tp.get("train_tokens_per_s"):
            checks.append(f"round {n}: no throughput figures in its MLflow run")
        if cuda_gb and peak is None:
            checks.append(f"round {n}: no peak GPU memory in its MLflow run")
    p1, p2 = (rec["rounds"][n]["gpu_peak_gb"] for n in (1, 2))
    if p1 and p2 and p2 > p1 * (1 + ROUND_MARGIN):
        checks.append(f"round 2 peaked at {p2} GB, over round 1's {p1} GB + {ROUND_MARGIN:.0%}: "
                      "memory crossed the round")
