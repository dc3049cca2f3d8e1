"""The memory plan (grpo_core/modeling/memory_plan.py, device "cpu") against the measured
peak of real GRPO steps, for three model sizes, side by side.

Each size runs in its own process (peak RSS is a per-process high-water mark):
run_grpo_round on CPU (use_cpu, fp32, no autocast) for `--steps` optimizer steps, beta
0.04 (so TRL builds its reference model), G 2 completions of 16 tokens per prompt, one
prompt per step. The measurement is peak RSS (getrusage ru_maxrss) minus the RSS of the
idle process right before the model is loaded (libraries imported): the plan counts
everything from the policy's weights on, so its baseline is the process without a model.
Two steps by default: Adam's state is created lazily by the first optimizer step, so only
from the second step on does a backward pass run beside it, the steady state the plan
describes (one step: `--steps 1`).

Sizes: builtin:proxy-qwen2 (0.1M params: the fixed runtime term dominates), a random
Qwen2 of ~0.16B (hidden 768, 16 layers, vocabulary 32768) and a random Qwen2 with
Qwen2.5-0.5B's shape (0.49B, vocabulary 151936), float32, the proxy's tokenizer (ids
beyond it decode to nothing, which a memory measurement does not mind).

    .venv/bin/python bench/memory_plan.py [--steps 2] [--models proxy,mid,qwen05]

Measured 2026-12-01 on 2 cores under load 5-13: the proxy 128 s, mid 437 s, the 0.5B
model 864 s (it peaks near 11.3 GiB above idle: run nothing big beside it). docs/benchmarks.md
holds the table; `--json rows.json` saves a run, `--rows rows.json` reprints it.
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

from harness import ROOT, load

# Qwen2Config numbers of the random models (the proxy is its own recipe)
SIZES = {
    "mid": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
            "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 32768},
    "qwen05": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
               "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936},
}
TERMS = ("runtime", "policy_weights", "gradients", "optimizer_adam", "reference_model",
         "activations", "logprob_chunk", "kv_cache")


def plan_terms(plan: dict) -> dict:
    b = dict(plan["bytes"])
    b["activations"] = b["activations_ckpt" if plan["gradient_checkpointing"] else "activations_no_ckpt"]
    return {t: b.get(t, 0) for t in TERMS}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def bench_config(model_path: str, steps: int):
    from grpo_core.config import config_from_dict

    return config_from_dict({
        "model": {"name_or_path": model_path},
        "grpo": {"max_steps": steps, "save_steps": 10_000, "max_completion_length": 16,
                 "per_device_train_batch_size": 2, "num_generations": 2,
                 "gradient_accumulation_steps": 1, "learning_rate": 1e-5, "beta": 0.04,
                 "activation_checkpointing": False},
        "rewards": {"funcs": ["accuracy", "format"]}})


def child(model_path: str, steps: int, out: str) -> dict:
    """GRPO steps in this process; the measurement and the plan as a dict."""
    import grpo_core.train.grpo  # noqa: F401  (imports TRL, transformers, torch)
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.modeling.memory_plan import memory_plan
    from grpo_core.prompts import render_prompt
    from grpo_core.train.grpo import run_grpo_round

    cfg = bench_config(model_path, steps)
    problems = generate_problems("train", 2 * steps, levels=[1])
    tok = load_tokenizer(model_path)
    prompt_tokens = max(len(tok(render_prompt(p.problem, "r1_zero"))["input_ids"]) for p in problems)
    plan = memory_plan(cfg, device="cpu", prompt_tokens=prompt_tokens)
    del tok
    seen = {}

    def hook(trainer):
        seen["params"] = sum(p.numel() for p in trainer.model.parameters())
        seen["ref_dtype"] = str(next(trainer.ref_model.parameters()).dtype)

    base = _rss()  # libraries imported, no model yet
    t0 = time.perf_counter()
    result = run_grpo_round(model_path, problems, cfg, out, "r1_zero", trainer_hook=hook)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"steps": result.steps, "seconds": round(time.perf_counter() - t0, 1),
            "idle_rss": base, "peak_rss": peak, "measured": peak - base, "plan": plan, **seen}


def build_random(name: str, cache: Path) -> str:
    """A random float32 Qwen2 of SIZES[name] with the proxy's tokenizer, saved to cache."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.proxy import build_proxy_tokenizer

    texts = [p.problem + " " + p.solution for p in generate_problems("train", 100, seed=0)]
    tok = build_proxy_tokenizer(texts)  # the proxy's, without its warm-started weights
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES[name], tie_word_embeddings=True, max_position_embeddings=2048,
                         bos_token_id=None, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, dtype="float32")
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out = cache / name
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--models", default="proxy,mid,qwen05")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--rows", help="print the table of rows saved with --json, no run (the "
                    "plan's runtime term taken from the current CPU_RUNTIME_BYTES)")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.steps, args.child[1])))
        return
    if args.rows:
        from grpo_core.modeling.memory_plan import CPU_RUNTIME_BYTES

        rows = json.loads(Path(args.rows).read_text())
        for r in rows:
            plan = r["plan"]
            old = plan["bytes"].get("runtime", 0)
            plan["bytes"]["runtime"] = CPU_RUNTIME_BYTES
            plan["total_bytes"] += CPU_RUNTIME_BYTES - old
        print_table(rows, rows[0]["steps"], load_avg=None)
        return

    rows = []
    with tempfile.TemporaryDirectory(prefix="memplan-bench-") as tmp:
        for name in args.models.split(","):
            if name == "proxy":
                from grpo_core.modeling.loading import resolve_model_path

                path = str(resolve_model_path("builtin:proxy-qwen2", Path(tmp) / "models"))
            else:  # built in a child too: the parent stays small
                path = subprocess.run(
                    [sys.executable, "-c", "import sys; sys.path.insert(0, 'bench'); "
                     "from memory_plan import build_random; from pathlib import Path; "
                     f"print(build_random({name!r}, Path({tmp!r})))"],
                    capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()[-1]
            proc = subprocess.run(
                [sys.executable, __file__, "--steps", str(args.steps), "--child", path,
                 str(Path(tmp) / f"run-{name}")],
                capture_output=True, text=True, cwd=ROOT,
                env={**os.environ, "GRPO_TORCH_THREADS": os.environ.get("GRPO_TORCH_THREADS", "2")})
            if proc.returncode:
                sys.exit(f"{name}: child failed\n{proc.stderr[-4000:]}")
            rows.append({"model": name, **json.loads(proc.stdout.strip().splitlines()[-1])})
            print(f"[{name}: {rows[-1]['seconds']} s]", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print_table(rows, args.steps)


def print_table(rows: list[dict], steps: int, load_avg: str | None = "now") -> None:
    gib = 2**30
    print(f"GRPO on CPU (fp32, no autocast), {steps} step(s), 1 prompt x G 2, 16 completion tokens, "
          f"beta 0.04, no checkpointing; peak RSS above the idle process"
          + (f"; load {load()}" if load_avg else ""))
    head = ["model", "params"] + [t.replace("optimizer_", "opt_").replace("reference_model", "reference")
                                  .replace("policy_", "").replace("activations", "activ") for t in TERMS] + ["plan", "measured", "ratio"]
    print(" ".join(f"{h:>11}" for h in head))
    for r in rows:
        plan = r["plan"]
        terms = [v / gib for v in plan_terms(plan).values()]
        cells = [r["model"], f"{plan['params'] / 1e6:.1f}M"] + [f"{v:.3f}" for v in terms] + [
            f"{plan['total_bytes'] / gib:.3f}", f"{r['measured'] / gib:.3f}",
            f"{plan['total_bytes'] / r['measured']:.2f}"]
        print(" ".join(f"{c:>11}" for c in cells))
    print("(GiB; ratio = plan / measured; reference dtype as TRL built it: "
          + ", ".join(f"{r['model']} {r.get('ref_dtype')}" for r in rows) + ")")


if __name__ == "__main__":
    main()
