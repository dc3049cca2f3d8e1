"""Rollout throughput and filter cost, side by side in one run.

    .venv/bin/python bench/rollout.py [--model builtin:tiny-arith] [--prompts 64] [--samples 8]

1. Samples per second of the `hf` backend on the same requests (64 prompts x 8 samples,
   T=1.0, rollout.max_new_tokens): batched (batch_size 64) against one sequence at a time
   (batch_size 1), plus the filter's per-sample-seeded sampler (grpo_core.generation.sampling),
   batched, to show what seeding each row costs.
2. The difficulty filter's wall time on the same prompts with an empty store (every
   estimate sampled; the model is loaded) against the second call (every estimate read
   back from DuckDB; the model is never loaded).

Threads: $GRPO_TORCH_THREADS (else torch's default); the count is printed. On a shared
machine use --repeats 2 or more: each side keeps its best time.
The built-in model is cached under .grpo/models (built once, ~2-3 min on 2 cores).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import ROOT, load, timed  # noqa: F401 - also puts the repo root on sys.path

from grpo_core.config import PipelineConfig
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.difficulty import run_filter
from grpo_core.generation.rollout import HFBackend, SamplingParams
from grpo_core.generation.sampling import sample_seeded
from grpo_core.modeling.loading import load_policy, resolve_model_path
from grpo_core.modeling.threads import configure_threads
from grpo_core.prompts import render_prompt, resolve_template


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=PipelineConfig().rollout.max_new_tokens)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1,
                    help="Time each rollout this many times (interleaved) and keep the best: "
                    "on a shared machine one pass can be slowed by other work.")
    args = ap.parse_args()

    import torch

    configure_threads()
    path = resolve_model_path(args.model, ROOT / ".grpo" / "models", progress=True)
    model, tok = load_policy(path)
    template = resolve_template("auto", tok)
    problems = generate_problems("train", args.prompts, seed=123)
    prompts = [render_prompt(p.problem, template, tok) for p in problems]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    n_req = len(prompts) * args.samples
    print(f"model {args.model} ({path}), template {template}, torch threads "
          f"{torch.get_num_threads()}, device {model.device}")
    print(f"requests: {len(prompts)} prompts x {args.samples} samples = {n_req} completions, "
          f"max {args.max_new_tokens} new tokens, T=1.0")

    batched = HFBackend(model, tok, batch_size=args.batch_size)
    single = HFBackend(model, tok, batch_size=1)
    batched.sample(prompts[:2], 2, params)  # warm-up (lazy inits, allocator)

    seeds = list(range(len(prompts)))
    sides = (
        (f"hf batched (batch_size {args.batch_size})",
         lambda: batched.sample(prompts, args.samples, params)),
        ("hf one at a time (batch_size 1)", lambda: single.sample(prompts, args.samples, params)),
        (f"seeded sampler (batch_size {args.batch_size})",
         lambda: sample_seeded(batched, prompts, args.samples, params, seeds)),
    )
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for label, fn in sides:
            out, secs = timed(fn)
            tokens = sum(c.num_tokens for cs in out for c in cs)
            if label not in best or secs < best[label][0]:
                best[label] = (secs, tokens)
    rows = [(label, secs, n_req / secs, tokens / secs) for label, (secs, tokens) in best.items()]
    print()
    print(f"{'rollout':<36} {'seconds':>8} {'samples/s':>10} {'tokens/s':>9}")
    for label, secs, sps, tps in rows:
        print(f"{label:<36} {secs:8.2f} {sps:10.1f} {tps:9.0f}")
    print(f"batched / one at a time: {rows[0][2] / rows[1][2]:.1f}x samples/s")
    print(f"seeded / plain batched:  {rows[2][2] / rows[0][2]:.2f}x samples/s")

    # The filter: same prompts, k = samples, an empty store, then the same call again.
    cfg = PipelineConfig()
    cfg.rollout.backend = "hf"
    cfg.rollout.batch_size = args.batch_size
    cfg.rollout.max_new_tokens = args.max_new_tokens
    cfg.filter.k = args.samples
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "s.duckdb") as store:
        first, t_first = timed(lambda: run_filter(path, problems, cfg, store=store))
        second, t_second = timed(lambda: run_filter(path, problems, cfg, store=store))
    print()
    print(f"{'difficulty filter':<36} {'seconds':>8} {'estimated':>10} {'reused':>9}")
    print(f"{'empty store (model loaded)':<36} {t_first:8.2f} {first.estimated:10d} "
          f"{first.reused:9d}")
    print(f"{'stored estimates (no model load)':<36} {t_second:8.2f} {second.estimated:10d} "
          f"{second.reused:9d}")
    print(f"without / with stored estimates: {t_first / t_second:.0f}x wall time; "
          f"same counts: {first.counts == second.counts} {first.counts}")


if __name__ == "__main__":
    main()
