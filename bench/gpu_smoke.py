"""GPU smoke: the vLLM paths on one NVIDIA GPU with the built-in model, timed and checked.

    python bench/gpu_smoke.py [--dry-run] [--parts hf,vllm,...] [--out FILE]
    bash infra/gpu_smoke.sh          # on the GPU machine: carried wheels first, then this

Parts, in order, each in its own process (a crash, hang or held GPU memory in one leaves the
others' numbers; --in-process runs them in this process, as the pipeline does):
  pipeline   a two-round `grpo run` of a GPU-shaped config on builtin:proxy-qwen2 (bench/
             gpu_pipeline.py): colocated vLLM where vLLM imports, else the hf backend (said);
             per round the peak GPU memory vs the memory plan and the throughput figures
  hf         rollout.backend=hf: generation tokens/s, the difficulty filter, eval of the base model
  vllm       (a) rollout.backend=vllm (VLLMBackend): engine start, generation tokens/s on the same
             prompts, the difficulty filter, eval of the base model, a stop-token text check
  grpo_vllm  (b) GRPO steps with grpo.use_vllm=true, grpo.vllm_mode=colocate (TRL's vLLM)
  eval_vllm  (c) evaluate() with rollout.backend=vllm on (b)'s model (the base model if (b) failed)
  grpo_hf    the same GRPO steps with transformers generation: the baseline for (b)

Checks: GRPO at lr 1e-6 must change the weights (fp32 master weights under bf16 autocast on a GPU:
train.precision auto, grpo_core.train.grpo.load_for_training); each part's peak GPU memory
(and the hf part's per stage: generation, filter, eval) comes from
grpo_core.modeling.gpu.stage_memory.
Without vLLM (the lent GPU machine: infra/device/README.md) run `--parts hf,grpo_hf`.
Prints a summary (GPU, torch/vLLM versions, tokens/s vllm vs hf, GRPO step time, eval time) and
writes it as JSON to --out, else $OUT/gpu_smoke.json when $OUT is set, else into the workdir;
the parts' log tails go beside it (gpu_smoke.log). Exit 1 if any part failed. A part the
deadline leaves no time for is listed as skipped, not failed (the parts run in order: the
pipeline first).
--dry-run (no GPU needed): checks the imports, builds every part's config (the pipeline's also
through `grpo config show`, as `grpo run` will load it), prints the plan.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_pipeline  # noqa: E402 - bench/ beside this file

PARTS = ("pipeline", "hf", "vllm", "grpo_vllm", "eval_vllm", "grpo_hf")
LR = 1e-6  # the real presets' GRPO rate: in bf16 master weights its updates would round away
NEEDS_VLLM = {"vllm", "grpo_vllm", "eval_vllm"}
BUDGET_S = {"pipeline": 330, "hf": 150, "vllm": 240, "grpo_vllm": 240, "eval_vllm": 180, "grpo_hf": 150}
DESCRIBE = {"pipeline": "two-round `grpo run`, GPU-shaped config on the proxy: peak memory per "
                        "round vs plan, throughput",
            "hf": "hf backend: generation tokens/s, filter, base-model eval",
            "vllm": "(a) VLLMBackend: engine start, tokens/s, stop-token check, filter, eval",
            "grpo_vllm": "(b) GRPO steps with TRL's colocated vLLM",
            "eval_vllm": "(c) evaluate() with rollout.backend=vllm on (b)'s model",
            "grpo_hf": "GRPO steps with transformers generation (baseline for (b))"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
               "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # TRL colocate sets


# --- configs and inputs (shared by the parts and --dry-run) -----------------------------------

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


def bench_prompts(s: dict) -> list[str]:
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.prompts import render_prompt

    return [render_prompt(p.problem, "r1_zero")
            for p in generate_problems("train", s["prompts"], seed=123)]


def filter_pool(s: dict):
    from grpo_core.data.synthetic import generate_problems

    return generate_problems("train", s["filter_problems"], levels=[1, 2, 3], seed=0)


# --- measurements ------------------------------------------------------------------------------

def bench_generation(backend, prompts: list[str], s: dict, repeats: int = 2) -> dict:
    """Plain backend.sample (the rollout interface) on the same requests for both backends."""
    from grpo_core.generation.rollout import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=s["max_new_tokens"])
    backend.sample(prompts[:2], 2, params)  # warm-up: lazy inits, allocator, graphs
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = backend.sample(prompts, s["samples"], params)
        secs = time.perf_counter() - t0
        if best is None or secs < best[0]:
            best = (secs, out)
    secs, out = best
    comps = [c for cs in out for c in cs]
    tokens = sum(c.num_tokens for c in comps)
    return {"prompts": len(prompts), "samples": s["samples"], "completions": len(comps),
            "max_new_tokens": s["max_new_tokens"], "seconds": round(secs, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / secs, 1), "samples_per_s": round(len(comps) / secs, 1),
            "mean_tokens": round(tokens / max(1, len(comps)), 2),
            "truncated_frac": round(sum(c.truncated for c in comps) / max(1, len(comps)), 3),
            "distinct_frac": round(statistics.mean(len({c.text for c in cs}) / len(cs)
                                                   for cs in out), 3)}


def greedy_texts(backend, prompts: list[str], s: dict) -> list[str]:
    from grpo_core.generation.rollout import SamplingParams

    out = backend.sample(prompts, 1, SamplingParams(temperature=0.0,
                                                    max_new_tokens=s["max_new_tokens"]))
    return [o[0].text for o in out]


def do_filter(backend, tok, cfg, s: dict, tag: str) -> dict:
    from grpo_core.data.store import Store
    from grpo_core.eval.difficulty import filter_problems
    from grpo_core.modeling.loading import model_fingerprint

    work = Path(s["workdir"])
    with Store.open(work / f"filter-{tag}.duckdb") as store:
        rep = filter_problems(backend, filter_pool(s), model_fingerprint(s["model_path"]), cfg,
                              cfg.model.template, tok, con=store)
    (work / f"kept-{tag}.json").write_text(json.dumps([p.to_row() for p in rep.kept]))
    rates = [r["pass_rate"] for r in rep.estimates]
    return {"seconds": round(rep.seconds, 3), "considered": rep.considered, "k": rep.k,
            "estimated": rep.estimated, "kept": len(rep.kept), "counts": rep.counts,
            "mean_pass_rate": round(statistics.mean(rates), 4) if rates else None,
            "histogram": rep.histogram.get("counts")}


def do_eval(backend, tok, cfg, model_path: str) -> dict:
    from grpo_core.eval.evaluation import evaluate

    res = evaluate(model_path, "synthetic", cfg, backend=backend, tokenizer=tok)
    m = res.metrics

    def mean(key):
        v = m.get(key)
        return round(v["mean"], 4) if isinstance(v, dict) and v.get("mean") is not None else v

    k = cfg.eval.samples
    return {"seconds": round(res.seconds, 3), "n_problems": res.protocol["n_problems"],
            "samples": k, "protocol_hash": res.protocol_hash,
            "greedy_accuracy": mean("greedy_accuracy"), f"avg@{k}": mean(f"avg@{k}"),
            f"pass@{k}": mean(f"pass@{k}"), "format_adherence": mean("format_adherence"),
            "truncation_rate": (m.get("truncation_rate") or {}).get("all")}


def stop_token_probe(backend, prompts: list[str]) -> dict:
    """Does VLLMBackend's text keep a non-special stop token, as the hf backend's decode does?
    (The pipeline stops at </answer>, an added, non-special token that the answer extractor and
    the format check need in the text.) Stops greedy generation at a token the model emits."""
    from vllm import SamplingParams as VSP

    tok = backend.tokenizer
    special = set(getattr(tok, "all_special_ids", None) or [])
    free = backend.llm.generate(prompts, VSP(temperature=0.0, max_tokens=16), use_tqdm=False)
    stop = next((t for o in free for t in list(o.outputs[0].token_ids)[1:] if t not in special),
                None)
    if stop is None:
        return {"checked": False, "why": "the model emitted no non-special token to stop at"}
    outs = backend.llm.generate(prompts, VSP(temperature=0.0, max_tokens=16,
                                             stop_token_ids=[stop]), use_tqdm=False)
    stopped = [o.outputs[0] for o in outs
               if o.outputs[0].token_ids and o.outputs[0].token_ids[-1] == stop]
    same = [c.text == tok.decode(list(c.token_ids), skip_special_tokens=True) for c in stopped]
    rec = {"checked": bool(stopped), "stop_token": tok.decode([stop]), "stopped": len(stopped),
           "text_equals_decoded_ids": sum(same), "text_kept": bool(stopped) and all(same)}
    if stopped and not all(same):
        c = stopped[same.index(False)]
        rec["example"] = {"text": c.text[-60:],
                          "decoded": tok.decode(list(c.token_ids), skip_special_tokens=True)[-60:]}
    close = tok.convert_tokens_to_ids("</answer>")
    rec["answer_close_is_a_stop_token"] = close in backend._stop
    return rec


def step_clock():
    """Wall time of each optimizer step (generation, reward, update, logging)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kw):
            self.marks = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kw):
            self.marks.append(time.perf_counter())

    return StepClock()


def weight_probe():
    """The policy's parameters at train begin and end: master dtype, autocast, change norm.
    Measured on the trained model in memory (fp32 master), not the saved copy (stored dtype)."""
    from transformers import TrainerCallback

    class WeightProbe(TrainerCallback):
        def __init__(self):
            self.before: dict = {}
            self.out: dict = {}

        def on_train_begin(self, args, state, control, model=None, **kw):
            params = dict(model.named_parameters())
            self.out = {"master_dtype": str(next(iter(params.values())).dtype).replace("torch.", ""),
                        "autocast": "bf16" if args.bf16 else "fp16" if args.fp16 else "none",
                        "learning_rate": args.learning_rate}
            self.before = {n: p.detach().float().cpu().clone() for n, p in params.items()
                           if p.requires_grad}

        def on_train_end(self, args, state, control, model=None, **kw):
            sq = changed = total = 0
            for n, p in model.named_parameters():
                if n in self.before:
                    d = p.detach().float().cpu() - self.before[n]
                    sq += float((d * d).sum())
                    changed += int((d != 0).sum())
                    total += d.numel()
            self.out.update(param_change_norm=sq ** 0.5,
                            changed_frac=round(changed / max(1, total), 4))
            self.before = {}

    return WeightProbe()


def grpo_problems(s: dict, need: int):
    from grpo_core.data.problems import Problem

    for tag in ("vllm", "hf"):
        f = Path(s["workdir"]) / f"kept-{tag}.json"
        rows = json.loads(f.read_text()) if f.is_file() else []
        if len(rows) >= need:
            return [Problem(**r) for r in rows], f"kept by the {tag} filter ({len(rows)})"
    pool = filter_pool(s)
    return pool, f"the synthetic pool ({len(pool)}): no filter kept a full batch"


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


def part_hf(s: dict, rec: dict) -> None:
    from grpo_core.generation.sampling import build_backend

    _gpu_check(rec)
    cfg = part_config("hf", s)
    t0 = time.perf_counter()
    # Built outside the per-stage blocks: the part's block (run_part) owns it and shuts it down.
    backend, tok = build_backend(s["model_path"], cfg)
    rec["load_s"] = round(time.perf_counter() - t0, 2)
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
    from grpo_core.generation.sampling import build_backend

    _gpu_check(rec)
    cfg = part_config("vllm", s)
    t0 = time.perf_counter()
    backend, tok = build_backend(s["model_path"], cfg)
    rec["engine_start_s"] = round(time.perf_counter() - t0, 2)
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
        "rollout_rows": len(rows), "findings": result.findings, "output_dir": result.output_dir,
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


def grpo_tokens_per_s(hist: list[dict], g, train_s: float) -> dict:
    """Completion tokens/s (mean completion length x completions per step, summed over steps)
    and TRL's num_tokens (prompt + completion, cumulative) per second of the training loop."""
    per_step = g.per_device_train_batch_size * g.gradient_accumulation_steps
    comp = sum(h["completions/mean_length"] * per_step for h in hist
               if isinstance(h.get("completions/mean_length"), (int, float)))
    seen = [h["num_tokens"] for h in hist if isinstance(h.get("num_tokens"), (int, float))]
    if not train_s:
        return {"completion_tokens_per_s": None, "tokens_per_s": None}
    return {"completion_tokens_per_s": round(comp / train_s, 1) if comp else None,
            "tokens_per_s": round(max(seen) / train_s, 1) if seen else None}


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


# --- the orchestrator ----------------------------------------------------------------------------

class Terminated(Exception):
    pass


def _on_term(signum, frame):
    raise Terminated(f"signal {signum}")


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def environment() -> dict:
    env = {"python": sys.version.split()[0], "executable": sys.executable}
    for dist in ("torch", "vllm", "trl", "transformers", "accelerate", "datasets", "triton",
                 "flashinfer-python"):
        env[dist] = _version(dist)
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


def probe_vllm(timeout: float) -> tuple[str | None, str | None]:
    """(version, None) when `import vllm` works in a fresh process, else (None, why)."""
    if importlib.util.find_spec("vllm") is None:
        return None, ("vllm is not installed: carry a wheel folder holding vllm and its "
                      "dependencies (infra/wheels/README.md)")
    try:
        r = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                           check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"import vllm took over {timeout:.0f} s"
    if r.returncode != 0:
        tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        return None, f"import vllm failed (exit {r.returncode}): {tail}"
    return r.stdout.strip().splitlines()[-1], None


def _kill_group(proc: subprocess.Popen) -> None:
    """The part's whole process group: vLLM's engine processes must not outlive it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_child(name: str, s: dict, timeout: float, log: Path) -> dict:
    spec = Path(s["workdir"]) / f"spec-{name}.json"
    result = Path(s["result"])
    result.unlink(missing_ok=True)
    spec.write_text(json.dumps(s))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", name, "--spec", str(spec)]
    timed_out, rc, t0 = False, None, time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
    try:
        rec = json.loads(result.read_text()) if result.is_file() else {}
    except ValueError:  # cut short while writing
        rec = {}
    if timed_out:
        rec.update(ok=False, error=f"timed out after {timeout:.0f} s")
    elif not rec:
        rec = {"ok": False, "error": f"the part's process exited {rc} without a result (crash?)"}
    rec.setdefault("seconds", round(time.perf_counter() - t0, 2))
    if not rec.get("ok"):
        rec["log_tail"] = _tail(log, 25)
    return rec


def run_inline(name: str, s: dict) -> dict:
    saved = {k: os.environ.get(k) for k in DIST_ENV}
    try:
        return run_part(name, s)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gc.collect()
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.empty_cache()


def _get(d: dict, *keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def summarise(parts: dict, env: dict) -> dict:
    v_tps = _get(parts, "vllm", "generation", "tokens_per_s")
    h_tps = _get(parts, "hf", "generation", "tokens_per_s")
    return {
        "gpu": env.get("gpu_name"), "torch": env.get("torch"), "vllm": env.get("vllm"),
        "generation_tokens_per_s": {"vllm": v_tps, "hf": h_tps,
                                    "vllm_over_hf": round(v_tps / h_tps, 2) if v_tps and h_tps
                                    else None},
        "vllm_engine_start_s": _get(parts, "vllm", "engine_start_s"),
        "grpo_step_s": {"vllm": _get(parts, "grpo_vllm", "step_s_median"),
                        "hf": _get(parts, "grpo_hf", "step_s_median")},
        "grpo_train_s": {"vllm": _get(parts, "grpo_vllm", "train_s"),
                         "hf": _get(parts, "grpo_hf", "train_s")},
        "eval_s": {"vllm": _get(parts, "eval_vllm", "eval", "seconds"),
                   "vllm_base": _get(parts, "vllm", "eval_base", "seconds"),
                   "hf_base": _get(parts, "hf", "eval_base", "seconds")},
        "filter_s": {"vllm": _get(parts, "vllm", "filter", "seconds"),
                     "hf": _get(parts, "hf", "filter", "seconds")},
        "base_greedy_accuracy": {"vllm": _get(parts, "vllm", "eval_base", "greedy_accuracy"),
                                 "hf": _get(parts, "hf", "eval_base", "greedy_accuracy")},
        "stop_token_text_kept": _get(parts, "vllm", "stop_token_check", "text_kept"),
        "gpu_peak_gb": {n: r.get("gpu_peak_gb") for n, r in parts.items()},
        "gpu_peak_gb_by_stage": {n: r["gpu_peak_gb_by_stage"] for n, r in parts.items()
                                 if r.get("gpu_peak_gb_by_stage")},
        "grpo_tokens_per_s": {n: _get(parts, n, "tokens_per_s") for n in ("grpo_vllm", "grpo_hf")},
        "grpo_weights": {n: _get(parts, n, "weights") for n in ("grpo_vllm", "grpo_hf")},
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
            text.append(f"===== {name} ({log}) =====\n{_tail(log, 150)}\n")
    if text:
        out.with_suffix(".log").write_text("".join(text))


def out_path(args) -> Path:
    if args.out:
        return Path(args.out)
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_smoke.json"
    return Path(args.workdir or "<workdir>") / "gpu_smoke.json"


def make_spec(args, workdir: str, model_path: str | None) -> dict:
    return {"workdir": workdir, "model": args.model, "model_path": model_path,
            "prompts": args.prompts, "samples": args.samples,
            "max_new_tokens": args.max_new_tokens, "filter_problems": args.filter_problems,
            "steps": args.steps, "eval_problems": args.eval_problems}


def dry_run(args, parts: list[str]) -> int:

    print(f"gpu_smoke --dry-run: python {sys.version.split()[0]} ({sys.executable})")
    bad = 0
    for mod in ("torch", "transformers", "trl", "datasets", "duckdb", "math_verify", "pydantic",
                "yaml", "grpo_core.config", "grpo_core.generation.rollout",
                "grpo_core.generation.sampling", "grpo_core.eval.difficulty",
                "grpo_core.eval.evaluation", "grpo_core.train.grpo", "grpo_core.modeling.loading",
                "grpo_core.data.store", "grpo_core.data.synthetic"):
        try:
            importlib.import_module(mod)
            print(f"  import {mod:<22} ok")
        except Exception as exc:  # noqa: BLE001 - listed, counted, reported
            bad += 1
            print(f"  import {mod:<22} FAILED {type(exc).__name__}: {exc}")
    try:
        import torch

        cuda = f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
    except ImportError:
        cuda = "no torch"
    print(f"  {cuda}; vllm: {_version('vllm') or 'not installed'} "
          "(the vllm parts need it and a GPU)")
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-dry-") as tmp:
        s = make_spec(args, tmp, None)
        print(f"configs (workdir {tmp}):")
        for name in parts:
            try:
                cfg = part_config(name, s)
                line = (f"rollout.backend={cfg.rollout.backend} grpo.use_vllm={cfg.grpo.use_vllm}"
                        f" vllm_mode={cfg.grpo.vllm_mode} model.dtype={cfg.model.dtype}")
                if name.startswith("grpo"):
                    from grpo_core.train.trl_args import trl_grpo_args

                    a = trl_grpo_args(cfg, str(Path(tmp) / name))
                    line += (f"; TRL: use_vllm={a.use_vllm} per_device_train_batch_size="
                             f"{a.per_device_train_batch_size} num_generations={a.num_generations}"
                             f" max_steps={a.max_steps} bf16={a.bf16} (here, on CPU)")
                if name == "pipeline":  # both variants, as `grpo run` will load them
                    for use_vllm in (False, True):
                        where = Path(tmp) / f"pipeline-vllm-{use_vllm}"
                        gpu_pipeline.pipeline_config(where, use_vllm)
                        ok, said = gpu_pipeline.check_with_cli(where / "pipeline.yaml")
                        if not ok:
                            raise ValueError(f"grpo config show refused it (use_vllm={use_vllm}): "
                                             f"{said}")
                    line += (f"; stage_process={cfg.train.stage_process} rounds={cfg.rounds.count}"
                             f" grpo config show ok; {gpu_pipeline.vllm_choice()[1]}")
                print(f"  {name:<10} ok  {line}")
            except Exception as exc:  # noqa: BLE001 - listed, counted, reported
                bad += 1
                print(f"  {name:<10} FAILED {type(exc).__name__}: {exc}")
        try:
            print(f"inputs: {len(bench_prompts(s))} benchmark prompts, "
                  f"{len(filter_pool(s))} filter problems")
        except Exception as exc:  # noqa: BLE001 - listed, counted, reported
            bad += 1
            print(f"inputs: FAILED {type(exc).__name__}: {exc}")
    from grpo_core.modeling.loading import builtin_dir

    model_dir = builtin_dir(args.model, args.models_cache)
    if model_dir is None:
        print(f"model {args.model}: a folder or hub id (carry it; the device has no network)")
        model_dir = Path(args.model)
    built = (model_dir / "builtin.json").is_file()
    rel = model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir
    from grpo_core.modeling.tiny import SHIPPED_DIR

    if model_dir == SHIPPED_DIR:
        print(f"model {args.model}: shipped at {rel} (travels with the working tree)")
    else:
        print(f"model {args.model}: {'cached' if built else 'not built yet'} at {model_dir}"
              + (f" (carry '{rel}' to skip the build there)" if built else
                 " (built in the parent process on first run, ~1-2 min on CPU cores)"))
    print("plan:")
    for name in parts:
        print(f"  {name:<10} own process, <= {BUDGET_S[name]} s: {DESCRIBE[name]}")
    print(f"  whole run <= {args.deadline:.0f} s; JSON -> {out_path(args)}")
    print("dry run: " + ("ok" if not bad else f"{bad} problem(s)"))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="check imports and configs, no GPU")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--out", help="JSON report path (default $OUT/gpu_smoke.json)")
    ap.add_argument("--workdir", help="scratch folder (default a new temp folder)")
    ap.add_argument("--models-cache", default=str(ROOT / ".grpo" / "models"))
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--filter-problems", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval-problems", type=int, default=200)
    ap.add_argument("--deadline", type=float, default=450.0, help="seconds for the whole run")
    ap.add_argument("--in-process", action="store_true", help="run the parts in this process")
    ap.add_argument("--allow-cpu", action="store_true",
                    help="testing this script: run the parts without a GPU (tiny sizes advised)")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        child_main(args.part, args.spec)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
    if args.dry_run:
        return dry_run(args, parts)

    t_start = time.monotonic()
    signal.signal(signal.SIGTERM, _on_term)
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="grpo-gpu-smoke-")
    work = Path(args.workdir).resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    os.environ["GRPO_WORKDIR"] = str(work)
    out = out_path(args)
    env = environment()
    report: dict = {"ok": False, "failed_parts": [], "env": env, "params": vars(args).copy(),
                    "model": {}, "parts": {}, "summary": {}}
    print(f"gpu smoke: {env.get('gpu_name') or 'NO GPU'}, torch {env.get('torch')}, "
          f"workdir {work}, report -> {out}", flush=True)

    def elapsed() -> float:
        return time.monotonic() - t_start

    blocked: dict[str, str] = {}
    if args.allow_cpu:
        os.environ["GRPO_SMOKE_ALLOW_CPU"] = "1"
    elif not env.get("cuda_available"):
        blocked = dict.fromkeys(parts, "torch sees no CUDA device: this is a GPU smoke "
                                       "(use --dry-run on a CPU machine)")
    model_path = running = None
    try:
        if not blocked:
            from grpo_core.modeling.loading import resolve_model_path

            t0 = time.perf_counter()
            model_path = resolve_model_path(args.model, args.models_cache, progress=False)
            report["model"] = {"name": args.model, "path": model_path,
                               "resolve_s": round(time.perf_counter() - t0, 1)}
            print(f"[{elapsed():6.1f}s] model {args.model} at {model_path} "
                  f"({report['model']['resolve_s']} s)", flush=True)
            if NEEDS_VLLM & set(parts):
                env["vllm_import"], why = probe_vllm(timeout=180)
                if why:
                    env["vllm_error"] = why
                    blocked.update(dict.fromkeys(NEEDS_VLLM, why))
                print(f"[{elapsed():6.1f}s] vllm: {env['vllm_import'] or why}", flush=True)
        for name in parts:
            s = make_spec(args, str(work), model_path)
            s["result"] = str(work / f"result-{name}.json")
            if name == "eval_vllm" and _get(report["parts"], "grpo_vllm", "ok"):
                s["eval_model"] = report["parts"]["grpo_vllm"].get("output_dir")
            left = args.deadline - elapsed() - 10
            if name in blocked:
                rec = {"ok": False, "error": f"not run: {blocked[name]}", "seconds": 0.0}
            elif left < 30:
                rec = {"ok": False, "skipped": True, "seconds": 0.0,
                       "error": f"skipped: {elapsed():.0f} s of the {args.deadline:.0f} s "
                                "deadline spent"}
            elif args.in_process:
                rec = run_inline(name, s)
            else:
                running = name
                rec = run_child(name, s, min(BUDGET_S[name], left), logs / f"{name}.log")
                running = None
            report["parts"][name] = rec
            state = "ok" if rec.get("ok") else f"FAILED: {str(rec.get('error'))[:200]}"
            print(f"[{elapsed():6.1f}s] {name}: {state} ({rec.get('seconds', 0)} s)", flush=True)
            report["summary"] = summarise(report["parts"], env)
            write_report(report, out, logs)
    except (Terminated, KeyboardInterrupt) as exc:
        if running:
            report["parts"][running] = {"ok": False, "seconds": 0.0,
                                        "error": f"stopped while running ({exc})",
                                        "log_tail": _tail(logs / f"{running}.log", 25)}
        for name in parts:
            report["parts"].setdefault(name, {"ok": False, "seconds": 0.0,
                                              "error": f"not run: smoke stopped ({exc})"})
    except Exception as exc:  # noqa: BLE001 - the report is still written
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()[-4000:]
        for name in parts:
            report["parts"].setdefault(name, {"ok": False, "seconds": 0.0,
                                              "error": f"not run: {report['error']}"})
    report["failed_parts"] = [n for n, r in report["parts"].items()
                              if not r.get("ok") and not r.get("skipped")]
    report["skipped_parts"] = [n for n, r in report["parts"].items() if r.get("skipped")]
    report["ok"] = not report["failed_parts"] and "error" not in report
    report["summary"] = summarise(report["parts"], env)
    report["seconds"] = round(elapsed(), 1)
    write_report(report, out, logs)
    print_summary(report)
    print(f"report: {out} ({'ok' if report['ok'] else 'FAILED: ' + ', '.join(report['failed_parts'])}"
          f"{'; ' + report['error'] if 'error' in report else ''}), {report['seconds']} s")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
