"""GRPO against PPO (and RLOO, and GRPO with a value head), measured side by side: the same
task (the synthetic arithmetic pool, R1-Zero template, the quickstart's rule rewards),
prompts x samples per step, steps and seed for each algorithm.name, on the built-in model
and on a 4x wider variant of it (hidden and intermediate sizes x4, random init, the same
tokenizer; built here) so the model, not the interpreter, holds the memory that differs.

Each arm runs in its own process (a clean peak RSS). Printed per arm:
- model copies: counted from the objects, the distinct nn.Modules reachable from the
  trainer with at least half the policy's parameters (policy, reference, value model,
  reward models); smaller trainable modules (grpo_vhead's head) are listed apart;
- parameter + gradient + optimizer-state bytes, summed over those modules' tensors and
  the optimizer's state at the last optimizer step (before it runs: gradients present);
- peak RSS (and its rise over the process once torch / transformers / TRL are imported),
  peak GPU memory on a GPU;
- seconds per optimizer step (TRL's train_runtime / steps), split into sampling (TRL's
  _generate) and the rest (reward scoring, reference / value forwards, the update), and
  generated completion tokens per step;
- the reward curve (first / last / mean step reward) and held-out avg@8 with its 95% CI
  (synthetic eval split, T=0.6, the first --eval-limit problems) after the run;
then the GRPO / PPO ratios per model.

A rule reward needs no model: GRPO holds policy + reference (2 copies), PPO adds the value
model (3). The write-ups' "3 vs 4" count a learned reward model as well; --reward-model
adds one of the policy's size (a sequence-classification model scored as an extra reward
function every step, weighted 0 since it is untrained) to reproduce that setting.

    .venv/bin/python bench/grpo_vs_ppo.py [--steps 6] [--algorithms grpo ppo rloo grpo_vhead]
        [--models base wide] [--reward-model] [--eval-limit 48] [--mlflow URI]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, load, markdown_table

ALGORITHMS = ("grpo", "ppo", "rloo", "grpo_vhead")
MODELS = ("base", "wide")
EXPERIMENT = "grpo-vs-ppo"


# ----------------------------------------------------------------------------- models


def build_wide(base: str, out: Path, factor: int = 4, seed: int = 0) -> Path:
    """The built-in model's architecture with hidden and intermediate sizes x factor,
    randomly initialised, with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    config = AutoConfig.from_pretrained(base)
    config.hidden_size *= factor
    config.intermediate_size *= factor
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tok = AutoTokenizer.from_pretrained(base)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_reward_model(policy: str, out: Path, seed: int = 0) -> Path:
    """A sequence-classification model of the policy's size (one score), random init."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(policy)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(policy).save_pretrained(out)
    return out


# ----------------------------------------------------------------------------- accounting


def reachable_modules(trainer) -> list[tuple[str, object]]:
    """(attribute path, module) of the distinct top-level nn.Modules with parameters that
    the trainer holds (its attributes, their lists / tuples / dicts, the accelerator's
    prepared models); a module inside another found one is not counted again."""
    from torch import nn

    found: dict[int, tuple[str, nn.Module]] = {}

    def visit(name, obj, depth):
        if isinstance(obj, nn.Module):
            if any(True for _ in obj.parameters()):
                found.setdefault(id(obj), (name, obj))
        elif depth and isinstance(obj, (list, tuple)):
            for i, x in enumerate(obj):
                visit(f"{name}[{i}]", x, depth - 1)
        elif depth and isinstance(obj, dict):
            for k, x in obj.items():
                visit(f"{name}[{k!r}]", x, depth - 1)

    for k, v in vars(trainer).items():
        visit(k, v, 2)
    visit("accelerator._models", getattr(trainer.accelerator, "_models", []), 1)
    inner = {id(m) for _, top in found.values() for m in top.modules() if m is not top}
    return [(name, m) for key, (name, m) in found.items() if key not in inner]


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage"):
            continue
        key = (t.untyped_storage().data_ptr(), t.dtype, t.shape)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def account(trainer) -> dict:
    """Model copies and parameter / gradient / optimizer-state bytes, from the objects."""
    mods = reachable_modules(trainer)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    n_policy = sum(p.numel() for p in policy.parameters())
    copies, small = [], []
    for name, m in mods:
        n = sum(p.numel() for p in m.parameters())
        (copies if n >= n_policy / 2 else small).append(f"{name.removeprefix('accelerator._models')}"
                                                         f":{type(m).__name__}:{n}")
    params = [p for _, m in mods for p in m.parameters()]
    state = [t for s in trainer.optimizer.state.values() for t in s.values()
             if hasattr(t, "untyped_storage") and t.dim() > 0]
    return {"copies": len(copies), "copy_names": copies, "small_modules": small,
            "policy_params": n_policy, "param_bytes": tensor_bytes(params),
            "grad_bytes": tensor_bytes(p.grad for p in params),
            "optimizer_bytes": tensor_bytes(state)}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ----------------------------------------------------------------------------- one arm


def arm_config(a, algorithm: str):
    from grpo_core.config import config_from_dict

    return config_from_dict({
        "project": {"seed": a.seed},
        "model": {"template": "r1_zero"},
        "algorithm": {"name": algorithm},
        "grpo": {"max_steps": a.steps, "per_device_train_batch_size": a.prompts * a.samples,
                 "num_generations": a.samples, "learning_rate": 1e-4, "max_completion_length": 48,
                 "save_steps": 10_000, "save_total_limit": 1},
        "rewards": {"funcs": ["accuracy", "format", "tag_count"], "weights": [1.0, 1.0, 0.5]},
        "eval": {"benchmarks": ["synthetic"], "samples": 8, "greedy": False, "max_new_tokens": 48,
                 "limit": a.eval_limit, "primary_metric": "avg@8"},
    })


def run_arm(a) -> dict:
    """Train one (model, algorithm) arm, then evaluate it; JSON-able measurements."""
    import gc

    import torch
    import trl  # noqa: F401 - imported before the baseline RSS: interpreter, not model
    from transformers import TrainerCallback
    from trl import GRPOTrainer, RLOOTrainer  # noqa: F401 - (lazy otherwise)

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.eval.evaluation import evaluate_benchmark
    from grpo_core.train import grpo, ppo, rloo, vhead  # noqa: F401
    from grpo_core.train.grpo import run_grpo_round
    from grpo_core.train.trainer_internals import wrap_generate

    start_rss = rss_mb()  # after the imports: the rise is the run's (models, activations)
    cfg = arm_config(a, a.algorithm)
    problems = generate_problems("train", a.prompts * a.steps, levels=[1, 2, 3], seed=a.seed)
    held: dict = {"sampling_s": 0.0}

    def timed(generate):  # sampling alone: the rest of a step is the update
        def timed_generate(*args, **kw):
            t = time.perf_counter()
            try:
                return generate(*args, **kw)
            finally:
                held["sampling_s"] += time.perf_counter() - t
        return timed_generate

    def hook(trainer):
        wrap_generate(trainer, timed)

        class Account(TrainerCallback):  # the last step, gradients present, Adam state from before
            def on_pre_optimizer_step(self, args, state, control, **kw):
                if state.global_step == state.max_steps - 1:
                    held["account"] = account(trainer)

        trainer.add_callback(Account())

    extra = [(a.reward_model, 0.0)] if a.reward_model else None
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_grpo_round(a.model_path, problems, cfg, tmp, "r1_zero", trainer_hook=hook,
                                extra_rewards=extra)
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
        gc.collect()
        ev = evaluate_benchmark(result.output_dir, "synthetic", cfg, limit=a.eval_limit)
    hist = result.history
    rewards = [h["reward"] for h in hist if h.get("reward") is not None]
    completions = a.prompts * a.samples
    tokens = [h["completions/mean_length"] * completions for h in hist if "completions/mean_length" in h]
    avg = ev.metrics.get("avg@8") or {}
    steps = max(result.steps, 1)
    return {**held.get("account", {}), "algorithm": a.algorithm, "model": a.model_name,
            "steps": result.steps, "s_per_step": result.train_seconds / steps,
            "sampling_s_per_step": held["sampling_s"] / steps,
            "update_s_per_step": (result.train_seconds - held["sampling_s"]) / steps,
            "tokens_per_step": statistics.fmean(tokens) if tokens else None,
            "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
            "reward_mean": statistics.fmean(rewards) if rewards else None, "rewards": rewards,
            "avg8": avg.get("mean"), "avg8_lo": avg.get("lo"), "avg8_hi": avg.get("hi"),
            "peak_rss_mb": peak_rss, "rss_rise_mb": peak_rss - start_rss, "peak_gpu_mb": peak_gpu,
            "findings": [f.line() for f in result.findings]}


# ----------------------------------------------------------------------------- report


def mb(x) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


COLUMNS = ["model", "algorithm", "copies", "param MB", "grad MB", "optim MB", "total MB",
           "peak RSS MB", "RSS rise MB", "peak GPU MB", "s/step", "sampling s", "rest s", "gen tok/step",
           "reward first/last/mean", "avg@8 [95% CI]"]


def row(r: dict) -> list[str]:
    total = sum(r.get(k) or 0 for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
    return [r["model"], r["algorithm"], str(r.get("copies", "?")), mb(r.get("param_bytes")),
            mb(r.get("grad_bytes")), mb(r.get("optimizer_bytes")), mb(total),
            fmt(r["peak_rss_mb"], ".0f"), fmt(r["rss_rise_mb"], ".0f"), fmt(r["peak_gpu_mb"], ".0f"),
            fmt(r["s_per_step"], ".2f"), fmt(r["sampling_s_per_step"], ".2f"),
            fmt(r["update_s_per_step"], ".2f"), fmt(r["tokens_per_step"], ".0f"),
            f"{fmt(r['reward_first'], '.2f')}/{fmt(r['reward_last'], '.2f')}/{fmt(r['reward_mean'], '.2f')}",
            f"{fmt(r['avg8'])} [{fmt(r['avg8_lo'])}, {fmt(r['avg8_hi'])}]"]


RATIOS = [("model copies", lambda r: r.get("copies")),
          ("param+grad+optim bytes", lambda r: sum(r.get(k) or 0 for k in
                                                  ("param_bytes", "grad_bytes", "optimizer_bytes"))),
          ("peak RSS", lambda r: r["peak_rss_mb"]), ("RSS rise", lambda r: r["rss_rise_mb"]),
          ("peak GPU memory", lambda r: r["peak_gpu_mb"]), ("seconds / step", lambda r: r["s_per_step"]),
          ("  sampling s / step", lambda r: r["sampling_s_per_step"]),
          ("  rest (scoring, values, update) s / step", lambda r: r["update_s_per_step"]),
          ("generated tokens / step", lambda r: r["tokens_per_step"])]


def ratio_rows(results: list[dict]) -> list[list[str]]:
    out = []
    for model in dict.fromkeys(r["model"] for r in results):
        g = next((r for r in results if r["model"] == model and r["algorithm"] == "grpo"), None)
        p = next((r for r in results if r["model"] == model and r["algorithm"] == "ppo"), None)
        if g is None or p is None:
            continue
        for name, get in RATIOS:
            a, b = get(g), get(p)
            if a is not None and b:
                out.append([model, name, fmt(a, ".4g"), fmt(b, ".4g"), f"{a / b:.3f}"])
    return out


def chart(results: list[dict], path: Path) -> Path:
    """Bars per model: each algorithm's memory (param+grad+optim), s/step and avg@8 with CI,
    relative to PPO's where it is a cost."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r["model"] for r in results))
    algos = list(dict.fromkeys(r["algorithm"] for r in results))
    panels = [("param+grad+optim MB", lambda r: sum(r.get(k) or 0 for k in
                                                     ("param_bytes", "grad_bytes", "optimizer_bytes")) / 2**20, None),
              ("seconds / step", lambda r: r["s_per_step"], None),
              ("held-out avg@8 (95% CI)", lambda r: r["avg8"] or 0.0, ("avg8_lo", "avg8_hi"))]
    fig = Figure(figsize=(4.4 * len(panels), 3.2 * len(models)), dpi=100)
    FigureCanvasAgg(fig)
    for i, model in enumerate(models):
        for j, (title, get, ci) in enumerate(panels):
            ax = fig.add_subplot(len(models), len(panels), i * len(panels) + j + 1)
            rs = [next((r for r in results if r["model"] == model and r["algorithm"] == al), None) for al in algos]
            vals = [get(r) if r else 0.0 for r in rs]
            err = None
            if ci:
                err = [[max(v - (r.get(ci[0]) or v), 0) for v, r in zip(vals, rs)],
                       [max((r.get(ci[1]) or v) - v, 0) for v, r in zip(vals, rs)]]
            ax.bar(algos, vals, yerr=err, color=["#4c72b0", "#dd8452", "#55a868", "#8172b3"][:len(algos)])
            ax.set_title(f"{model}: {title}", fontsize=9)
            ax.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path


def log_mlflow(uri: str, results: list[dict], markdown: str, csv_text: str, chart_path: Path,
               a) -> str:
    """One run per arm (params, per-step reward, the measurements) and the comparison run
    (table + chart), as the recipe comparison is logged (tasks.tracking.artifacts.log_comparison)."""
    from grpo_core.config import config_from_dict
    from grpo_core.workspace import artifact_root
    from tasks import tracking
    from tasks.tracking.mlflow_client import connect, experiment_id

    workspace = Path(uri[len("sqlite:///"):]).parent if uri.startswith("sqlite:///") else None
    cfg = config_from_dict({"tracking": {"tracking_uri": uri, "experiment": EXPERIMENT},
                            **({"project": {"workdir": str(workspace)}} if workspace else {})})
    c = connect(uri)
    exp = experiment_id(c, EXPERIMENT, artifact_root(uri, workspace, EXPERIMENT, cfg))
    runs = []
    for r in results:
        run = c.create_run(exp, run_name=f"{r['model']}/{r['algorithm']}",
                           tags={"grpo.pipeline": "bench-grpo-vs-ppo", "algorithm": r["algorithm"],
                                 "model": r["model"]}).info.run_id
        for k, v in {"algorithm": r["algorithm"], "model": r["model"], "steps": a.steps,
                     "prompts": a.prompts, "samples": a.samples, "seed": a.seed,
                     "reward_model": bool(a.reward_model)}.items():
            c.log_param(run, k, v)
        for step, value in enumerate(r["rewards"], 1):
            c.log_metric(run, "reward", value, step=step)
        for k in ("copies", "param_bytes", "grad_bytes", "optimizer_bytes", "peak_rss_mb", "rss_rise_mb",
                  "peak_gpu_mb", "s_per_step", "sampling_s_per_step", "update_s_per_step", "tokens_per_step", "avg8", "avg8_lo", "avg8_hi"):
            if r.get(k) is not None:
                c.log_metric(run, k.replace("avg8", "avg_at_8"), float(r[k]))
        c.set_terminated(run, "FINISHED")
        runs.append(run)
    return tracking.log_comparison(cfg, workspace, markdown, csv_text, chart_path, runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step")
    ap.add_argument("--samples", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-limit", type=int, default=48)
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--reward-model", action="store_true",
                    help="add a reward model of the policy's size (the write-ups' 3 vs 4)")
    ap.add_argument("--mlflow", metavar="URI", help="log the arms and the comparison here")
    # internal: run one arm in this process, print its JSON
    for name in ("--arm", "--algorithm", "--model-path", "--model-name"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.arm:
        a.reward_model = a.arm if a.arm != "-" else None
        print("RESULT " + json.dumps(run_arm(a)))
        return

    os.environ.setdefault("GRPO_TORCH_THREADS", "1")
    from grpo_core.modeling.loading import resolve_model_path

    t0 = time.perf_counter()
    base = resolve_model_path("builtin:tiny-arith", ROOT / ".grpo" / "models")
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"base": base}
        if "wide" in a.models:
            paths["wide"] = str(build_wide(base, Path(tmp) / "wide"))
        for model in a.models:
            rm = str(build_reward_model(paths[model], Path(tmp) / f"rm-{model}")) if a.reward_model else "-"
            for algo in a.algorithms:
                cmd = [sys.executable, __file__, "--arm", rm, "--algorithm", algo, "--model-path",
                       paths[model], "--model-name", model, "--steps", str(a.steps), "--prompts",
                       str(a.prompts), "--samples", str(a.samples), "--seed", str(a.seed),
                       "--eval-limit", str(a.eval_limit)]
                t = time.perf_counter()
                out = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if out.returncode or line is None:
                    sys.stderr.write(out.stderr[-4000:])
                    raise SystemExit(f"{model}/{algo} failed (exit {out.returncode})")
                results.append(json.loads(line[len("RESULT "):]))
                print(f"  {model}/{algo}: {time.perf_counter() - t:.0f} s", flush=True)

        heads = markdown_table(COLUMNS, [row(r) for r in results])
        ratios = markdown_table(["model", "measure", "GRPO", "PPO", "GRPO / PPO"], ratio_rows(results))
        print(f"\nGRPO vs PPO: {a.steps} steps x {a.prompts} prompts x {a.samples} samples, seed {a.seed}, "
              f"rule rewards{' + a reward model (weight 0)' if a.reward_model else ''}; "
              f"held-out: synthetic eval, first {a.eval_limit} problems, 8 samples at T=0.6")
        print(heads)
        for r in results:
            print(f"  {r['model']}/{r['algorithm']} copies: {', '.join(r.get('copy_names', []))}"
                  + (f"; small: {', '.join(r['small_modules'])}" if r.get("small_modules") else ""))
        print("\n" + ratios)
        print("\nA rule reward needs no model: GRPO holds policy + reference, PPO adds the value model. "
              "The write-ups' '3 vs 4' also count a learned reward model"
              + (" (here: --reward-model)." if a.reward_model else " (rerun with --reward-model)."))
        print(f"wall {time.perf_counter() - t0:.0f} s, load {load()}")
        if a.mlflow:
            import csv
            import io

            buf = io.StringIO()
            w = csv.writer(buf)
            w.writerow(COLUMNS)
            w.writerows(row(r) for r in results)
            md = "```\n" + heads + "\n\n" + ratios + "\n```\n"
            run = log_mlflow(a.mlflow, results, md, buf.getvalue(),
                             chart(results, Path(tmp) / "grpo_vs_ppo.png"), a)
            print(f"MLflow: experiment {EXPERIMENT!r}, comparison run {run}")


if __name__ == "__main__":
    main()
