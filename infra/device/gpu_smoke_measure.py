"""What the GPU smoke's parts (infra/device/gpu_smoke_parts.py) measure, and on what: the inputs
(benchmark prompts, the filter's pool, GRPO's problems), generation tokens/s, the difficulty
filter, an eval, the vLLM stop-token probe, GRPO's step clock and weight probe, and GRPO
tokens/s. Each returns what the part records. infra/device/gpu_smoke.py puts infra/device/ and the project
root on sys.path before importing this."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


def bench_prompts(s: dict) -> list[str]:
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.prompts import render_prompt

    return [render_prompt(p.problem, "r1_zero")
            for p in generate_problems("train", s["prompts"], seed=123)]


def filter_pool(s: dict):
    from grpo_core.data.synthetic import generate_problems

    return generate_problems("train", s["filter_problems"], levels=[1, 2, 3], seed=0)


def grpo_problems(s: dict, need: int):
    from grpo_core.data.problems import Problem

    for tag in ("vllm", "hf"):
        f = Path(s["workdir"]) / f"kept-{tag}.json"
        rows = json.loads(f.read_text()) if f.is_file() else []
        if len(rows) >= need:
            return [Problem(**r) for r in rows], f"kept by the {tag} filter ({len(rows)})"
    pool = filter_pool(s)
    return pool, f"the synthetic pool ({len(pool)}): no filter kept a full batch"


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
    from grpo_core.eval.evaluation import evaluate_benchmark

    res = evaluate_benchmark(model_path, "synthetic", cfg, backend=backend, tokenizer=tok)
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
