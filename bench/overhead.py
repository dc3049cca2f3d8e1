"""The same small GRPO job through the pipeline (`grpo run`, a subprocess with its
Prefect server, MLflow and DuckDB) and through a bare TRL script, side by side.

Prints: the GRPO training time in each (ratio, target <= 1.10), and separately the fixed
start-up cost (imports, Prefect's temporary server, MLflow store) and the other stages.

    .venv/bin/python bench/overhead.py [--steps 20] [--model builtin:tiny-arith]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def bare_trl(model: str, steps: int, out: str) -> dict:
    """A plain TRL script: what a user would write without the pipeline."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.threads import configure_threads
    from grpo_core.prompts import render_prompt
    from grpo_core.train.trl_args import checkpointing_field
    from grpo_core.verify.rewards import registry_reward

    configure_threads()  # the same torch thread count as the pipeline's stages
    t_start = time.perf_counter()  # after imports: those are start-up cost on both sides
    tok = AutoTokenizer.from_pretrained(model)
    tok.padding_side = "left"
    problems = generate_problems("train", 64, levels=[1, 2], seed=0)
    ds = Dataset.from_list([{"prompt": render_prompt(p.problem, "r1_zero"), "answer": p.answer} for p in problems])
    args = GRPOConfig(output_dir=out, num_generations=8, per_device_train_batch_size=32, beta=0.04,
                      epsilon=0.2, loss_type="grpo", scale_rewards="group", temperature=1.0, top_p=1.0,
                      top_k=0, learning_rate=1e-4, max_completion_length=48, max_steps=steps,
                      save_strategy="no", logging_steps=1, use_cpu=True, bf16=False, report_to=[],
                      disable_tqdm=True, seed=0, **{checkpointing_field(): False},
                      reward_weights=[1.0, 1.0, 0.5])
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model),
                          reward_funcs=[registry_reward(n) for n in ("accuracy", "format", "tag_count")],
                          args=args, train_dataset=ds,
                          processing_class=tok)
    metrics = trainer.train().metrics
    trainer.save_model(out + "/final")  # the pipeline keeps its model too
    return {"job_s": time.perf_counter() - t_start, "loop_s": metrics["train_runtime"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--bare", help=argparse.SUPPRESS)  # internal: run the bare side
    a = ap.parse_args()
    if a.bare:
        print(json.dumps(bare_trl(a.model, a.steps, a.bare)))
        return
    os.environ.setdefault("GRPO_TORCH_THREADS", "1")
    from grpo_core.modeling.loading import resolve_model_path

    model = resolve_model_path(a.model, ROOT / ".grpo" / "models", progress=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--bare", tmp, "--model", model, "--steps", str(a.steps)],
                             capture_output=True, text=True, check=True)
        bare_wall = time.perf_counter() - t0
        bare = json.loads(out.stdout.strip().splitlines()[-1])

        cfg = tmp + "/bench.yaml"
        Path(cfg).write_text(yaml.safe_dump({
            "extends": str(ROOT / "configs/quickstart.yaml"), "project": {"name": "bench-overhead"},
            "model": {"name_or_path": model},
            "data": {"train": [{"source": "synthetic:arith", "limit": 64, "levels": [1, 2]}]},
            "filter": {"enabled": False},
            "grpo": {"max_steps": a.steps, "per_device_train_batch_size": 32, "learning_rate": 1e-4,
                     "save_steps": 10_000, "max_completion_length": 48},
            "eval": {"limit": 20, "samples": 1, "bootstrap": 20}}))
        env = {**os.environ, "GRPO_WORKDIR": tmp + "/ws"}
        t0 = time.perf_counter()
        subprocess.run([str(Path(sys.executable).with_name("grpo")), "run", cfg, "--quiet"], env=env,
                       check=True, capture_output=True, text=True)
        pipe_wall = time.perf_counter() - t0
        stages = [json.loads(p.read_text()) for p in Path(tmp, "ws", "cache").glob("*.json")]
        grpo = [s for s in stages if "train_seconds" in s]
        grpo_s, loop_s = sum(s["seconds"] for s in grpo), sum(s["train_seconds"] for s in grpo)
        other_s = sum(s.get("seconds", 0) for s in stages) - grpo_s

    print(f"GRPO job: {a.steps} steps, 4 prompts x G=8, tiny model, 1 thread")
    print(f"{'':32}{'bare TRL':>12}{'pipeline':>12}")
    print(f"{'training loop (s)':32}{bare['loop_s']:12.1f}{loop_s:12.1f}")
    print(f"{'GRPO job: load+train+save (s)':32}{bare['job_s']:12.1f}{grpo_s:12.1f}")
    print(f"{'wall, whole process (s)':32}{bare_wall:12.1f}{pipe_wall:12.1f}")
    print(f"training-loop ratio pipeline/bare: {loop_s / bare['loop_s']:.2f} (target <= 1.10; "
          "includes recording every completion to DuckDB and streaming metrics to MLflow)")
    print(f"GRPO job ratio (with model load, plots, model logging): {grpo_s / bare['job_s']:.2f}")
    print(f"fixed start-up, bare: {bare_wall - bare['job_s']:.1f} s; pipeline: "
          f"{pipe_wall - grpo_s - other_s:.1f} s (imports, Prefect server, MLflow store)")
    print(f"other pipeline stages (ingest, base model, 2 evals): {other_s:.1f} s")


if __name__ == "__main__":
    main()
