"""RL-readiness of a model after SFT: would GRPO on it learn anything?

    r = measure_readiness(model_path, unseen_problems, cfg)
    r.metrics()   -> {"readiness/entropy": ..., "readiness/zero_variance_share": ..., ...}
    r.line()      -> "entropy 0.33 nats/token at T 1.0, zero-variance groups 41% at G 8, ..."
    readiness_findings(r, cfg) -> [Finding("sft_entropy_collapsed", ...), ...]

G = grpo.num_generations completions per problem are drawn as GRPO would draw them
(grpo.temperature, top_p 1, grpo.max_completion_length), seeded per problem from
project.seed (grpo_core.generation.sampling), on problems the model never trained on, and
scored as the difficulty filter scores them (answers.is_correct, rewards.extraction).
`entropy` is the mean per-token entropy (nats) of softmax(logits / T) over the sampled
completions' tokens, from a teacher-forced fp32 forward pass: an SFT that left the policy
near one-hot gives GRPO nothing to explore. `zero_variance_share` is the share of groups
all right or all wrong: their advantages are zero, they teach nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_core.data.problems import Problem
from grpo_core.findings import Finding
from grpo_core.generation.rollout import SamplingParams
from grpo_core.generation.sampling import derive_seed, sample_seeded
from grpo_core.prompts import render_prompt, resolve_template
from grpo_core.verify.answers import is_correct

LOGITS_BUDGET = 2**25  # logit elements per forward batch (x ~3 fp32 temporaries: ~400 MB)


def _t(t: float) -> str:
    """A temperature as said: 1.0, 0.7, 0.65."""
    return f"{t:.1f}" if t == round(t, 1) else f"{t:g}"


def grpo_temperature(cfg) -> float:
    """grpo.temperature as TRL reads it: its default 1.0 when the config does not set it."""
    return float(getattr(cfg.grpo, "temperature", 1.0))


@dataclass
class Readiness:
    problems: int  # unseen problems measured
    samples: int  # completions per problem (G = grpo.num_generations)
    temperature: float
    entropy: float  # mean nats per completion token of softmax(logits / T); nan: no tokens
    zero_variance_share: float  # groups all correct or all wrong
    pass_at_1: float  # mean correctness over all samples
    pass_at_k: float  # share of problems with >= 1 correct of G

    def metrics(self) -> dict[str, float]:
        return {"readiness/entropy": self.entropy,
                "readiness/zero_variance_share": self.zero_variance_share,
                "readiness/pass_at_1": self.pass_at_1,
                "readiness/pass_at_k": self.pass_at_k}

    def line(self) -> str:
        return (f"entropy {self.entropy:.2f} nats/token at T {_t(self.temperature)}, "
                f"zero-variance groups {self.zero_variance_share:.0%} at G {self.samples}, "
                f"pass@1 {self.pass_at_1:.2f}, pass@{self.samples} {self.pass_at_k:.2f} "
                f"({self.problems} unseen problems)")


def completion_entropy(model, tokenizer, prompts: list[str], completions: list[str],
                       temperature: float, budget: int = LOGITS_BUDGET) -> tuple[float, int]:
    """(total entropy in nats, completion tokens) of softmax(model logits / temperature) at
    each completion token of prompt + completion, teacher-forced. The completion's tokens
    are those of tokenize(prompt + completion) past its common prefix with tokenize(prompt).
    Rows are left-padded in batches sized so batch x kept positions x vocabulary stays
    within `budget`; only the last (longest completion + 1) positions' logits are computed."""
    import torch

    enc = lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    for p_ids, ids in zip(enc(prompts), enc([p + c for p, c in zip(prompts, completions)])):
        k = 0
        while k < min(len(p_ids), len(ids)) and p_ids[k] == ids[k]:
            k += 1
        k = max(k, 1)  # the first token has no prediction
        if len(ids) > k:
            rows.append((ids, len(ids) - k))
    rows.sort(key=lambda r: (len(r[0]), r[1]))
    vocab = model.get_output_embeddings().weight.shape[0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    total, count, i = 0.0, 0, 0
    while i < len(rows):
        j = i + 1  # grow the batch while its logits fit the budget
        while j < len(rows) and (j + 1 - i) * (max(c for _, c in rows[i : j + 1]) + 1) * vocab <= budget:
            j += 1
        batch, i = rows[i:j], j
        width, keep = max(len(ids) for ids, _ in batch), max(c for _, c in batch) + 1
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        scored = torch.zeros((len(batch), keep), dtype=torch.bool)
        for r, (row, c) in enumerate(batch):
            ids[r, width - len(row):] = torch.tensor(row)
            mask[r, width - len(row):] = 1
            scored[r, keep - 1 - c : keep - 1] = True  # logits at t-1 predict token t
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate gives left-padded rows
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           position_ids=positions.to(device), logits_to_keep=keep).logits
            logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            ent = -(logp.exp() * logp).sum(-1)
            del logits, logp
            total += float(ent[scored.to(ent.device)].double().sum())
        count += int(scored.sum())
    return total, count


def measure_readiness(model_path: str, problems: list[Problem], cfg, backend=None,
                      tokenizer=None) -> Readiness:
    """Readiness of the model at `model_path` (a folder, or a builtin:/fetched name) on
    `problems` it never trained on; `backend` and `tokenizer` reuse a loaded sampler."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    if not problems:
        raise ValueError("readiness needs at least one problem")
    temperature, g = grpo_temperature(cfg), cfg.grpo.num_generations
    if temperature <= 0:
        raise ValueError(f"readiness samples as GRPO does: grpo.temperature must be > 0, got {temperature}")
    path = resolve_model_path(model_path, Workspace.at(cfg.project.workdir).models)
    built = backend is None
    if built:
        from grpo_core.generation.sampling import build_backend

        backend, tokenizer = build_backend(path, cfg)
    if tokenizer is None:
        from grpo_core.modeling.loading import load_tokenizer

        tokenizer = getattr(backend, "tokenizer", None) or load_tokenizer(path, cfg.model.gguf_file)
    template = resolve_template(cfg.model.template, tokenizer)
    prompts = [render_prompt(p.problem, template, tokenizer) for p in problems]
    seed = cfg.project.seed
    params = SamplingParams(temperature=temperature, top_p=1.0,
                            max_new_tokens=cfg.grpo.max_completion_length, seed=seed)
    groups = sample_seeded(backend, prompts, g, params,
                           [derive_seed(seed, "readiness", p.fingerprint) for p in problems])
    if built:  # free the sampler (a vLLM engine's memory) before the fp32 scoring model
        from grpo_core.generation.warm_engine import warm_slot
        from grpo_core.modeling.gpu import release

        if warm_slot() is None:
            release(backend)
        backend = None
    ok = [[is_correct(c.text, p.answer, extraction=cfg.rewards.extraction) for c in group]
          for p, group in zip(problems, groups)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    total, count = completion_entropy(
        model, tokenizer, [pr for pr, group in zip(prompts, groups) for _ in group],
        [c.text for group in groups for c in group], temperature)
    del model
    return Readiness(
        problems=len(problems), samples=g, temperature=temperature,
        entropy=total / count if count else math.nan,
        zero_variance_share=sum(len(set(o)) <= 1 for o in ok) / len(ok),
        pass_at_1=sum(map(sum, ok)) / sum(map(len, ok)),
        pass_at_k=sum(any(o) for o in ok) / len(ok))


def readiness_findings(r: Readiness, cfg, min_entropy: float = 0.18,
                       max_zero_variance: float = 0.8) -> list[Finding]:
    """sft_entropy_collapsed (warn) below `min_entropy` nats/token; sft_zero_variance (warn)
    above `max_zero_variance` of the groups teaching nothing. No steps: before any GRPO."""
    settings = {"grpo.temperature": grpo_temperature(cfg),
                "grpo.num_generations": cfg.grpo.num_generations}
    out = []
    if r.entropy < min_entropy:  # nan (no completion tokens) fires nothing
        out.append(Finding(
            "sft_entropy_collapsed", "warn", [],
            {"entropy": r.entropy, "min_entropy": min_entropy, "temperature": r.temperature,
             "problems": r.problems, **settings},
            f"policy entropy {r.entropy:.3f} nats/token at T {_t(r.temperature)} is below "
            f"{min_entropy:g} on {r.problems} unseen problems (pass@1 {r.pass_at_1:.2f})"))
    if r.zero_variance_share > max_zero_variance:
        out.append(Finding(
            "sft_zero_variance", "warn", [],
            {"zero_variance_share": r.zero_variance_share, "max_zero_variance": max_zero_variance,
             "pass_at_1": r.pass_at_1, "pass_at_k": r.pass_at_k, "problems": r.problems, **settings},
            f"{r.zero_variance_share:.0%} of {r.problems} groups of G {r.samples} are all right "
            f"or all wrong (above {max_zero_variance:.0%}; pass@1 {r.pass_at_1:.2f}, "
            f"pass@{r.samples} {r.pass_at_k:.2f})"))
    return out
