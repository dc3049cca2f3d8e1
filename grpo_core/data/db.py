"""The DuckDB store file: every table's schema and the helpers that write it.

One file holds two groups of tables:

    problem store (grpo_core.data.store)   problems, quarantine, ingest_log
    training pools (grpo_core.data.pool)   pools, pool_rows
    stage results (grpo_core.data.records) pass_rates, rollouts, eval_results, eval_runs
    lineage (grpo_core.data.lineage)       which problems each stage consumed

`STORE_SQL` / `RESULTS_SQL` create them (idempotent); the Arrow schemas type the bulk
inserts. Every write is one `transaction`: all or nothing, with the Arrow tables it
inserts from registered as views for its duration. Functions take a duckdb connection or
anything with a `.con` (a `grpo_core.data.store.Store`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

# ----------------------------------------------------------------------------- problem store

STORE_SQL = """
CREATE TABLE IF NOT EXISTS problems (
    source VARCHAR NOT NULL, split VARCHAR NOT NULL, fingerprint VARCHAR NOT NULL,
    id VARCHAR, problem VARCHAR NOT NULL, answer VARCHAR NOT NULL, solution VARCHAR,
    level INTEGER, subject VARCHAR, row_index BIGINT, ingest_id VARCHAR,
    ingested_at TIMESTAMP, contaminated BOOLEAN NOT NULL DEFAULT FALSE,
    contaminated_with VARCHAR,
    PRIMARY KEY (source, split, fingerprint));
-- Added with near-duplicate detection (issue 25): the normalised problem text's hash; rows
-- of stores made before have NULL and are checked for exact duplicates only.
ALTER TABLE problems ADD COLUMN IF NOT EXISTS text_key VARCHAR;
CREATE TABLE IF NOT EXISTS quarantine (
    source VARCHAR, split VARCHAR, row_index BIGINT, code VARCHAR, reason VARCHAR,
    raw VARCHAR, source_fingerprint VARCHAR, ingest_id VARCHAR, quarantined_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS ingest_log (
    ingest_id VARCHAR PRIMARY KEY, source VARCHAR, split VARCHAR, origin VARCHAR,
    source_fingerprint VARCHAR, total_rows BIGINT, ingested BIGINT, quarantined BIGINT,
    duplicates BIGINT, contaminated BIGINT, repaired BIGINT, started_at TIMESTAMP,
    finished_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS pools (
    pool VARCHAR PRIMARY KEY, size BIGINT, created_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS pool_rows (
    pool VARCHAR NOT NULL, pos BIGINT NOT NULL, source VARCHAR NOT NULL,
    split VARCHAR NOT NULL, fingerprint VARCHAR NOT NULL, id VARCHAR);
"""
# pools: a training pool by its content fingerprint (grpo_core.data.pool); pool_rows: its
# members in stratified order (any prefix is a seeded sample stratified by source and level)
STORE_TABLES = ("problems", "quarantine", "ingest_log")
PROBLEM_SCHEMA = pa.schema([
    ("source", pa.string()), ("split", pa.string()), ("fingerprint", pa.string()),
    ("id", pa.string()), ("problem", pa.string()), ("answer", pa.string()),
    ("solution", pa.string()), ("level", pa.int32()), ("subject", pa.string()),
    ("row_index", pa.int64()), ("text_key", pa.string())])
QUARANTINE_SCHEMA = pa.schema([
    ("source", pa.string()), ("split", pa.string()), ("row_index", pa.int64()),
    ("code", pa.string()), ("reason", pa.string()), ("raw", pa.string())])

# ----------------------------------------------------------------------------- stage results

RESULTS_SQL = """
CREATE TABLE IF NOT EXISTS pass_rates (
    model_fingerprint VARCHAR NOT NULL, problem_id VARCHAR NOT NULL,
    sampling_key VARCHAR NOT NULL, input_hash VARCHAR, source VARCHAR, level INTEGER,
    k INTEGER, successes INTEGER, pass_rate DOUBLE, wilson_lo DOUBLE, wilson_hi DOUBLE,
    truncated INTEGER, mean_tokens DOUBLE, sampling VARCHAR, created_at TIMESTAMP,
    PRIMARY KEY (model_fingerprint, problem_id, sampling_key));
-- Added with the adaptive filter and rollout evidence (issue 15); stores made before get
-- them by ALTER, and their rows (NULL here) are fixed-k estimates: k samples, no prior.
-- samples: fresh samples drawn (k unless adaptive); outcomes: '1'/'0' per fresh sample,
-- in sample order; prior_*: the weighted rollout pseudo-counts added (grpo_core.eval.evidence).
ALTER TABLE pass_rates ADD COLUMN IF NOT EXISTS samples INTEGER;
ALTER TABLE pass_rates ADD COLUMN IF NOT EXISTS outcomes VARCHAR;
ALTER TABLE pass_rates ADD COLUMN IF NOT EXISTS prior_successes DOUBLE;
ALTER TABLE pass_rates ADD COLUMN IF NOT EXISTS prior_samples DOUBLE;
CREATE TABLE IF NOT EXISTS rollouts (
    run_id VARCHAR, round INTEGER, step INTEGER, idx INTEGER, problem_id VARCHAR,
    prompt VARCHAR, completion VARCHAR, answer VARCHAR, rewards VARCHAR, reward DOUBLE,
    advantage DOUBLE, created_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS eval_results (
    run_id VARCHAR NOT NULL, protocol_hash VARCHAR NOT NULL, model_fingerprint VARCHAR,
    benchmark VARCHAR, problem_id VARCHAR NOT NULL, source VARCHAR, level INTEGER,
    subject VARCHAR, gold VARCHAR, greedy_answer VARCHAR, greedy_correct BOOLEAN,
    greedy_truncated BOOLEAN, greedy_well_formatted BOOLEAN, greedy_completion VARCHAR,
    sample_answers VARCHAR[], sample_correct BOOLEAN[], sample_truncated BOOLEAN[],
    sample_well_formatted BOOLEAN[], sample_num_tokens INTEGER[],
    sample_completions VARCHAR[], PRIMARY KEY (run_id, problem_id));
-- Added with the flexible extraction (issue 11); stores made before get them by ALTER.
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS greedy_answer_flexible VARCHAR;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS greedy_correct_flexible BOOLEAN;
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS sample_answers_flexible VARCHAR[];
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS sample_correct_flexible BOOLEAN[];
ALTER TABLE eval_results ADD COLUMN IF NOT EXISTS scorer_errors INTEGER;
CREATE TABLE IF NOT EXISTS eval_runs (
    run_id VARCHAR PRIMARY KEY, protocol_hash VARCHAR NOT NULL, benchmark VARCHAR,
    model VARCHAR, model_fingerprint VARCHAR, n_problems INTEGER, seed BIGINT,
    protocol VARCHAR, metrics VARCHAR, seconds DOUBLE, created_at TIMESTAMP);
-- Which problems each stage consumed (grpo_core.data.lineage): role sft_example (uses:
-- epochs), filter_candidate / filter_kept, grpo_prompt (uses: groups trained), and the
-- memorisation probe's probe_trained / probe_unseen; model_in -> model_out by fingerprint.
CREATE TABLE IF NOT EXISTS lineage (
    stage_key VARCHAR NOT NULL, stage VARCHAR NOT NULL, round INTEGER, config_hash VARCHAR,
    recipe VARCHAR, model_in VARCHAR, model_out VARCHAR, role VARCHAR NOT NULL,
    problem_id VARCHAR NOT NULL, uses DOUBLE, created_at TIMESTAMP,
    PRIMARY KEY (stage_key, role, problem_id));
"""
RESULT_TABLES = ("pass_rates", "rollouts", "eval_results", "eval_runs", "lineage")
PASS_RATE_SCHEMA = pa.schema([
    ("model_fingerprint", pa.string()), ("problem_id", pa.string()),
    ("sampling_key", pa.string()), ("input_hash", pa.string()), ("source", pa.string()),
    ("level", pa.int32()), ("k", pa.int32()), ("successes", pa.int32()),
    ("pass_rate", pa.float64()), ("wilson_lo", pa.float64()), ("wilson_hi", pa.float64()),
    ("truncated", pa.int32()), ("mean_tokens", pa.float64()), ("sampling", pa.string()),
    ("samples", pa.int32()), ("outcomes", pa.string()), ("prior_successes", pa.float64()),
    ("prior_samples", pa.float64())])
ROLLOUT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("round", pa.int32()), ("step", pa.int32()), ("idx", pa.int32()),
    ("problem_id", pa.string()), ("prompt", pa.string()), ("completion", pa.string()),
    ("answer", pa.string()), ("rewards", pa.string()), ("reward", pa.float64()),
    ("advantage", pa.float64())])
EVAL_RESULT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("protocol_hash", pa.string()),
    ("model_fingerprint", pa.string()), ("benchmark", pa.string()),
    ("problem_id", pa.string()), ("source", pa.string()), ("level", pa.int32()),
    ("subject", pa.string()), ("gold", pa.string()), ("greedy_answer", pa.string()),
    ("greedy_correct", pa.bool_()), ("greedy_truncated", pa.bool_()),
    ("greedy_well_formatted", pa.bool_()), ("greedy_completion", pa.string()),
    ("sample_answers", pa.list_(pa.string())), ("sample_correct", pa.list_(pa.bool_())),
    ("sample_truncated", pa.list_(pa.bool_())),
    ("sample_well_formatted", pa.list_(pa.bool_())),
    ("sample_num_tokens", pa.list_(pa.int32())), ("sample_completions", pa.list_(pa.string())),
    ("greedy_answer_flexible", pa.string()), ("greedy_correct_flexible", pa.bool_()),
    ("sample_answers_flexible", pa.list_(pa.string())),
    ("sample_correct_flexible", pa.list_(pa.bool_())), ("scorer_errors", pa.int32())])

# ----------------------------------------------------------------------------- helpers


def connection(con_or_store: Any) -> duckdb.DuckDBPyConnection:
    return getattr(con_or_store, "con", con_or_store)


def ensure_tables(con_or_store: Any) -> duckdb.DuckDBPyConnection:
    """Create the stage-result tables if missing (needs a writable connection); returns
    the connection."""
    con = connection(con_or_store)
    con.execute(RESULTS_SQL)
    return con


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE "
                            "table_name = ?", [table]).fetchall()[0][0])


def now() -> datetime:
    """UTC now as a naive timestamp (what the TIMESTAMP columns hold)."""
    return datetime.now(UTC).replace(tzinfo=None)


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection, **views: pa.Table) -> Iterator[None]:
    """All or nothing, with Arrow tables registered as views for the duration."""
    con.execute("BEGIN TRANSACTION")
    try:
        for name, table in views.items():
            con.register(name, table)
        yield
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        for name in views:
            try:
                con.unregister(name)
            except duckdb.Error:
                pass


def arrow_table(rows: Iterable[dict], schema: pa.Schema) -> pa.Table:
    """Rows (dicts; missing keys are null, extra keys ignored) as a table of `schema`."""
    return pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows],
                                schema=schema)


def dicts(cur: duckdb.DuckDBPyConnection) -> list[dict]:
    """The rows of an executed query as dicts keyed by column name."""
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]
