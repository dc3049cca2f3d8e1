"""Sharded difficulty filter: the missing estimates split across worker processes.

    parts = split(todo, cfg.filter.shards)                  # contiguous, deterministic
    paths = [estimate_shard(path, cfg_dict, template, fp, part, out) ...]  # one per worker
    fresh = ingest_shards(store, paths)                     # one transaction

A worker loads the model itself and writes its rows to a Parquet file (records'
PASS_RATE_SCHEMA); only the process holding the store writes DuckDB, all shards at once,
so a failed shard or a failed ingest leaves no half-filled filter behind. Each problem is
sampled from its own seed (difficulty.problem_seed), so the rows equal the unsharded
filter's whatever the split (an adaptive estimate's too: its rounds are per problem).
With rollout evidence, each shard's priors travel next to its problems (`write_priors`).
No Prefect here: flows/shards.py maps the workers.

Resumable: `work_key` names a shard run's folder after everything its files depend on
(model, sampling spec, prompt rendering, shard count, the ordered problems), so a run
killed while shards sample finds the same folder again; `finished_shard` tells which of
its Parquet files (written atomically) are complete and for the very same problems, and
only the others are sampled again.

Evaluation the same way (eval.shards): `score_shard` writes one shard's per-problem eval
records (evaluation.score_problems) to Parquet, `read_records` gives them back exactly;
the parent concatenates the shards in order, aggregates and stores as unsharded.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_core.data.db import EVAL_RESULT_SCHEMA, PASS_RATE_SCHEMA, ensure_tables, now, transaction
from grpo_core.data.problems import Problem
from grpo_core.data.records import problem_key

T = TypeVar("T")


def split(items: Sequence[T], n: int) -> list[list[T]]:
    """min(n, len(items)) contiguous shards in order, sizes differing by at most one (the
    first ones larger); concatenated they give `items` back. Depends on nothing else."""
    if n < 1:
        raise ValueError(f"need at least one shard, got {n}")
    n = min(n, len(items))
    size, extra = divmod(len(items), n) if n else (0, 0)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(list(items[start:end]))
        start = end
    return out


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_threads(shards: int, cores: int | None = None) -> int:
    """Torch threads per worker so that the shards together use the cores once."""
    return max(1, (cores or usable_cores()) // max(1, shards))


def write_problems(problems: list[Problem], path: str | Path) -> str:
    """A shard's input as JSON lines (Problem rows): keeps the flow's parameters small."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(p.to_row(), ensure_ascii=False) + "\n" for p in problems)
    return str(path)


def read_problems(path: str | Path) -> list[Problem]:
    with open(path, encoding="utf-8") as fh:
        return [Problem(**json.loads(line)) for line in fh if line.strip()]


def priors_path(problems_path: str | Path) -> Path:
    """Where a shard's priors lie: next to its problems file."""
    return Path(problems_path).with_suffix(".priors.json")


def write_priors(priors: dict[str, Any], path: str | Path) -> str:
    """Rollout priors (problem key -> Evidence or (successes, samples)) as JSON."""
    Path(path).write_text(json.dumps({k: list(v) for k, v in priors.items()}, sort_keys=True))
    return str(path)


def read_priors(path: str | Path) -> dict[str, Any]:
    """`write_priors`' file back as problem key -> Evidence; {} when there is none."""
    from grpo_core.eval.adaptive import Evidence

    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    return {k: Evidence(*v) for k, v in raw.items()}


def estimate_shard(model_path: str, cfg: dict[str, Any], template: str, model_fp: str,
                   problems: list[Problem], out_path: str | Path,
                   threads: int | None = None, priors: dict[str, Any] | None = None) -> str:
    """Estimate one shard's pass rates in this process and write them to `out_path`
    (Parquet, PASS_RATE_SCHEMA); returns the path. Writes no store. `cfg` is a
    PipelineConfig as a dict; `threads` sets $GRPO_TORCH_THREADS before the model loads;
    `priors`: the shard's rollout evidence (difficulty.estimate_pass_rates)."""
    from grpo_core.config import PipelineConfig
    from grpo_core.eval.difficulty import estimate_pass_rates
    from grpo_core.generation.sampling import build_backend

    if threads:
        os.environ["GRPO_TORCH_THREADS"] = str(threads)  # read by modeling.loading.load_policy
    config = PipelineConfig.model_validate(cfg)
    backend, tokenizer = build_backend(model_path, config)
    rows = estimate_pass_rates(backend, problems, model_fp, config, template, tokenizer,
                               con=None, priors=priors)
    table = pa.Table.from_pylist([{n: r[n] for n in PASS_RATE_SCHEMA.names} for r in rows],
                                 schema=PASS_RATE_SCHEMA)
    out = Path(out_path)
    part = out.with_name(out.name + ".part")
    pq.write_table(table, part)
    os.replace(part, out)  # a killed worker leaves no file that looks finished
    return str(out)


def work_key(model_fp: str, spec: dict[str, Any], shards: int, problems: list[Problem],
             chat_template: str | None = None, priors: dict[str, Any] | None = None) -> str:
    """The key of a sharded filter's work: equal exactly when its shard files would be.
    `spec` is difficulty.sampling_spec (template, k, temperature, top_p, max_new_tokens,
    seed, sampler: what a stored estimate is keyed by), `shards` the shard count asked for
    (with the problems it fixes the split), `problems` the todo in order, whole rows (id,
    text, gold, source, level: what a row's input_hash and columns come from), and
    `chat_template` the tokenizer's when the template is "chat" (it renders the prompts but
    is not part of the model fingerprint), `priors` the rollout evidence (a row's prior)."""
    from grpo_core.eval.evidence import evidence_fingerprint

    h = hashlib.sha256()
    head = {"model_fingerprint": model_fp, "sampling": spec, "shards": shards,
            "chat_template": chat_template, "n": len(problems)}
    if priors:
        head["evidence"] = evidence_fingerprint(priors)
    h.update(json.dumps(head, sort_keys=True).encode())
    for p in problems:
        h.update(b"\n" + json.dumps(p.to_row(), sort_keys=True, ensure_ascii=False)
                 .encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


def finished_shard(path: str | Path, problems: list[Problem], model_fp: str,
                   sampling_key: str) -> bool:
    """True when `path` is a complete shard file (estimate_shard writes it atomically) of
    exactly these problems, in order, under this model and sampling key; False when it is
    missing, unreadable, of an older schema or for something else (then the shard is
    sampled again)."""
    try:
        if set(PASS_RATE_SCHEMA.names) - set(pq.read_schema(path).names):
            return False  # written before columns were added: sample it again
        table = pq.read_table(path, columns=["problem_id", "model_fingerprint",
                                             "sampling_key"])
    except (OSError, pa.ArrowException):
        return False
    return (table.column("problem_id").to_pylist() == [problem_key(p) for p in problems]
            and set(table.column("model_fingerprint").to_pylist()) <= {model_fp}
            and set(table.column("sampling_key").to_pylist()) <= {sampling_key})


def ingest_shards(con_or_store: Any, paths: list[str | Path]) -> list[str]:
    """Insert (or replace) every shard file's rows into `pass_rates` in ONE transaction:
    all of them or, when any file is missing or unreadable, none. Returns the problem ids
    written, in file order."""
    con = ensure_tables(con_or_store)
    cols = ", ".join(PASS_RATE_SCHEMA.names)
    ids: list[str] = []
    created = now()
    with transaction(con):
        for path in paths:
            # Read inside the transaction, one file at a time: memory stays one shard.
            table = pq.read_table(path).select(PASS_RATE_SCHEMA.names).cast(PASS_RATE_SCHEMA)
            con.register("_shard_pass_rates", table)
            try:
                con.execute(f"INSERT OR REPLACE INTO pass_rates ({cols}, created_at) "
                            f"SELECT {cols}, ? FROM _shard_pass_rates", [created])
            finally:
                con.unregister("_shard_pass_rates")
            ids += table.column("problem_id").to_pylist()
    return ids


# ----------------------------------------------------------------------------- evaluation

# An eval record's columns (evaluation._record): the stored row less what the run adds.
EVAL_RECORD_SCHEMA = pa.schema([f for f in EVAL_RESULT_SCHEMA if f.name not in
                                ("run_id", "protocol_hash", "model_fingerprint", "benchmark")])


def write_records(records: list[dict], path: str | Path) -> str:
    """Eval records to Parquet so that `read_records` gives them back equal, key for key
    and type for type: only the columns the records have (greedy_* are absent when
    eval.greedy is off), typed by EVAL_RECORD_SCHEMA (a bool stays a bool, a list a list).
    A key outside the schema or records with different keys raise: nothing is dropped."""
    keys = list(records[0]) if records else EVAL_RECORD_SCHEMA.names
    unknown = sorted({k for r in records for k in r} - set(EVAL_RECORD_SCHEMA.names))
    if unknown:
        raise ValueError(f"eval record columns without a Parquet type: {unknown}")
    if any(set(r) != set(keys) for r in records):
        raise ValueError("eval records with different columns in one shard")
    schema = pa.schema([EVAL_RECORD_SCHEMA.field(k) for k in keys])
    out = Path(path)
    part = out.with_name(out.name + ".part")
    pq.write_table(pa.Table.from_pylist(records, schema=schema), part)
    os.replace(part, out)  # a killed worker leaves no file that looks finished
    return str(out)


def read_records(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def score_shard(model_path: str, cfg: dict[str, Any], template: str, problems: list[Problem],
                out_path: str | Path, threads: int | None = None) -> str:
    """Score one shard of an eval's problems in this process (evaluation.score_problems)
    and write the records to `out_path` (Parquet); returns the path. Writes no store.
    `cfg` is a PipelineConfig as a dict; `threads` as for estimate_shard."""
    from grpo_core.config import PipelineConfig
    from grpo_core.eval.evaluation import score_problems
    from grpo_core.generation.sampling import build_backend

    if threads:
        os.environ["GRPO_TORCH_THREADS"] = str(threads)  # read by modeling.loading.load_policy
    config = PipelineConfig.model_validate(cfg)
    backend, tokenizer = build_backend(model_path, config)
    return write_records(score_problems(backend, tokenizer, problems, config, template),
                         out_path)
