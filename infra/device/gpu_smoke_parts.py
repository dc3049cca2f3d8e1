"""The GPU smoke's parts (infra/device/gpu_smoke.py runs each in its own process, or all in its own
with --in-process): each part's config, what it runs and checks, filling `rec` as it goes so
that a failure keeps what was measured (the measurements: infra/device/gpu_smoke_measure.py).
`run_part` runs one part inside grpo_core.modeling.gpu.stage_memory (engines shut down, env
restored, peak GPU memory); `child_main` is a part's own process."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import gpu_pipeline
from gpu_smoke_measure import (
    bench_generation,
    bench_prompts,
    do_eval,
    do_filter,
    greedy_texts,
    grpo_problems,
    grpo_tokens_per_s,
    step_clock,
    stop_token_probe,
    weight_probe,
)

LR = 1e-6  # the real presets' GRPO rate: in bf16 master weights its updates would round away
BUDGET_S = {"pipeline": 330, "hf": 150, "vllm": 240, "grpo_vllm": 240, "eval_vllm": 180, "grpo_hf": 150}


# --- configs (shared by the parts and --dry-run) ------------------------------------------------

def smoke_config(s: dict, backend: str, use_vllm: bool = False):
    """One config for every part: only rollout.backend and grpo.use_vllm differ."""
    from grpo_core.config import config_from_dict

    return config_from_dict({
        "project": {"name": "gpu-smoke", "recipe": "smoke", "seed": 0, "workdir": s["workdir"]},
        "model": {"name_or_path": s["model"], "template": "r1_zero", "dtype": "bfloat16"},
        "rollout": {"backend": backend, "batch_size": 512, "max_new_tokens": s["max_new_tokens"],
                    "gpu_memory_utilization": 0.3},
        "filter": {"k": 8, "band": [0.3, 0.7], "max_problems": s["filter_problems"]},
        "grpo": {"max_steps": s["steps"], "num_generations": 8, "per_device_train_batch_size": 64,
                 "max_completion_length": 48, "learning_rate": LR, "save_steps": 100_000,
                 "logging_steps": 1, "use_vllm": use_vllm, "vllm_mode": "colocate",
                 "vllm_gpu_memory_utilization": 0.3},
        "rewards": {"funcs": ["accuracy", "format", "tag_count"], "weights": [1.0, 1.0, 0.5]},
        "eval": {"benchmarks": ["synthetic"], "limit": s["eval_problems"], "samples": 4,
                 "max_new_tokens": 48, "bootstrap": 200},
        "tracking": {"register_model": False},
    })


def part_config(name: str, s: dict):
    if name == "pipeline":
        return gpu_pipeline.pipeline_config(s["workdir"], gpu_pipeline.vllm_choice()[0])
    return {"hf": lambda: smoke_config(s, "hf"), "vllm": lambda: smoke_config(s, "vllm"),
            "grpo_vllm": lambda: smoke_config(s, "vllm", use_vllm=True),
            "eval_vllm": lambda: smoke_config(s, "vllm"),
            "grpo_hf": lambda: smoke_config(s, "hf", use_vllm=False)}[name]()


# --- the parts: each fills `rec` as it goes, so a failure keeps what was measured ---------------

def _gpu_check(rec: dict) -> None:
    import torch

    # is_available() leaves torch.cuda uninitialised (no context before vLLM starts its workers)
    rec["cuda"] = torch.cuda.is_available()
    if not rec["cuda"] and os.environ.get("GRPO_SMOKE_ALLOW_CPU") != "1":
        raise RuntimeError("torch sees no CUDA device")


@contextlib.contextmanager
def peak_of(rec: dict, stage: str):
    """Peak GPU memory (GB) of one stage of a part -> rec["gpu_peak_gb_by_stage"][stage].
    A backend built inside would be shut down at its end: build it before."""
    from grpo_core.modeling.gpu import stage_memory

    with stage_memory(restore_env=False) as mem:
        yield
    rec.setdefault("gpu_peak_gb_by_stage", {})[stage] = mem.peak_gb


def _start_backend(s: dict, rec: dict, kind: str, seconds_key: str):
    """(cfg, backend, tokenizer) of a generation part (`kind` hf or vllm), its start time in
    rec[seconds_key]. Built outside the per-stage blocks: the part's block (run_part) owns
    it and shuts it down."""
    from grpo_core.generation.sampling import build_backend

    _gpu_check(rec)
    cfg = part_config(kind, s)
    t0 = time.perf_counter()
    backend, tok = build_backend(s["model_path"], cfg)
    rec[seconds_key] = round(time.perf_counter() - t0, 2)
    return cfg, backend, tok


def part_hf(s: dict, rec: dict) -> None:
    cfg, backend, tok = _start_backend(s, rec, "hf", "load_s")
    rec["device"], rec["dtype"] = str(backend.model.device), str(backend.model.dtype)
    prompts = bench_prompts(s)
    with peak_of(rec, "generation"):
        rec["generation"] = bench_generation(backend, prompts, s)
        texts = greedy_texts(backend, prompts[:32], s)
    (Path(s["workdir"]) / "greedy-hf.json").write_text(json.dumps(texts))
    with peak_of(rec, "filter"):
        rec["filter"] = do_filter(backend, tok, cfg, s, "hf")
    with peak_of(rec, "eval"):
        rec["eval_base"] = do_eval(backend, tok, cfg, s["model_path"])


def part_vllm(s: dict, rec: dict) -> None:
    from grpo_core.generation.rollout import VLLMBackend

    cfg, backend, tok = _start_backend(s, rec, "vllm", "engine_start_s")
    if not isinstance(backend, VLLMBackend):
        raise TypeError(f"rollout.backend=vllm built {type(backend).__name__}")
    try:
        prompts = bench_prompts(s)
        rec["generation"] = bench_generation(backend, prompts, s)
        try:
            rec["stop_token_check"] = stop_token_probe(backend, prompts[:8])
        except Exception as exc:  # noqa: BLE001 - a probe error is reported, not fatal
            rec["stop_token_check"] = {"checked": False, "why": f"{type(exc).__name__}: {exc}"}
        hf_file = Path(s["workdir"]) / "greedy-hf.json"
        if hf_file.is_file():
            hf, mine = json.loads(hf_file.read_text()), greedy_texts(backend, prompts[:32], s)
            rec["greedy_same_as_hf"] = round(sum(a == b for a, b in zip(hf, mine)) / len(hf), 3)
        rec["filter"] = do_filter(backend, tok, cfg, s, "vllm")
        rec["eval_base"] = do_eval(backend, tok, cfg, s["model_path"])
    finally:
        del backend
        gc.collect()
    if rec["stop_token_check"].get("checked") and not rec["stop_token_check"]["text_kept"]:
        rec.setdefault("failed_checks", []).append(
            "VLLMBackend drops a non-special stop token from the completion text (the hf backend "
            "keeps it): completions stopped at </answer> lose the tag, so extract_answer and the "
            "format check fail under vllm (stop_token_check)")


def _grpo(s: dict, rec: dict, use_vllm: bool) -> None:
    from grpo_core.config import generation_batch
    from grpo_core.train.grpo import run_grpo_round

    _gpu_check(rec)
    cfg = part_config("grpo_vllm" if use_vllm else "grpo_hf", s)
    g = cfg.grpo
    prompts = generation_batch(cfg) // g.num_generations
    problems, rec["problems"] = grpo_problems(s, prompts)
    rows: list[dict] = []
    clock, probe = step_clock(), weight_probe()
    out = Path(s["workdir"]) / ("grpo-vllm" if use_vllm else "grpo-hf")
    t0 = time.perf_counter()
    result = run_grpo_round(s["model_path"], problems, cfg, out, template="r1_zero",
                            rollout_sink=lambda step, rs: rows.extend(rs),
                            extra_callbacks=[clock, probe])
    total = time.perf_counter() - t0
    walls = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    hist = result.history
    trl_steps = [h["step_time"] for h in hist if isinstance(h.get("step_time"), (int, float))]

    def first_last(key):
        vals = [h[key] for h in hist if isinstance(h.get(key), (int, float))]
        return [round(vals[0], 4), round(vals[-1], 4)] if vals else None

    rec.update({
        "steps": result.steps, "batch": f"{prompts} prompts x {g.num_generations}",
        "max_completion_length": g.max_completion_length, "total_s": round(total, 2),
        "train_s": round(result.train_seconds, 2),
        "setup_and_save_s": round(total - result.train_seconds, 2),
        "step_s_median": round(statistics.median(walls[1:] or walls), 4) if walls else None,
        "first_step_s": round(walls[0], 3) if walls else None,
        "trl_step_time_median": round(statistics.median(trl_steps), 4) if trl_steps else None,
        "reward_first_last": first_last("reward"), "loss_first_last": first_last("loss"),
        "frac_reward_zero_std_first_last": first_last("frac_reward_zero_std"),
        "completion_len_first_last": first_last("completions/mean_length"),
        "rollout_rows": len(rows), "findings": [f.line() for f in result.findings], "output_dir": result.output_dir,
        "weights": probe.out, **grpo_tokens_per_s(hist, g, result.train_seconds)})
    checks = rec.setdefault("failed_checks", [])
    w = probe.out
    if not w.get("param_change_norm"):
        checks.append(f"weights unchanged after {result.steps} GRPO steps at lr {w.get('learning_rate')}"
                      f" (master {w.get('master_dtype')}, autocast {w.get('autocast')})")
    if w.get("master_dtype") not in (None, "float32"):
        checks.append(f"master weights are {w['master_dtype']}, not float32")
    if rec.get("cuda") and w.get("autocast") == "none":
        checks.append("no bf16/fp16 autocast on the GPU (train.precision auto)")
    if result.steps != g.max_steps:
        checks.append(f"{result.steps} steps trained, {g.max_steps} asked")
    if len(rows) != result.steps * prompts * g.num_generations:
        checks.append(f"{len(rows)} rollout rows for {result.steps} steps of "
                      f"{prompts * g.num_generations} completions")
    if not (Path(result.output_dir) / "config.json").is_file():
        checks.append(f"no model saved in {result.output_dir}")
    checks += [f for f in result.findings if f.startswith("divergence")]


def part_grpo_vllm(s: dict, rec: dict) -> None:
    _grpo(s, rec, use_vllm=True)


def part_grpo_hf(s: dict, rec: dict) -> None:
    _grpo(s, rec, use_vllm=False)


def part_eval_vllm(s: dict, rec: dict) -> None:
    from grpo_core.generation.sampling import build_backend

    _gpu_check(rec)
    cfg = part_config("eval_vllm", s)
    model = s.get("eval_model") or s["model_path"]
    rec["model"] = model
    rec["model_is"] = "grpo_vllm output" if model != s["model_path"] else "base (grpo_vllm failed)"
    t0 = time.perf_counter()
    backend, tok = build_backend(model, cfg)
    rec["engine_start_s"] = round(time.perf_counter() - t0, 2)
    rec["eval"] = do_eval(backend, tok, cfg, model)


PART_FUNCS = {"pipeline": lambda s, rec: gpu_pipeline.run_pipeline(s, rec, BUDGET_S["pipeline"] - 30),
              "hf": part_hf, "vllm": part_vllm, "grpo_vllm": part_grpo_vllm,
              "eval_vllm": part_eval_vllm, "grpo_hf": part_grpo_hf}


def run_part(name: str, s: dict) -> dict:
    from grpo_core.modeling.gpu import StageMemory, stage_memory

    rec: dict = {}
    mem = StageMemory()
    t0 = time.perf_counter()
    try:
        with stage_memory() as mem:  # engines shut down, env restored, peak GPU memory
            PART_FUNCS[name](s, rec)
        failed = [c for c in rec.get("failed_checks") or [] if c]
        rec["ok"] = not failed
        if failed:
            rec["error"] = "; ".join(failed)
    except Exception as exc:  # noqa: BLE001 - any failure is this part's result, with its trace
        rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:2000],
                   traceback=traceback.format_exc()[-4000:])
    rec["gpu_peak_gb"] = mem.peak_gb  # None without CUDA
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


def child_main(name: str, spec_path: str) -> None:
    s = json.loads(Path(spec_path).read_text())
    rec = run_part(name, s)
    Path(s["result"]).write_text(json.dumps(rec, default=str, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if rec["ok"] else 1)  # no interpreter teardown: engines can hang in atexit
