"""Evaluation: greedy accuracy and k sampled answers per problem, scored under a protocol.

    result = evaluate_benchmark("builtin:tiny-arith", "synthetic", cfg, store=store, limit=100)
    result.metrics["greedy_accuracy"]  # {"mean", "lo", "hi", "n"}; avg@k, maj@k, pass@k, ...

Benchmarks (grpo_core/data/benchmarks.py): always the evaluation split -- gsm8k test, math500,
aime24, aime25, amc23 (from the store when ingested, else the presets under
cfg.data.data_dir / $GRPO_DATA_DIR or the hub), `synthetic` (the synthetic:arith eval
split, seed 0), or a source ingested with split test/eval. Sampling follows R1: k samples
at T=0.6, top_p=0.95 (eval.*).

Every answer is scored two ways (grpo_core/verify/answers.py): `strict` (the template's own
format; unprefixed metric names, what training rewards use) and `flexible` (the standard
evaluators' chain; metrics `flexible/<name>`). `eval.primary_metric` names the one that
decides. A scorer exception is counted in `scorer_errors`, never read as a wrong answer.

The protocol (template and its hash, k, T, top_p, max tokens, extractor version,
benchmark, split, fingerprint of the exact problem list) is hashed: numbers are comparable only under one protocol hash.
With a store, the per-problem rows and the run's metrics are written under that hash.

Two parts: `score_problems` (sampling + verification, per problem: shardable, as
eval.shards > 1 does in worker processes) and the aggregation in `evaluate_benchmark`
(metrics with bootstrap CIs over all records, then one write).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from grpo_core.data.benchmarks import (
    benchmark_problems,
)
from grpo_core.data.benchmarks import fingerprint as problems_fingerprint
from grpo_core.data.problems import Problem
from grpo_core.data.records import problem_key, write_eval
from grpo_core.data.source import SourceError
from grpo_core.eval.metric_names import metric_name, parse_metric
from grpo_core.eval.metrics import bootstrap_ci, summarise
from grpo_core.eval.score import BenchmarkScore
from grpo_core.generation.rollout import SamplingParams
from grpo_core.generation.sampling import derive_seed, sample_seeded
from grpo_core.prompts import render_prompt, resolve_template, template_hash
from grpo_core.verify import answers
from grpo_core.verify.answers import check
from grpo_core.verify.extraction import as_number, extract_answer
from grpo_core.verify.format_rules import is_well_formatted
from grpo_core.verify.gold import parse_gold
from grpo_core.verify.scorer_errors import ScorerError

BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "synthetic")
EXTRACTIONS = ("strict", "flexible")  # every benchmark result reports both


def extractor_version() -> str:
    """Names the answer extraction + verification code and the math-verify version, so a
    changed extractor changes the protocol hash. `answers.EXTRACTOR_VERSION` when the
    module declares one; else a hash of its source (any edit then counts as a change)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mv = version("math-verify")
    except PackageNotFoundError:
        mv = "none"
    declared = getattr(answers, "EXTRACTOR_VERSION", None)
    src = declared or hashlib.sha256(inspect.getsource(answers).encode()).hexdigest()[:10]
    return f"answers@{src}+math-verify@{mv}"


def protocol_for(cfg, benchmark: str, template: str, problems: list[Problem],
                 tokenizer=None) -> dict:
    """Everything that decides what an eval number means (not the model, not the seed)."""
    proto = {
        "benchmark": benchmark, "n_problems": len(problems),
        "split": ",".join(sorted({p.split for p in problems})),
        "problems_hash": problems_fingerprint(problems),
        "extractions": list(EXTRACTIONS),
        "template": template, "template_hash": template_hash(template),
        "greedy": cfg.eval.greedy, "k": cfg.eval.samples, "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p, "max_new_tokens": cfg.eval.max_new_tokens,
        "extractor": extractor_version(),
    }
    if template == "chat":  # the tokenizer's chat template shapes the prompt too
        text = getattr(tokenizer, "chat_template", None) or ""
        proto["chat_template_hash"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return proto


def protocol_hash(protocol: dict) -> str:
    return hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:16]


def vote_key(answer: str) -> Any:
    """Canonical form for majority voting: numbers by value (0.5 and 1/2 vote together),
    anything else by its cosmetic normal form."""
    number = as_number(answer)
    if number is not None and not number[2]:
        return ("num", number[0])
    return ("tex", answers.canonical(answer))


@dataclass
class EvalResult:
    metrics: dict
    protocol: dict
    protocol_hash: str
    per_problem: list[dict]
    run_id: str = ""
    benchmark: str = ""
    model: str = ""
    model_fingerprint: str = ""
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def score(self) -> BenchmarkScore:
        """What the pipeline keeps of this evaluation past the eval stage."""
        return BenchmarkScore(metrics=self.metrics, protocol_hash=self.protocol_hash,
                              eval_run_id=self.run_id, split=self.protocol.get("split"),
                              problems_hash=self.protocol.get("problems_hash"))

    def to_json(self) -> dict:
        return {"benchmark": self.benchmark, "model": self.model,
                "model_fingerprint": self.model_fingerprint, "run_id": self.run_id,
                "split": self.protocol.get("split"),
                "problems_hash": self.protocol.get("problems_hash"),
                "protocol_hash": self.protocol_hash, "protocol": self.protocol,
                "metrics": self.metrics, "seconds": round(self.seconds, 3)}


def _judge(gold, text: str, extraction: str) -> tuple[str | None, bool | None]:
    """(extracted answer, correct?); correct is None when the scorer itself failed (counted
    as scorer_errors and logged by answers with the input's hash, never read as wrong)."""
    ans = extract_answer(text, extraction)
    try:
        return ans, check(gold, ans)
    except ScorerError:
        return ans, None


def _record(p: Problem, greedy, samples, think: bool) -> dict:
    """One problem's row: answers and verdicts under both extractions. Field names without
    a suffix are strict (the template's format); `_flexible` ones the evaluators' chain."""
    gold = parse_gold(p.answer)
    rec: dict[str, Any] = {"problem_id": problem_key(p), "source": p.source, "level": p.level,
                           "subject": p.subject, "gold": p.answer}
    errors = 0
    for mode in EXTRACTIONS:
        sfx = "" if mode == "strict" else f"_{mode}"
        if greedy is not None:
            ans, ok = _judge(gold, greedy.text, mode)
            errors += ok is None
            rec.update({f"greedy_answer{sfx}": ans, f"greedy_correct{sfx}": ok})
        if samples:
            judged = [_judge(gold, c.text, mode) for c in samples]
            errors += sum(ok is None for _, ok in judged)
            # A failed sample verdict counts as not correct (pass@k needs a verdict per
            # sample); it is counted in scorer_errors, which the report lists.
            rec.update({f"sample_answers{sfx}": [a for a, _ in judged],
                        f"sample_correct{sfx}": [bool(ok) for _, ok in judged]})
    if greedy is not None:
        rec.update(greedy_truncated=greedy.truncated,
                   greedy_well_formatted=is_well_formatted(greedy.text, think),
                   greedy_completion=greedy.text)
    if samples:
        rec.update(sample_truncated=[c.truncated for c in samples],
                   sample_well_formatted=[is_well_formatted(c.text, think) for c in samples],
                   sample_num_tokens=[c.num_tokens for c in samples],
                   sample_completions=[c.text for c in samples])
    rec["scorer_errors"] = errors
    return rec


FLEXIBLE_FIELDS = ("greedy_correct", "greedy_answer", "sample_correct", "sample_answers")


def flexible_view(record: dict) -> dict:
    """The record with its flexible verdicts under the strict field names (for metrics)."""
    return {**record, **{f: record.get(f"{f}_flexible") for f in FLEXIBLE_FIELDS
                         if f"{f}_flexible" in record}}


def _cut(text: Any, n: int) -> Any:
    if isinstance(text, str) and len(text) > n:
        return text[:n] + f"... [{len(text) - n} more chars]"
    return text


def eval_table_rows(records: list[dict], max_chars: int = 2000) -> list[dict]:
    """The records as a table to read (tasks.tracking logs it): id, level, gold, greedy
    answer/completion/correct, and the samples' answers, correctness and completions
    (lists as JSON text; completions cut to max_chars, a sample's to a quarter of it)."""
    rows = []
    for r in records:
        correct = r.get("sample_correct") or []
        rows.append({
            "problem_id": r.get("problem_id"), "source": r.get("source"), "level": r.get("level"),
            "subject": r.get("subject"), "gold": r.get("gold"),
            "greedy_answer": r.get("greedy_answer"), "correct": r.get("greedy_correct"),
            "greedy_completion": _cut(r.get("greedy_completion"), max_chars),
            "sample_accuracy": (sum(map(bool, correct)) / len(correct)) if correct else None,
            "sample_answers": json.dumps(r.get("sample_answers") or []),
            "sample_correct": json.dumps([bool(x) for x in correct]),
            "sample_completions": json.dumps([_cut(t, max_chars // 4)
                                              for t in r.get("sample_completions") or []]),
        })
    return rows


def _format_adherence(records: list[dict], ci_kw: dict) -> dict | None:
    """Share of well-formatted completions: greedy ones when there are, else samples."""
    flags = [float(r["greedy_well_formatted"]) for r in records
             if r.get("greedy_well_formatted") is not None]
    if not flags:
        flags = [sum(r["sample_well_formatted"]) / len(r["sample_well_formatted"])
                 for r in records if r.get("sample_well_formatted")]
    if not flags:
        return None
    mean, lo, hi = bootstrap_ci(flags, **ci_kw)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(flags)}


def score(records: list[dict], cfg) -> dict:
    """metrics.summarise (strict extraction, unprefixed keys) plus the headline metrics
    under flexible extraction (`flexible/<metric>`), format adherence and scorer errors."""
    ci_kw = {"n_resamples": cfg.eval.bootstrap, "seed": cfg.project.seed}
    metrics = summarise(records, canon=vote_key, **ci_kw)
    flexible = summarise([flexible_view(r) for r in records], canon=vote_key, **ci_kw)
    for name in flexible:  # greedy_accuracy, then each kind@k
        m = parse_metric(name)
        if m is not None:
            metrics[metric_name(m.kind, m.k, "flexible")] = flexible[name]
    metrics["format_adherence"] = _format_adherence(records, ci_kw)
    sample_flags = [f for r in records for f in r.get("sample_well_formatted") or []]
    metrics["format_adherence_samples"] = (sum(sample_flags) / len(sample_flags)
                                           if sample_flags else None)
    metrics["scorer_errors"] = sum(r.get("scorer_errors", 0) for r in records)
    return metrics


def _greedy(backend, prompts: list[str], max_new_tokens: int) -> list:
    outs = backend.sample(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    return [o[0] for o in outs]


def score_greedy(backend, tokenizer, problems: list[Problem], template: str,
                 max_new_tokens: int) -> float:
    """Greedy strict accuracy on `problems` (what `greedy_accuracy` measures; a scorer
    failure counts as not correct): the in-round evaluation's one number."""
    prompts = [render_prompt(p.problem, template, tokenizer) for p in problems]
    verdicts = [_judge(parse_gold(p.answer), c.text, "strict")[1]
                for p, c in zip(problems, _greedy(backend, prompts, max_new_tokens))]
    return sum(bool(v) for v in verdicts) / max(len(verdicts), 1)


def greedy_records(backend, tokenizer, problems: list[Problem], template: str,
                   max_new_tokens: int) -> list[dict]:
    """The per-problem records of greedy decoding alone (no samples): what a paired
    greedy-accuracy comparison needs, at a fraction of score_problems' cost."""
    prompts = [render_prompt(p.problem, template, tokenizer) for p in problems]
    return [_record(p, g, None, pr.rstrip().endswith("<think>"))
            for p, g, pr in zip(problems, _greedy(backend, prompts, max_new_tokens), prompts)]


def score_problems(backend, tokenizer, problems: list[Problem], cfg, template: str
                   ) -> list[dict]:
    """The per-problem records of `problems`: the expensive part (sampling, verification).
    A problem's record depends on that problem alone (greedy decoding; samples seeded from
    its fingerprint), so scoring any contiguous split of the list, in any process, and
    concatenating gives the records of the whole list (eval.shards, flows/shards.py)."""
    prompts = [render_prompt(p.problem, template, tokenizer) for p in problems]
    e, seed = cfg.eval, cfg.project.seed
    greedy = [None] * len(problems)
    if e.greedy:
        greedy = _greedy(backend, prompts, e.max_new_tokens)
    params = SamplingParams(temperature=e.temperature, top_p=e.top_p,
                            max_new_tokens=e.max_new_tokens, seed=seed)
    samples = sample_seeded(backend, prompts, e.samples, params,
                            [derive_seed(seed, "eval", p.fingerprint) for p in problems])
    return [_record(p, g, s, pr.rstrip().endswith("<think>"))
            for p, g, s, pr in zip(problems, greedy, samples, prompts)]


@contextmanager
def _briefly(store, open_store: Callable[[], Any] | None) -> Iterator[Any]:
    """The store for one short use: `store` as given (its holder keeps it open), or one
    opened by `open_store` now and closed (its write lock released) right after."""
    if open_store is None:
        yield store
        return
    with open_store() as opened:
        yield opened


def evaluate_benchmark(model_path: str, benchmark: str, cfg, store=None,
                       limit: int | None = None, backend=None, tokenizer=None,
                       progress: bool = False, scorer: Callable[..., list[dict]] | None = None,
                       open_store: Callable[[], Any] | None = None) -> EvalResult:
    """Evaluate one model on one benchmark under cfg.eval; write rows when `store` is given.

    `open_store` (instead of `store`): a function opening the store, for a caller that
    must not hold DuckDB's one write lock while it generates (`grpo eval`, minutes to
    hours): the store is opened to read the problems and closed, then opened again to
    write the results in one short transaction at the end.

    `model_path` may be `builtin:tiny-arith` (built into the workspace cache on first use).
    Pass `backend` and `tokenizer` to reuse a loaded model across benchmarks.
    `scorer(cfg, path, template, problems) -> records` scores the problems elsewhere (the
    sharded-eval flow's workers, flows/shards.py) instead of `score_problems` here; no
    model is loaded then. The records are aggregated and stored the same way either way.
    """
    from grpo_core.modeling.loading import load_tokenizer, model_fingerprint, resolve_model_path
    from grpo_core.workspace import Workspace

    t0 = time.perf_counter()
    limit = limit or cfg.eval.limit
    with _briefly(store, open_store) as s:
        problems = benchmark_problems(benchmark, cfg, s, limit)
    if not problems:
        raise SourceError(f"benchmark {benchmark!r} has no problems")
    path = resolve_model_path(model_path, Workspace.at(cfg.project.workdir).models, progress)
    if scorer is not None:
        tokenizer = tokenizer or load_tokenizer(path, cfg.model.gguf_file)
    elif backend is None:
        from grpo_core.generation.sampling import build_backend

        backend, tokenizer = build_backend(path, cfg, progress=progress)
    template = resolve_template(cfg.model.template, tokenizer)
    protocol = protocol_for(cfg, benchmark, template, problems, tokenizer)
    phash = protocol_hash(protocol)
    if scorer is not None:
        records = scorer(cfg, path, template, problems)
    else:
        records = score_problems(backend, tokenizer, problems, cfg, template)
    if [r["problem_id"] for r in records] != [problem_key(p) for p in problems]:
        raise RuntimeError(f"{benchmark}: the scored records do not match the problems")
    metrics = score(records, cfg)
    result = EvalResult(metrics=metrics, protocol=protocol, protocol_hash=phash,
                        per_problem=records, run_id=uuid.uuid4().hex[:12], benchmark=benchmark,
                        model=model_path, model_fingerprint=model_fingerprint(path),
                        seconds=time.perf_counter() - t0)
    if store is None and open_store is None:
        return result
    with _briefly(store, open_store) as s:
        write_eval(s, {"run_id": result.run_id, "protocol_hash": phash,
                       "benchmark": benchmark, "model": model_path,
                       "model_fingerprint": result.model_fingerprint,
                       "seed": cfg.project.seed, "protocol": protocol, "metrics": metrics,
                       "seconds": result.seconds}, records)
    return result
