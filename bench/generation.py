"""Filter/eval generation on this CPU, four ways on the same batch, in one run:

    .venv/bin/python bench/generation.py --model .grpo/models/smollm2-135m-instruct \
        [--vllm-python .venv-vllm/bin/python] [--gguf X.gguf --llama-python /venv/bin/python]

The batch: --prompts synthetic problems x --k samples at T=1, up to --max-new-tokens, the
chat template, the pipeline's stop strings (a filter stage's shape). Sides, each in a fresh
process of its own (start-up = imports + model load, or engine start; peak RSS per process):

1. `hf generate`: transformers `model.generate` over fixed batches of --batch rows;
2. `pipeline hf`: the pipeline's hf backend (HFBackend: rows leave the batch as they stop);
3. `vLLM CPU`: the pipeline's vllm backend (VLLMBackend) on vLLM's CPU build, run by
   --vllm-python (`make setup-vllm`'s .venv-vllm) - the same code a GPU runs;
4. `llama.cpp`: llama-cpp-python on the GGUF the fetched model was converted from (Q4_1),
   one sequence at a time (its high-level API), run by --llama-python.

Printed: tokens, generation seconds, tokens/s, start-up seconds, peak RSS, each side's
tokens/s over the pipeline hf backend's, and the crossover: the stage size (completions of
this length) below which the pipeline's hf backend finishes first because vLLM's engine
start costs more than its faster decoding saves. Every side runs --threads threads; the load
average is printed with the table: compare sides of one run, not runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from harness import ROOT, load, resolved_model

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
a = json.loads(sys.argv[1])
sys.path.insert(0, a["root"])
side = a["side"]
if side != "llama.cpp":  # llama.cpp's venv holds neither torch nor the project
    import torch
    torch.set_num_threads(a["threads"])
    from grpo_core.generation.rollout import SamplingParams
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=a["max_new_tokens"], seed=0)
if side == "llama.cpp":
    from llama_cpp import Llama
    llm = Llama(model_path=a["gguf"], n_ctx=1024, n_threads=a["threads"], n_batch=512,
                verbose=False, seed=0)
    start = time.perf_counter() - t0
    t1, n = time.perf_counter(), 0
    for p in a["prompts"]:
        for i in range(a["k"]):
            out = llm.create_completion(p, max_tokens=a["max_new_tokens"], temperature=1.0,
                                        top_p=1.0, stop=a["stops"], seed=i)
            n += out["usage"]["completion_tokens"]
elif side == "vllm":
    import os
    os.environ["GRPO_TORCH_THREADS"] = str(a["threads"])
    from grpo_core.generation.rollout import VLLMBackend
    b = VLLMBackend(a["model"], stop_strings=tuple(a["stops"]), max_model_len=a["max_model_len"],
                    threads=a["threads"])
    start = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = b.sample(a["prompts"], a["k"], params)
    n = sum(c.num_tokens for row in out for c in row)
else:
    from grpo_core.generation.rollout import HFBackend
    from grpo_core.modeling.loading import load_policy
    model, tok = load_policy(a["model"])
    start = time.perf_counter() - t0
    t1 = time.perf_counter()
    if side == "pipeline hf":
        b = HFBackend(model, tok, batch_size=a["batch"], stop_strings=tuple(a["stops"]))
        out = b.sample(a["prompts"], a["k"], params)
        n = sum(c.num_tokens for row in out for c in row)
    else:  # bare generate over fixed batches; a row's tokens up to its eos
        torch.manual_seed(0)
        tok.padding_side = "left"
        rows = [p for p in a["prompts"] for _ in range(a["k"])]
        n = 0
        for s in range(0, len(rows), a["batch"]):
            enc = tok(rows[s:s + a["batch"]], return_tensors="pt", padding=True,
                      add_special_tokens=False)
            with torch.inference_mode():
                gen = model.generate(**enc, max_new_tokens=a["max_new_tokens"], do_sample=True,
                                     temperature=1.0, top_p=1.0, top_k=0,
                                     pad_token_id=tok.pad_token_id, stop_strings=a["stops"],
                                     tokenizer=tok)
            for r in gen[:, enc["input_ids"].shape[1]:]:
                ends = (r == tok.pad_token_id).nonzero()
                n += int(ends[0]) + 1 if len(ends) else r.shape[0]
gen_s = time.perf_counter() - t1
if side == "vllm":
    b.shutdown()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB -> GB
print("RESULT " + json.dumps({"start_s": start, "gen_s": gen_s, "tokens": n, "rss_gb": rss}))
"""

SIDES = ("hf generate", "pipeline hf", "vllm", "llama.cpp")


def run_side(side: str, py: str, payload: dict) -> dict | None:
    t0 = time.perf_counter()
    proc = subprocess.run([py, "-c", CHILD, json.dumps({**payload, "side": side})],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(f"{side}: failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    out = json.loads(lines[-1].removeprefix("RESULT "))
    out["wall_s"] = time.perf_counter() - t0
    return out


def crossover(hf: dict, vllm: dict) -> float | None:
    """Completions (of this bench's mean length) at which hf's start + generation equals
    vLLM's: below it hf finishes first. None when vLLM is not faster per token."""
    per_c_hf = hf["gen_s"] / hf["completions"]
    per_c_v = vllm["gen_s"] / vllm["completions"]
    if per_c_v >= per_c_hf:
        return None
    return max(0.0, (vllm["start_s"] - hf["start_s"]) / (per_c_hf - per_c_v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True,
                    help="a model folder or fetched name (grpo model fetch), as `grpo run` takes")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64, help="hf sides: rows per batch")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("GRPO_TORCH_THREADS", "1")))
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--llama-python", default=None)
    ap.add_argument("--sides", default=",".join(SIDES))
    args = ap.parse_args()
    args.model = resolved_model(args.model)

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.prompts import render_prompt, stop_strings

    tok = load_tokenizer(args.model)
    prompts = [render_prompt(p.problem, "chat", tok)
               for p in generate_problems("test", args.prompts, seed=11, levels=[1, 2])]
    longest = max(len(tok(p)["input_ids"]) for p in prompts)
    payload = {"root": str(ROOT), "model": args.model, "prompts": prompts, "k": args.k,
               "max_new_tokens": args.max_new_tokens, "batch": args.batch,
               "threads": args.threads, "stops": list(stop_strings("chat")), "gguf": args.gguf,
               "max_model_len": longest + args.max_new_tokens + 8}
    pythons = {"hf generate": sys.executable, "pipeline hf": sys.executable,
               "vllm": args.vllm_python, "llama.cpp": args.llama_python or sys.executable}
    results: dict[str, dict] = {}
    loads = [load()]
    for side in args.sides.split(","):
        if side == "llama.cpp" and not args.gguf:
            continue
        r = run_side(side, pythons[side], payload)
        loads.append(load())
        if r:
            r["completions"] = args.prompts * args.k
            results[side] = r
            print(f"{side}: {r}", file=sys.stderr, flush=True)
    cpu = next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")), "?")
    print(f"\n{args.prompts} prompts x {args.k} samples, T=1, <= {args.max_new_tokens} new tokens, "
          f"{args.threads} thread(s); CPU {cpu} ({os.cpu_count()} cores); load {' -> '.join(loads)}")
    base = results.get("pipeline hf")
    print("| side | tokens | generation s | tokens/s | x pipeline hf | start-up s | peak RSS GB |")
    print("|---|---|---|---|---|---|---|")
    for side, r in results.items():
        tps = r["tokens"] / r["gen_s"]
        ratio = f"{tps / (base['tokens'] / base['gen_s']):.2f}" if base else "-"
        print(f"| {side} | {r['tokens']} | {r['gen_s']:.1f} | {tps:.1f} | {ratio} | "
              f"{r['start_s']:.1f} | {r['rss_gb']:.2f} |")
    if base and "vllm" in results:
        c = crossover(base, results["vllm"])
        mean = base["tokens"] / base["completions"]
        print("crossover: " + ("vLLM is not faster per token here" if c is None else
              f"below ~{c:.0f} completions of ~{mean:.0f} tokens (~{c * mean:.0f} generated "
              "tokens) a stage finishes first on the pipeline's hf backend"))


if __name__ == "__main__":
    main()
