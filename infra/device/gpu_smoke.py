"""GPU smoke: the vLLM paths on one NVIDIA GPU with the built-in model, timed and checked.

    python infra/device/gpu_smoke.py [--dry-run] [--parts hf,vllm,...] [--out FILE]
    bash infra/gpu_smoke.sh          # on the GPU machine: carried wheels first, then this

Parts, in order, each in its own process (a crash, hang or held GPU memory in one leaves the
others' numbers; --in-process runs them in this process, as the pipeline does):
  pipeline   a two-round `grpo run` of a GPU-shaped config on builtin:proxy-qwen2 (infra/
             device/gpu_pipeline.py): colocated vLLM where vLLM imports, else the hf backend (said);
             per round the peak GPU memory vs the memory plan and the throughput figures
  hf         rollout.backend=hf: generation tokens/s, the difficulty filter, eval of the base model
  vllm       (a) rollout.backend=vllm (VLLMBackend): engine start, generation tokens/s on the same
             prompts, the difficulty filter, eval of the base model, a stop-token text check
  grpo_vllm  (b) GRPO steps with grpo.use_vllm=true, grpo.vllm_mode=colocate (TRL's vLLM)
  eval_vllm  (c) evaluate_benchmark() with rollout.backend=vllm on (b)'s model (the base model if (b) failed)
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

This file is the orchestrator (a process per part, the deadline, the dry run); the parts are
infra/device/gpu_smoke_parts.py, what they measure infra/device/gpu_smoke_measure.py, and the summary and
JSON report infra/device/gpu_smoke_report.py.
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
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_pipeline  # noqa: E402 - infra/device/ beside this file
from gpu_smoke_measure import bench_prompts, filter_pool  # noqa: E402
from gpu_smoke_parts import BUDGET_S, child_main, part_config, run_part  # noqa: E402
from gpu_smoke_report import (  # noqa: E402
    environment,
    installed_version,
    lookup,
    print_summary,
    summarise,
    tail_lines,
    write_report,
)

PARTS = ("pipeline", "hf", "vllm", "grpo_vllm", "eval_vllm", "grpo_hf")
NEEDS_VLLM = {"vllm", "grpo_vllm", "eval_vllm"}
DESCRIBE = {"pipeline": "two-round `grpo run`, GPU-shaped config on the proxy: peak memory per "
                        "round vs plan, throughput",
            "hf": "hf backend: generation tokens/s, filter, base-model eval",
            "vllm": "(a) VLLMBackend: engine start, tokens/s, stop-token check, filter, eval",
            "grpo_vllm": "(b) GRPO steps with TRL's colocated vLLM",
            "eval_vllm": "(c) evaluate_benchmark() with rollout.backend=vllm on (b)'s model",
            "grpo_hf": "GRPO steps with transformers generation (baseline for (b))"}
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
               "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # TRL colocate sets


# --- the orchestrator ----------------------------------------------------------------------------

class Terminated(Exception):
    pass


def _on_term(signum, frame):
    raise Terminated(f"signal {signum}")


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
        rec["log_tail"] = tail_lines(log, 25)
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
    print(f"  {cuda}; vllm: {installed_version('vllm') or 'not installed'} "
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
            if name == "eval_vllm" and lookup(report["parts"], "grpo_vllm", "ok"):
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
                                        "log_tail": tail_lines(logs / f"{running}.log", 25)}
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
