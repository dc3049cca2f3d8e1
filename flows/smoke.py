"""`grpo run CONFIG --smoke`: a config's whole DAG, its structure intact, on a CPU in minutes.

The same stages, templates, rewards, gradient accumulation, precision rule, stop rule,
benchmarks and splits, and decontamination as the config; only sizes change
(`smoke_overrides`): the model becomes `builtin:proxy-qwen2` (a small warm-started bf16 Qwen2 with
multi-token tags and ChatML) unless `--model` names one, generation runs on the hf backend
in one process, each training stage takes 2 optimizer steps, each benchmark 4 problems,
completions ~16 tokens. It runs in its own workspace (<workdir>/smoke: its own store,
MLflow and checkpoints) and writes <workdir>/reports/smoke.json: the stages and steps run,
eval splits and problem counts, decontamination counts, the master-weight dtype training
held, the parameter change of every training stage, each GRPO round's throughput and each
stage's peak memory (grpo_core/train/throughput.py), and the memory plan of the config's
real model on a GPU (grpo_core/modeling/memory_plan.py).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_core.config import PipelineConfig, config_from_dict
from grpo_core.eval.metric_names import at_samples
from grpo_core.findings import Finding

if TYPE_CHECKING:
    from tasks.stage_results import PipelineResult

PROXY = "builtin:proxy-qwen2"
STEPS = 2  # optimizer steps per training stage
EVAL_PROBLEMS = 4  # problems per benchmark
EVAL_SAMPLES = 2
TOKENS = 16  # completion budget everywhere
FILTER_PROBLEMS = 8
SOURCE_LIMIT = 32  # training rows kept per source (the whole source is still ingested)
PROBE_PROBLEMS = 4  # each memorisation probe set


def smoke_overrides(cfg: PipelineConfig, model: str | None = None,
                    workdir: str | Path | None = None) -> PipelineConfig:
    """cfg shrunk for a CPU smoke run, everything structural kept (see the module doc).
    Raises ConfigError (naming the field) when the shrunk config cannot run."""
    from grpo_core.modeling.memory_plan import gradient_checkpointing
    from grpo_core.workspace import Workspace

    tree = cfg.model_dump(mode="json")
    g = cfg.grpo
    # Checkpointing as the real model would train (the proxy is builtin:, default off).
    ckpt = gradient_checkpointing(cfg, g.activation_checkpointing)
    tree["project"]["workdir"] = str(Path(workdir) if workdir is not None
                                     else Workspace.at(cfg.project.workdir).root / "smoke")
    tree["model"]["name_or_path"] = model or PROXY
    tree["model"]["gguf_file"] = None if model is None else cfg.model.gguf_file
    tree["model"]["dtype"] = "auto"  # float32 sampling on CPU (the proxy is stored bf16)
    tree["model"]["hub_token"] = None
    # One process; each pass holds at most 2 groups of at most 2 completions; the passes
    # per generation (steps_per_generation, default GA) and GA stay as configured.
    group = min(g.num_generations, 2)
    per_pass = group * max(1, min(2, g.per_device_train_batch_size * cfg.train.num_processes
                                   // g.num_generations))
    steps = (g.generation_batch_size // (g.per_device_train_batch_size * cfg.train.num_processes)
             if g.generation_batch_size else g.steps_per_generation)
    # Enough rows per source for one generation batch, few beyond.
    keep = max(SOURCE_LIMIT, per_pass * (steps or g.gradient_accumulation_steps) // group)
    # ... and for the RL part (data.sft_share) to hold every round's window and the probe's
    # held-back set (grpo_core/data/stage_split.py), with room for the split's variance.
    tree["probe"]["problems"] = min(cfg.probe.problems, PROBE_PROBLEMS)
    window = max(min(cfg.filter.max_problems or FILTER_PROBLEMS, FILTER_PROBLEMS), keep)
    rl_need = cfg.rounds.count * window + PROBE_PROBLEMS
    keep = max(keep, math.ceil(1.5 * rl_need / max(1.0 - cfg.data.sft_share, 0.1)))
    for src in tree["data"]["train"]:
        src["limit"] = min(src.get("limit") or keep, keep)
    tree["rollout"].update(backend="hf", max_new_tokens=TOKENS, batch_size=16,
                           tensor_parallel_size=1, data_parallel_size=1)
    tree["filter"].update(k=2, max_problems=min(cfg.filter.max_problems or FILTER_PROBLEMS,
                                                FILTER_PROBLEMS), shards=1)
    tree["grpo"].update(max_steps=STEPS, save_steps=STEPS, max_completion_length=TOKENS,
                        num_generations=group, per_device_train_batch_size=per_pass,
                        steps_per_generation=steps, generation_batch_size=None,
                        activation_checkpointing=ckpt, use_vllm=False)
    sft = cfg.sft
    tree["sft"].update(max_steps=STEPS, per_device_train_batch_size=min(sft.per_device_train_batch_size, 4),
                       max_length=min(sft.max_length, 1024),
                       activation_checkpointing=gradient_checkpointing(cfg, sft.activation_checkpointing))
    tree["eval"].update(limit=EVAL_PROBLEMS, samples=EVAL_SAMPLES, max_new_tokens=TOKENS,
                        bootstrap=50, shards=1,
                        primary_metric=at_samples(cfg.eval.primary_metric, EVAL_SAMPLES))
    tree["train"].update(num_processes=1, num_machines=1, accelerate_config=None,
                         main_process_port=None, vllm_server_launch=False)
    # 16 tokens of a proxy (or any model) solve nothing: the DAG runs on, as it would not
    # stop for a real model that starts with signal.
    tree["diagnosis"]["stop_on_collapsed_start"] = False
    # Its own MLflow store: a smoke run never lands on the user's tracking server.
    tree["tracking"]["tracking_uri"] = f"sqlite:///{Path(tree['project']['workdir']).resolve()}/mlflow.db"
    smoke = config_from_dict(tree)
    if model is not None:  # a gated --model still needs the user's token
        smoke.model.hub_token = cfg.model.hub_token
    return smoke


class Recorder:
    """What the smoke observes while the normal pipeline runs: each stage's inputs and
    result, and the dtype of the parameters each training stage loaded."""

    def __init__(self):
        self.stages: list[dict] = []
        self.loaded: dict[str, str] = {}  # model path -> parameter dtype loaded for training


@contextlib.contextmanager
def observe():
    """Wrap tasks.stages' stage functions and load_for_training (module attributes the
    flow looks up at call time) to record them; restored on exit."""
    from prefect.states import State

    import grpo_core.train.grpo
    import grpo_core.train.sft
    from tasks import stages

    rec = Recorder()
    saved = {}

    def loader(orig):
        def load_for_training(model_path):
            model, stored = orig(model_path)
            rec.loaded[str(model_path)] = str(next(model.parameters()).dtype).removeprefix("torch.")
            return model, stored
        return load_for_training

    def stage(name, orig):
        sig = inspect.signature(orig)

        def recorded(*args, **kwargs):
            out = orig(*args, **kwargs)
            # a cached stage inside a task run returns its result in a `Cached` state
            rec.stages.append({"stage": name, "args": sig.bind(*args, **kwargs).arguments,
                               "out": out.result() if isinstance(out, State) else out})
            return out
        return recorded

    for mod in (grpo_core.train.grpo, grpo_core.train.sft):
        saved[(mod, "load_for_training")] = mod.load_for_training
        mod.load_for_training = loader(mod.load_for_training)
    for name in ("ingest", "evaluate_model", "sft", "grpo_round", "difficulty_filter"):
        saved[(stages, name)] = getattr(stages, name)
        setattr(stages, name, stage(name, getattr(stages, name)))
    try:
        yield rec
    finally:
        for (mod, name), fn in saved.items():
            setattr(mod, name, fn)


def param_change_norm(before: str | Path, after: str | Path) -> float:
    """L2 norm of (after - before) over every tensor of two saved checkpoints, in float32."""
    import torch

    a, b = _weights(Path(before)), _weights(Path(after))
    total = 0.0
    for name, t in b.items():
        if name in a:
            total += float(torch.sum((t.float() - a[name].float()) ** 2))
    return total ** 0.5


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _master_dtype(rec: Recorder, model_path: str) -> tuple[str, str]:
    """(dtype, how known): observed while training, else (a cached stage) what
    load_for_training gives for that input now."""
    if model_path in rec.loaded:
        return rec.loaded[model_path], "observed"
    from grpo_core.modeling.loading import load_for_training

    model, _ = load_for_training(model_path)
    return str(next(model.parameters()).dtype).removeprefix("torch."), "load_for_training (stage cached)"


def stage_figures(res) -> dict:
    """A stage result's measured figures: peak memory (rss_peak_gb, gpu_peak_gb) and a GRPO
    round's throughput summary (grpo_core.train.throughput.round_summary), when present."""
    figures = {"throughput": getattr(res, "throughput", None) or None,
               "rss_peak_gb": res.rss_peak_gb, "gpu_peak_gb": res.gpu_peak_gb}
    return {k: v for k, v in figures.items() if v is not None}


def build_report(real: PipelineConfig, smoke: PipelineConfig, rec: Recorder, out: PipelineResult,
                 seconds: float, gpu_gb: float) -> dict:
    from grpo_core.modeling.memory_plan import memory_plan

    stages, training, evals = [], [], {}
    contamination = {}
    for s in rec.stages:
        res, args = s["out"], s["args"]
        if s["stage"] == "ingest":
            contamination = res.contamination
            stages.append({"stage": "data", "pool_size": res.pool_size,
                           "cached": res.cached, **stage_figures(res)})
        elif s["stage"] == "evaluate_model":
            label = args["label"]
            evals[label] = {b: {"split": v.split, "problems": v.metrics.get("n_problems")}
                            for b, v in res.benchmarks.items()}
            stages.append({"stage": label, "cached": res.cached, **stage_figures(res)})
        elif s["stage"] == "difficulty_filter":
            stages.append({"stage": f"filter/round-{args['round_no']}", "kept": res.kept,
                           "considered": res.considered, "cached": res.cached,
                           **stage_figures(res)})
        else:
            name = "sft" if s["stage"] == "sft" else f"grpo/round-{args['round_no']}"
            before = args["model_path"]
            dtype, how = _master_dtype(rec, before)
            row = {"stage": name, "steps": res.steps, "input": before,
                   "output": res.model_dir, "master_dtype": dtype, "master_dtype_from": how,
                   "param_change_norm": param_change_norm(before, res.model_dir),
                   "cached": res.cached, **stage_figures(res)}
            stages.append(row)
            training.append(row)
    found = list(out.findings)
    found += [Finding.note("smoke_check", "saved weights unchanged; GRPO's update is 0 when every "
                           "group's rewards are equal (no group's samples disagreed on any reward: "
                           "a larger G or --model with a model that sometimes solves the problems "
                           "shows it move)", stage=t["stage"])
              for t in training if t["stage"].startswith("grpo") and t["param_change_norm"] == 0]
    findings = [f.line() for f in found]  # the report is JSON: rendered here
    dtypes = {t["master_dtype"] for t in training}
    return {
        "config_model": real.model.name_or_path,
        "smoke_model": smoke.model.name_or_path,
        "workspace": smoke.project.workdir,
        "seconds": round(seconds, 1),
        "stages": stages,
        "training": {t["stage"]: {k: t[k] for k in ("steps", "master_dtype", "param_change_norm",
                                                    "throughput", "rss_peak_gb", "gpu_peak_gb")
                                  if k in t}
                     for t in training},
        "master_dtype": dtypes.pop() if len(dtypes) == 1 else sorted(dtypes),
        "eval": evals,
        "decontamination": contamination,
        "findings": findings,
        "memory_plan": memory_plan(real, gpu_gb=gpu_gb),
    }


def format_report(report: dict) -> str:
    from grpo_core.modeling.memory_plan import format_plan

    lines = [(f"smoke of {report['config_model']} on {report['smoke_model']} "
              f"in {report['seconds']} s ({report['workspace']})")]
    for s in report["stages"]:
        extra = {k: v for k, v in s.items() if k not in ("stage", "input", "output", "cached")}
        lines.append(f"  {s['stage']:<16} {json.dumps(extra)}{' (cached)' if s.get('cached') else ''}")
    for label, benches in report["eval"].items():
        lines.append(f"  {label}: " + ", ".join(f"{b} {v['split']} x{v['problems']}"
                                               for b, v in benches.items()))
    lines.append("  decontamination: " + ", ".join(
        f"{b} {c.get('flagged', 0)} flagged / {c.get('problems', '?')} problems"
        for b, c in report["decontamination"].items()))
    lines += [f"  finding: {f}" for f in report["findings"]]
    lines.append(format_plan(report["memory_plan"]))
    return "\n".join(lines)


def write_report(report: dict, workdir: str | Path) -> Path:
    path = Path(workdir) / "reports" / "smoke.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def run_smoke(real: PipelineConfig, smoke: PipelineConfig, report_root: str | Path,
              gpu_gb: float, progress: bool, plan=None) -> tuple[dict, Path]:
    """The normal pipeline flow on the smoke config, observed; the report written.
    `plan`: the smoke config's preflight (tasks.preflight), or None to make it there."""
    from flows.pipeline import grpo_pipeline

    t0 = time.time()
    with observe() as rec:
        out = grpo_pipeline(smoke, progress=progress, plan=plan)
    report = build_report(real, smoke, rec, out, time.time() - t0, gpu_gb)
    return report, write_report(report, report_root)
