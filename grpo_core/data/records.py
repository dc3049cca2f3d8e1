"""DuckDB tables the stages write next to the problem store, and their read/write helpers.

    pass_rates    one difficulty estimate per (model fingerprint, problem, sampling key)
    rollouts      every GRPO completion with its per-function rewards and advantage
    eval_results  one row per (eval run, problem): answers, correctness, truncation
    eval_runs     one row per eval run: the protocol (and its hash) and the metrics JSON

Every function takes a duckdb connection or a `Store` (its `.con`). The schemas live in
grpo_core.data.db; writes are bulk inserts from Arrow, each one `db.transaction`. Reads of a table that does not exist yet (a
fresh or read-only store) return nothing rather than fail. `stage_problems` reads the
problems a stage works on: from the store when ingested there, else from the source.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from grpo_core.data.db import (
    EVAL_RESULT_SCHEMA,
    PASS_RATE_SCHEMA,
    ROLLOUT_SCHEMA,
    arrow_table,
    connection,
    dicts,
    ensure_tables,
    has_table,
    now,
    transaction,
)
from grpo_core.data.problems import Problem

# ----------------------------------------------------------------------------- pass rates


def write_pass_rates(con_or_store: Any, rows: list[dict]) -> int:
    """Insert (or replace) estimates keyed by (model_fingerprint, problem_id, sampling_key)."""
    if not rows:
        return 0
    con = ensure_tables(con_or_store)
    cols = ", ".join(PASS_RATE_SCHEMA.names)
    with transaction(con, _new_pass_rates=arrow_table(rows, PASS_RATE_SCHEMA)):
        con.execute(f"INSERT OR REPLACE INTO pass_rates ({cols}, created_at) "
                    f"SELECT {cols}, ? FROM _new_pass_rates", [now()])
    return len(rows)


def read_pass_rates(con_or_store: Any, model_fingerprint: str | None = None,
                    sampling_key: str | None = None,
                    problem_ids: list[str] | None = None) -> list[dict]:
    """Stored estimates, optionally for one model, one sampling key and some problems."""
    con = connection(con_or_store)
    if not has_table(con, "pass_rates"):
        return []
    where, params = ["TRUE"], []
    if model_fingerprint is not None:
        where.append("model_fingerprint = ?")
        params.append(model_fingerprint)
    if sampling_key is not None:
        where.append("sampling_key = ?")
        params.append(sampling_key)
    if problem_ids is not None:
        if not problem_ids:
            return []
        con.register("_want_ids", pa.table({"problem_id": pa.array(problem_ids, pa.string())}))
        where.append("problem_id IN (SELECT problem_id FROM _want_ids)")
    try:
        return dicts(con.execute(
            f"SELECT * FROM pass_rates WHERE {' AND '.join(where)} "
            "ORDER BY model_fingerprint, sampling_key, problem_id", params))
    finally:
        if problem_ids is not None:
            con.unregister("_want_ids")


# ----------------------------------------------------------------------------- rollouts


def write_rollouts(con_or_store: Any, rows: list[dict], run_id: str, step: int,
                   round: int = 0) -> int:
    """Append one step's completions (the GRPO trainer's rollout-sink rows: prompt,
    completion, answer, problem_id, rewards {name: value}, reward, advantage)."""
    return write_rollout_steps(con_or_store, [(step, rows)], run_id, round)


def write_rollout_steps(con_or_store: Any, steps: list[tuple[int, list[dict]]], run_id: str,
                        round: int = 0) -> int:
    """Append several steps' completions in one transaction."""
    flat = [{**r, "run_id": run_id, "round": round, "step": step, "idx": i,
             "answer": None if r.get("answer") is None else str(r["answer"]),
             "rewards": json.dumps(r.get("rewards") or {}, default=_json_default)}
            for step, rows in steps for i, r in enumerate(rows)]
    if not flat:
        return 0
    con = ensure_tables(con_or_store)
    table = arrow_table(flat, ROLLOUT_SCHEMA)
    cols = ", ".join(ROLLOUT_SCHEMA.names)
    with transaction(con, _new_rollouts=table):
        con.execute(f"INSERT INTO rollouts ({cols}, created_at) SELECT {cols}, ? "
                    "FROM _new_rollouts", [now()])
    return len(flat)


class RolloutBuffer:
    """A `RolloutSink` for grpo_core.train.grpo that keeps steps in memory and writes them at
    each checkpoint save and at the end of training (run_grpo_round calls `flush`): one
    transaction per checkpoint instead of one per step, off the training hot path. Rows
    past the last checkpoint of a killed round are generated again on resume anyway."""

    def __init__(self, con_or_store: Any, run_id: str, round: int = 0):
        self.target, self.run_id, self.round = con_or_store, run_id, round
        self.pending: list[tuple[int, list[dict]]] = []

    def __call__(self, step: int, rows: list[dict]) -> None:
        self.pending.append((step, rows))

    def flush(self) -> int:
        steps, self.pending = self.pending, []
        return write_rollout_steps(self.target, steps, self.run_id, self.round)


def rollout_sink(con_or_store: Any, run_id: str, round: int = 0) -> RolloutBuffer:
    """The rollout sink for a GRPO round writing to the `rollouts` table."""
    return RolloutBuffer(con_or_store, run_id, round)


def read_rollouts(con_or_store: Any, run_id: str | None = None) -> list[dict]:
    con = connection(con_or_store)
    if not has_table(con, "rollouts"):
        return []
    rows = dicts(con.execute(
        "SELECT * FROM rollouts WHERE (?::VARCHAR IS NULL OR run_id = ?) "
        "ORDER BY run_id, round, step, idx", [run_id, run_id]))
    for r in rows:
        r["rewards"] = json.loads(r["rewards"]) if r["rewards"] else {}
    return rows


def _json_default(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return repr(value)


# ----------------------------------------------------------------------------- evaluation


def write_eval(con_or_store: Any, run: dict, per_problem: list[dict]) -> None:
    """One eval run (protocol, metrics) and its per-problem rows, in one transaction."""
    con = ensure_tables(con_or_store)
    base = {k: run.get(k) for k in ("run_id", "protocol_hash", "model_fingerprint",
                                    "benchmark")}
    table = arrow_table(({**r, **base} for r in per_problem), EVAL_RESULT_SCHEMA)
    cols = ", ".join(EVAL_RESULT_SCHEMA.names)
    with transaction(con, _new_eval_results=table):
        con.execute(f"INSERT INTO eval_results ({cols}) SELECT {cols} FROM _new_eval_results")
        con.execute(
            "INSERT INTO eval_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run["run_id"], run["protocol_hash"], run.get("benchmark"), run.get("model"),
             run.get("model_fingerprint"), len(per_problem), run.get("seed"),
             json.dumps(run.get("protocol") or {}, sort_keys=True),
             json.dumps(run.get("metrics") or {}, sort_keys=True), run.get("seconds"),
             now()])


def read_eval_runs(con_or_store: Any, protocol_hash: str | None = None,
                   benchmark: str | None = None) -> list[dict]:
    """Eval runs, oldest first, with protocol and metrics parsed back from JSON."""
    con = connection(con_or_store)
    if not has_table(con, "eval_runs"):
        return []
    rows = dicts(con.execute(
        "SELECT * FROM eval_runs WHERE (?::VARCHAR IS NULL OR protocol_hash = ?) AND "
        "(?::VARCHAR IS NULL OR benchmark = ?) ORDER BY created_at, run_id",
        [protocol_hash, protocol_hash, benchmark, benchmark]))
    for r in rows:
        r["protocol"] = json.loads(r["protocol"])
        r["metrics"] = json.loads(r["metrics"])
    return rows


def read_eval_results(con_or_store: Any, run_id: str | None = None,
                      protocol_hash: str | None = None) -> list[dict]:
    """Per-problem rows (the records `metrics.summarise` re-scores)."""
    con = connection(con_or_store)
    if not has_table(con, "eval_results"):
        return []
    return dicts(con.execute(
        "SELECT * FROM eval_results WHERE (?::VARCHAR IS NULL OR run_id = ?) AND "
        "(?::VARCHAR IS NULL OR protocol_hash = ?) ORDER BY run_id, problem_id",
        [run_id, run_id, protocol_hash, protocol_hash]))


def model_records(con_or_store: Any, model_fp: str, benchmark: str) -> list[dict]:
    """The per-problem rows of the newest evaluation of model `model_fp` on `benchmark`."""
    runs = [r for r in read_eval_runs(con_or_store, benchmark=benchmark)
            if r["model_fingerprint"] == model_fp]
    return read_eval_results(con_or_store, run_id=runs[-1]["run_id"]) if runs else []


# ----------------------------------------------------------------------------- problems


def problem_key(p: Problem) -> str:
    """The id a stage stores results under: the dataset id, else the content fingerprint."""
    return p.id or p.fingerprint


def stage_problems(source: str, split: str | None = None, *, store: Any = None,
                   data_dir: str | Path | None = None, limit: int | None = None,
                   seed: int = 0, levels: list[int] | None = None,
                   exclude_contaminated: bool = True) -> list[Problem]:
    """The problems of one source split: from the store when ingested there, else read
    (presets, files, hub ids) or generated (synthetic:arith) on the fly, unstored.

    Raises `grpo_core.data.adapters.SourceError` when the source cannot be found.
    """
    if store is not None and not source.startswith("synthetic:"):
        rows = store.problems(source, split, exclude_contaminated=exclude_contaminated,
                              limit=limit)
        if rows:
            return rows
    if source.startswith("synthetic:"):
        from grpo_core.data.synthetic import SOURCE, generate_problems

        if source != SOURCE:
            from grpo_core.data.source import SourceError

            raise SourceError(f"unknown synthetic task {source!r}; known: {SOURCE}")
        return generate_problems(split or "train", n=limit or 1000, levels=levels, seed=seed)
    from grpo_core.data.adapters import resolve_source
    from grpo_core.data.readers import BadRow, Rejection
    from grpo_core.data.validation import patient_gold_parsing
    from grpo_core.verify.gold import parse_gold

    adapter = resolve_source(source, split=split, data_dir=data_dir, limit=limit)
    out: list[Problem] = []
    with patient_gold_parsing():
        for index, raw in adapter.rows():
            if isinstance(raw, BadRow):
                continue
            p = adapter.convert(index, raw)
            # Rows the store would quarantine are left out here too.
            if not isinstance(p, Rejection) and parse_gold(p.answer) is not None:
                out.append(p)
    return out


def drop_rollouts_after(con_or_store: Any, run_id: str, step: int) -> int:
    """Forget a run's rollouts of steps after `step` (steps count from 1, as the trainer's
    logs and checkpoints: 0 forgets them all): a round resumed from the checkpoint at
    `step` generates them again, and they must not be stored twice."""
    con = ensure_tables(con_or_store)
    n = con.execute("SELECT count(*) FROM rollouts WHERE run_id = ? AND step > ?",
                    [run_id, step]).fetchone()[0]
    con.execute("DELETE FROM rollouts WHERE run_id = ? AND step > ?", [run_id, step])
    return n
