"""Seeded sampling for filtering and evaluation, on top of the rollout interface.

    sample_seeded(backend, prompts, n, params, seeds) -> per prompt, n Completions
    sample_seeded(..., start=4)                        -> samples 4..4+n-1 of each prompt

Sample j of a prompt depends only on (its seed, j), never on which other prompts share a
batch, the batch size, the order prompts arrive in or how many samples are drawn. So a
pass-rate estimate of a problem is the same whether it was computed alone, in a shard of
a distributed filter or with the whole pool, an eval's per-problem rows do not change
with --limit, and samples drawn in rounds (`start`: the adaptive filter) are the
samples one call for all of them gives.

How, per backend:
- hf: every (prompt, sample) row has its own torch.Generator. At each step the row draws
  a vector of uniforms from it and picks argmax(logits / T + Gumbel noise) over the top_p
  nucleus (the Gumbel-max trick: an exact sample of softmax(logits / T)). A logits
  processor does the pick and `generate` runs greedy over its one-hot output, so batching,
  left padding and stop tokens stay transformers' business. Gumbel-max rather than an
  inverse CDF because float noise between batch shapes (~1e-7 in the logits) can only flip
  a token when the top two perturbed scores are that close, not whenever the uniform lands
  near any of the V CDF boundaries.
- vllm: one request per prompt with its own `seed` (vLLM seeds requests independently;
  V1 gives the request's sample j the seed `seed + j`, so samples from `start` on are
  the request with seed `seed + start`).
- anything else (test doubles, future backends): `backend.sample_seeded` when it exists,
  else one `backend.sample` call per prompt with the prompt's seed; with `start` > 0
  they draw start + n samples and keep the last n (their j-th draw must not depend on n).
"""
from __future__ import annotations

import hashlib
from dataclasses import replace

from grpo_core.generation.rollout import (
    Completion,
    HFBackend,
    SamplingParams,
    VLLMBackend,
    vllm_completions,
)
from grpo_core.progress import Bar

SAMPLER_VERSION = "gumbel-row-seed-v2"  # part of cache keys: bump when draws change
# v2: rows stop at a multi-token closing tag (</answer>) and the text is cut after it


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (seed, problem fingerprint, purpose, ...)."""
    blob = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") & (2**63 - 1)


def sample_seeded(backend, prompts: list[str], n: int, params: SamplingParams,
                  seeds: list[int], start: int = 0) -> list[list[Completion]]:
    """n completions per prompt, prompt i's draws fixed by seeds[i] alone (see module doc):
    its samples start, ..., start + n - 1.

    Greedy params (temperature 0) need no seed: they go straight to `backend.sample`.
    """
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if not prompts:
        return []
    if params.greedy:
        return backend.sample(prompts, n, params)
    custom = getattr(backend, "sample_seeded", None)
    if custom is None and isinstance(backend, HFBackend):
        return _hf_seeded(backend, prompts, n, params, seeds, start)
    if custom is None and isinstance(backend, VLLMBackend):
        return _vllm_seeded(backend, prompts, n, params, seeds, start)
    if custom is not None:
        out = custom(prompts, start + n, params, seeds)
    else:
        out = [backend.sample([p], start + n, replace(params, seed=s))[0]
               for p, s in zip(prompts, seeds)]
    return [row[start:] for row in out]


def gumbel_pick(logits, generators: list, temperature: float, top_p: float):
    """Each row's token: argmax(logits / T + Gumbel noise from that row's generator) within
    its top_p nucleus (module doc); `logits` rows x vocabulary, one generator per row."""
    import torch

    logits = logits.float() / temperature
    if top_p < 1.0:
        # Nucleus: the smallest top set whose mass reaches top_p (at least one token).
        probs, order = torch.sort(torch.softmax(logits, -1), descending=True, stable=True)
        outside = probs.cumsum(-1) - probs >= top_p
        logits = logits.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside),
                                    float("-inf"))
    u = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in generators])
    u = u.to(logits.device).clamp_(min=1e-20, max=1.0 - 1e-7)
    return (logits - torch.log(-torch.log(u))).argmax(-1)


def _gumbel_processor(generators: list, temperature: float, top_p: float):
    import torch
    from transformers import LogitsProcessor

    class GumbelRowSampler(LogitsProcessor):
        """Replaces each row's scores by a one-hot at that row's sampled token (for
        `generate`, rollout.drop_finished_rows off)."""

        def __call__(self, input_ids, scores):
            pick = gumbel_pick(scores, generators, temperature, top_p)
            out = torch.full_like(scores, float("-inf"))
            out.scatter_(-1, pick[:, None], 0.0)
            return out

    return GumbelRowSampler()


def _hf_seeded(backend: HFBackend, prompts: list[str], n: int, params: SamplingParams,
               seeds: list[int], start: int = 0) -> list[list[Completion]]:
    import torch
    from transformers import LogitsProcessorList

    tok, model = backend.tokenizer, backend.model
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    # (prompt, sample) jobs, shortest prompts first so batches pad little.
    jobs = sorted(((i, j) for i in range(len(prompts)) for j in range(start, start + n)),
                  key=lambda job: (lengths[job[0]], job))
    results: list[dict[int, Completion]] = [{} for _ in prompts]
    bar = Bar(len(jobs), "sampling", backend.progress)
    model.eval()
    for first in range(0, len(jobs), backend.batch_size):
        batch = jobs[first : first + backend.batch_size]
        enc = tok([prompts[i] for i, _ in batch], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(model.device)
        gens = [torch.Generator().manual_seed(derive_seed(seeds[i], j)) for i, j in batch]
        kwargs = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None,
                  "logits_processor": LogitsProcessorList(
                      [_gumbel_processor(gens, params.temperature, params.top_p)])}
        new = backend.generate_batch(
            enc, params.max_new_tokens,
            lambda logits, rows: gumbel_pick(logits, [gens[r] for r in rows],
                                             params.temperature, params.top_p), kwargs)
        for (i, j), ids in zip(batch, new):
            results[i][j] = backend.finish(ids)
        bar.advance(len(batch))
    bar.close()
    return [[r[j] for j in range(start, start + n)] for r in results]


def _vllm_seeded(backend: VLLMBackend, prompts: list[str], n: int, params: SamplingParams,
                 seeds: list[int], start: int = 0) -> list[list[Completion]]:
    # vLLM V1 seeds a request's sample j with seed + j (ParentRequest): the request
    # seeded `seed + start` draws samples start, start + 1, ... of the one seeded `seed`.
    sps = [backend.sampling_params(n, params, s % 2**31 + start) for s in seeds]
    return vllm_completions(backend.llm.generate(prompts, sps, use_tqdm=False))


def build_backend(model_path: str, cfg, progress: bool = False):
    """(backend, tokenizer) for a resolved model folder or hub id under cfg.rollout/cfg.model.
    Made inside a grpo_core.modeling.gpu.stage_memory block, the backend is shut down when it
    ends; a vLLM one inside a grpo_core.generation.warm_engine.keep_warm block is kept for the
    next stage on the same model instead."""
    from grpo_core.generation.rollout import resolve_backend_name
    from grpo_core.modeling.gpu import track
    from grpo_core.prompts import stop_strings

    name = resolve_backend_name(cfg.rollout.backend, model_path)
    stops = stop_strings(cfg.model.template)  # filter, eval and training stop alike
    if name == "vllm":
        from grpo_core.generation.warm_engine import warm_slot
        from grpo_core.modeling.threads import configure_threads

        settings = dict(tensor_parallel_size=cfg.rollout.tensor_parallel_size,
                        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                        dtype=cfg.model.dtype, seed=cfg.project.seed,
                        data_parallel_size=cfg.rollout.data_parallel_size,
                        stop_strings=stops, max_model_len=cfg.rollout.max_model_len,
                        cpu_kv_cache_gib=cfg.rollout.cpu_kv_cache_gib,
                        threads=configure_threads())
        make = lambda: VLLMBackend(model_path, **settings)  # noqa: E731
        slot = warm_slot()  # a flow's keep_warm block: the engine outlives this stage
        if slot is not None:
            backend = slot.take((model_path, tuple(sorted(settings.items()))), make)
            return backend, backend.tokenizer
        backend = make()
        return track(backend), backend.tokenizer
    from grpo_core.modeling.loading import load_policy

    model, tokenizer = load_policy(model_path, cfg.model.dtype, cfg.model.gguf_file)
    return track(HFBackend(model, tokenizer, batch_size=cfg.rollout.batch_size,
                           progress=progress, stop_strings=stops,
                           drop_finished_rows=cfg.rollout.drop_finished_rows)), tokenizer
