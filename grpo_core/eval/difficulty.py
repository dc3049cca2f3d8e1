"""Difficulty filter: keep the prompts the current policy solves 30-70% of the time.

    report = filter_problems(backend, problems, model_fp, cfg, template, tokenizer, con)
    report.kept, report.counts, report.histogram, report.reused, report.estimated

Each problem's pass rate is estimated from k samples (filter.k, filter.temperature,
filter.top_p, rollout.max_new_tokens), scored by answers.verify with the gold parsed once,
the answer read as the accuracy reward reads it (rewards.extraction);
with filter.adaptive, from the first n <= k of them, drawn in rounds until the interval
decides the band (grpo_core.eval.adaptive); with `priors` (grpo_core.eval.evidence), the
previous round's rollouts add weighted pseudo-counts. Estimates are stored in DuckDB
`pass_rates` keyed by (model fingerprint, problem, sampling key) and reused as long as
nothing they depend on changed: the weights, the sampling parameters (and the adaptive
rule), the template, the seed, the prompt text and the gold (`input_hash`), the prior.

Sample j of a problem is drawn from a seed derived from (project seed, problem content,
j) only (grpo_core.generation.sampling), so a pass rate does not depend on which problems were
estimated with it: a sharded filter gives the unsharded result (filter.shards > 1:
grpo_core.eval.shards estimates `missing_estimates` in worker processes, `fresh` counts them).
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from grpo_core.data.problems import Problem
from grpo_core.data.records import problem_key, read_pass_rates, write_pass_rates
from grpo_core.eval.adaptive import Evidence, StopPlan, budget, draw_estimates
from grpo_core.eval.evidence import prior_of
from grpo_core.eval.passrate import histogram, select_band, wilson_interval
from grpo_core.generation.rollout import SamplingParams
from grpo_core.generation.sampling import SAMPLER_VERSION, derive_seed
from grpo_core.prompts import render_prompt, resolve_template, template_hash
from grpo_core.verify.answers import verify
from grpo_core.verify.extraction import extract_answer
from grpo_core.verify.gold import parse_gold


def sampling_spec(cfg, template: str) -> dict:
    """Everything about how an estimate was sampled and scored (rewards.extraction, when
    not strict); its hash is the sampling key. An
    adaptive estimate stops by the band, so its rule and the band are in it; a fixed-k
    spec is what it always was (stores keep their estimates)."""
    f = cfg.filter
    spec = {"k": f.k, "temperature": f.temperature, "top_p": f.top_p,
            "max_new_tokens": cfg.rollout.max_new_tokens, "template": template,
            "template_hash": template_hash(template), "seed": cfg.project.seed,
            "sampler": SAMPLER_VERSION}
    if cfg.rewards.extraction != "strict":  # the success the reward counts (strict: as always)
        spec["extraction"] = cfg.rewards.extraction
    if f.adaptive:
        rule = ({"rule": "exact"} if f.adaptive == "exact"
                else {"confidence": f.adaptive_confidence})
        spec["adaptive"] = {"start": f.adaptive_start, "step": f.adaptive_step,
                            "band": list(f.band), **rule}
    return spec


def sampling_key(cfg, template: str) -> str:
    blob = json.dumps(sampling_spec(cfg, template), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def problem_seed(seed: int, p: Problem) -> int:
    """The filter's seed for one problem: its content and the project seed, nothing else."""
    return derive_seed(seed, "filter", p.fingerprint)


def _input_hash(prompt: str, answer: str) -> str:
    return hashlib.sha256(f"{prompt}\x1f{answer}".encode()).hexdigest()[:16]


def _correct(p: Problem, completions, extraction: str = "strict") -> list[bool]:
    """Per completion of one problem: is its answer, read as the accuracy reward reads it
    (rewards.extraction), the gold?"""
    gold = parse_gold(p.answer)  # once per problem; cached inside verify.gold as well
    return [bool(verify(gold, extract_answer(c.text, extraction))) for c in completions]


def _estimate_row(p: Problem, completions, outcomes: list[bool], prior: Evidence) -> dict:
    """The counted columns of an estimate: fresh samples plus the prior's pseudo-counts.
    Without a prior, exactly the fixed-k numbers (ok / n and its Wilson interval)."""
    n, ok = len(outcomes), sum(outcomes)
    s, m = ok + prior.successes, n + prior.samples  # NO_EVIDENCE adds 0.0: ok / n exactly
    rate, (lo, hi) = s / m, wilson_interval(s, m)
    return {"successes": ok, "samples": n, "pass_rate": rate, "wilson_lo": lo,
            "wilson_hi": hi, "truncated": sum(c.truncated for c in completions),
            "mean_tokens": sum(c.num_tokens for c in completions) / max(1, n),
            "outcomes": "".join("1" if o else "0" for o in outcomes),
            "prior_successes": prior.successes, "prior_samples": prior.samples}


def _stored(hit: dict) -> dict:
    """A stored row with the columns older stores lack filled in: fixed k, no prior."""
    return {**hit, "samples": hit.get("samples") or hit["k"],
            "outcomes": hit.get("outcomes"),
            "prior_successes": hit.get("prior_successes") or 0.0,
            "prior_samples": hit.get("prior_samples") or 0.0}


def _same_prior(row: dict, prior: Evidence) -> bool:
    return (abs(row["prior_successes"] - prior.successes) < 1e-9
            and abs(row["prior_samples"] - prior.samples) < 1e-9)


def _reuse(problems: list[Problem], model_fp: str, cfg, template: str, tokenizer, con,
           fresh: Collection[str] = (), priors: dict[str, Evidence] | None = None
           ) -> tuple[list[str], list[str], list[str], list[dict | None], list[int]]:
    """(prompts, input hashes, ids, rows, todo): rows[i] is the stored estimate of problem i
    when still valid (same inputs and prior; its `reused` False when its id is in `fresh`),
    else None and i is in todo. `template` is resolved."""
    key = sampling_key(cfg, template)
    prompts = [render_prompt(p.problem, template, tokenizer) for p in problems]
    inputs = [_input_hash(pr, p.answer) for pr, p in zip(prompts, problems)]
    ids = [problem_key(p) for p in problems]
    stored = {}
    if con is not None:
        stored = {r["problem_id"]: r for r in read_pass_rates(con, model_fp, key, ids)}
    rows: list[dict | None] = [None] * len(problems)
    todo = []
    fresh = set(fresh)
    for i, (pid, ih) in enumerate(zip(ids, inputs)):
        hit = _stored(stored[pid]) if pid in stored else None
        if (hit is not None and hit["input_hash"] == ih and hit["k"] == cfg.filter.k
                and _same_prior(hit, prior_of(priors, pid))):
            rows[i] = {**hit, "reused": pid not in fresh}
        else:
            todo.append(i)
    return prompts, inputs, ids, rows, todo


def estimate_pass_rates(backend, problems: list[Problem], model_fp: str, cfg, template: str,
                        tokenizer=None, con=None, chunk_problems: int | None = None,
                        fresh: Collection[str] = (),
                        priors: dict[str, Evidence] | None = None) -> list[dict]:
    """One pass-rate row per problem, in input order; stored ones are reused.

    `backend` is a RolloutBackend, or a zero-argument callable making one, called only when
    some problem has no stored estimate (so a fully cached filter never loads the model).
    `con` (duckdb connection or Store) is where estimates are read from and written to;
    None keeps nothing. Rows carry `reused` (True when read from the store, except for the
    problem ids in `fresh`: estimates a sharded filter stored for this very call). Estimates
    are written after every chunk of problems, so a killed filter resumes where it stopped.
    `priors`: problem key -> rollout evidence (grpo_core.eval.evidence), added to its counts.
    Rows carry `samples` (fresh samples drawn: k, or fewer when adaptive or with a prior).
    """
    template = resolve_template(template, tokenizer)
    spec = sampling_spec(cfg, template)
    key = sampling_key(cfg, template)
    k = cfg.filter.k
    plan = StopPlan.from_config(cfg)
    params = SamplingParams(temperature=cfg.filter.temperature, top_p=cfg.filter.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.project.seed)
    prompts, inputs, ids, rows, todo = _reuse(problems, model_fp, cfg, template, tokenizer,
                                              con, fresh, priors)
    if todo:
        if callable(backend) and not hasattr(backend, "sample"):
            backend = backend()  # lazy: built only now that sampling is needed
        batch = getattr(backend, "batch_size", 64)
        step = chunk_problems or max(1, (4 * batch) // (plan.start if plan else k))
        spec_json = json.dumps(spec, sort_keys=True)
        for start in range(0, len(todo), step):
            chunk = todo[start : start + step]
            evidence = [prior_of(priors, ids[i]) for i in chunk]
            draws = draw_estimates(
                backend, [prompts[i] for i in chunk],
                [problem_seed(cfg.project.seed, problems[i]) for i in chunk], params,
                [budget(k, e) for e in evidence], evidence,
                lambda j, comps: _correct(problems[chunk[j]], comps, cfg.rewards.extraction),
                plan)
            new = []
            for i, prior, d in zip(chunk, evidence, draws):
                p = problems[i]
                new.append({
                    "model_fingerprint": model_fp, "problem_id": ids[i], "sampling_key": key,
                    "input_hash": inputs[i], "source": p.source, "level": p.level, "k": k,
                    **_estimate_row(p, d.completions, d.outcomes, prior),
                    "sampling": spec_json})
                rows[i] = {**new[-1], "reused": False}
            if con is not None:
                write_pass_rates(con, new)
    return rows  # type: ignore[return-value]


@dataclass
class FilterReport:
    """What a filter kept, and why: counts per class, the histogram, what was reused."""

    kept: list[Problem]
    counts: dict[str, int]  # too_easy / in_band / too_hard
    histogram: dict[str, list]  # passrate.histogram: centres, edges, counts
    band: tuple[float, float]
    k: int
    reused: int  # estimates read from the store
    estimated: int  # estimates sampled now
    sampled: int = 0  # fresh completions drawn for the estimates sampled now
    with_evidence: int = 0  # estimates with a rollout prior (grpo_core.eval.evidence)
    adaptive: bool | str = False  # filter.adaptive: False, True or "exact"
    estimates: list[dict] = field(default_factory=list)  # one row per considered problem
    considered: int = 0  # problems estimated (after filter.max_problems)
    unverifiable: int = 0  # problems left out because their gold does not parse
    seconds: float = 0.0
    model_fingerprint: str = ""
    sampling_key: str = ""

    def summary(self) -> dict[str, Any]:
        """JSON-friendly numbers (no problems): for logs, MLflow and --json."""
        return {"kept": len(self.kept), "considered": self.considered, **self.counts,
                "band": list(self.band), "k": self.k, "reused": self.reused,
                "estimated": self.estimated, "sampled": self.sampled,
                "with_evidence": self.with_evidence, "adaptive": self.adaptive,
                "unverifiable": self.unverifiable,
                "seconds": round(self.seconds, 3), "histogram": self.histogram,
                "model_fingerprint": self.model_fingerprint,
                "sampling_key": self.sampling_key}

    def text_histogram(self, width: int = 40) -> str:
        """One line per pass-rate value j/k: a bar, the count, and whether it is kept."""
        counts, centres = self.histogram["counts"], self.histogram["centres"]
        top = max(counts) if counts and max(counts) else 1
        lo, hi = self.band
        lines = []
        for c, n in zip(centres, counts):
            bar = "#" * round(width * n / top)
            mark = "kept" if lo - 1e-9 <= c <= hi + 1e-9 else ""
            lines.append(f"{c:5.3f} | {bar:<{width}} {n:>5} {mark}".rstrip())
        return "\n".join(lines)


def _subsample(problems: list[Problem], n: int | None, seed: int) -> list[Problem]:
    """At most n problems, drawn with the seed, in their original order."""
    if n is None or len(problems) <= n:
        return list(problems)
    keep = sorted(random.Random(f"filter/{seed}").sample(range(len(problems)), n))
    return [problems[i] for i in keep]


def _verifiable(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if parse_gold(p.answer) is not None]


def missing_estimates(problems: list[Problem], model_fp: str, cfg, template: str,
                      tokenizer=None, con=None,
                      priors: dict[str, Evidence] | None = None) -> list[Problem]:
    """The problems filter_problems would sample now: considered (filter.max_problems),
    verifiable, and without a valid stored estimate. What a sharded filter hands out."""
    considered = _verifiable(_subsample(problems, cfg.filter.max_problems, cfg.project.seed))
    template = resolve_template(template, tokenizer)
    todo = _reuse(considered, model_fp, cfg, template, tokenizer, con, priors=priors)[-1]
    return [considered[i] for i in todo]


def filter_problems(backend, problems: list[Problem], model_fp: str, cfg, template: str,
                    tokenizer=None, con=None, fresh: Collection[str] = (),
                    priors: dict[str, Evidence] | None = None) -> FilterReport:
    """Estimate (or reuse) pass rates and keep the problems within cfg.filter.band.
    `fresh`, `priors`: see estimate_pass_rates (fresh ones count as estimated)."""
    t0 = time.perf_counter()
    considered = _subsample(problems, cfg.filter.max_problems, cfg.project.seed)
    verifiable = _verifiable(considered)
    rows = estimate_pass_rates(backend, verifiable, model_fp, cfg, template, tokenizer, con,
                               fresh=fresh, priors=priors)
    band = tuple(cfg.filter.band)
    kept_rows, counts = select_band(rows, band)
    by_id = {problem_key(p): p for p in verifiable}
    template = resolve_template(template, tokenizer)
    return FilterReport(
        kept=[by_id[r["problem_id"]] for r in kept_rows], counts=counts,
        histogram=histogram([r["pass_rate"] for r in rows], bins=cfg.filter.k), band=band,
        k=cfg.filter.k, reused=sum(r["reused"] for r in rows),
        estimated=sum(not r["reused"] for r in rows),
        sampled=sum(r["samples"] for r in rows if not r["reused"]),
        with_evidence=sum(r["prior_samples"] > 0 for r in rows),
        adaptive=cfg.filter.adaptive, estimates=rows,
        considered=len(considered), unverifiable=len(considered) - len(verifiable),
        seconds=time.perf_counter() - t0, model_fingerprint=model_fp,
        sampling_key=sampling_key(cfg, template))


def run_filter(model: str, problems: list[Problem], cfg, store=None, progress: bool = False,
               models_cache: str | None = None, fresh: Collection[str] = (),
               priors: dict[str, Evidence] | None = None) -> FilterReport:
    """Resolve the model, fingerprint it, and filter; the model is loaded only if some
    estimate is missing from the store. `model` may be `builtin:tiny-arith`. `fresh`:
    problem ids a sharded filter (grpo_core.eval.shards) just stored, reported as estimated.
    `priors`: grpo_core.eval.evidence.rollout_priors of the previous round, or None."""
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import load_tokenizer, model_fingerprint, resolve_model_path
    from grpo_core.workspace import Workspace

    cache = models_cache or Workspace.at(cfg.project.workdir).models
    path = resolve_model_path(model, cache, progress=progress)
    tokenizer = load_tokenizer(path, cfg.model.gguf_file)
    make: Callable[[], Any] = lambda: build_backend(path, cfg, progress=progress)[0]
    return filter_problems(make, problems, model_fingerprint(path), cfg, cfg.model.template,
                           tokenizer, con=store, fresh=fresh, priors=priors)
