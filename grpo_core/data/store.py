"""The DuckDB problem store: validated problems, quarantined rows, and an ingest log.

    with Store.open(workspace.db_path) as store:
        report = store.ingest(resolve_source("gsm8k", data_dir="../shared/data"))
        pool = store.problems("gsm8k", "train")       # contaminated rows left out

Tables: `problems` (the Problem columns + row_index, ingest_id, ingested_at, contaminated,
contaminated_with), `quarantine` (source, split, row_index, code, reason, raw row as JSON),
`ingest_log` (source fingerprint and counts); their schema is grpo_core.data.db's, the row
checks grpo_core.data.validation's (re-exported here). One ingest is one transaction: a failure
leaves the store exactly as it was. Rows are unique per (source, split, fingerprint), so
re-ingesting a source adds nothing. DuckDB admits one writing process at a time; a second
one gets `StoreLockedError` (after waiting up to `timeout` seconds).
"""
from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Self

import duckdb
import pyarrow as pa

from grpo_core.data import decontam
from grpo_core.data.db import (
    PROBLEM_SCHEMA,
    QUARANTINE_SCHEMA,
    STORE_SQL,
    STORE_TABLES,
    now,
    transaction,
)
from grpo_core.data.decontam_sql import contaminated_rows
from grpo_core.data.problems import Problem
from grpo_core.data.source import Adapter
from grpo_core.data.validation import (
    MAX_PROBLEM_CHARS,
    IngestReport,
    check_rows,
    patient_gold_parsing,
)

MAX_RAW_CHARS = 65536  # raw rows kept in quarantine are cut here
INGEST_BATCH = 20_000  # rows checked and written at a time: an ingest's memory bound


class StoreError(RuntimeError):
    """The store cannot be opened or used: one line."""


class StoreLockedError(StoreError):
    """Another process holds the DuckDB write lock."""


# ----------------------------------------------------------------------------- quarantine


def _raw_json(raw: Any) -> str:
    if isinstance(raw, Problem):
        raw = raw.to_row()
    text = json.dumps(raw, ensure_ascii=True, default=repr)
    return text if len(text) <= MAX_RAW_CHARS else text[:MAX_RAW_CHARS] + "...[truncated]"


# ----------------------------------------------------------------------------- store


class Store:
    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool):
        self.con, self.path, self.read_only = con, path, read_only

    @classmethod
    def open(cls, path: str | Path, read_only: bool = False, timeout: float = 0.0) -> Store:
        """Open (creating if needed) the store; wait up to `timeout` s for a lock."""
        path = Path(path).expanduser()
        if read_only and not path.exists():
            raise StoreError(f"no store at {path} (ingest something first)")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                con = duckdb.connect(str(path), read_only=read_only)
                break
            except duckdb.Error as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                if "lock" not in msg.lower():
                    raise StoreError(f"cannot open store {path}: {msg}") from None
                if time.monotonic() >= deadline:
                    holder = re.search(r"\(PID \d+\)", msg)
                    raise StoreLockedError(
                        f"store {path} is locked by another process"
                        f"{' ' + holder.group() if holder else ''}: DuckDB allows one writer at"
                        " a time; wait for it to finish, or work in another workspace"
                        " (--workdir DIR or GRPO_WORKDIR; `grpo data` commands also take"
                        " --db FILE)") from None
                time.sleep(0.2)
        if not read_only:
            con.execute(STORE_SQL)
        return cls(con, path, read_only)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------

    def ingest(self, adapter: Adapter, *, max_problem_chars: int = MAX_PROBLEM_CHARS,
               ngram: int = decontam.DEFAULT_N,
               min_coverage: float = decontam.DEFAULT_MIN_COVERAGE,
               progress: bool = False, batch_rows: int = INGEST_BATCH) -> IngestReport:
        """Validate every row of `adapter` and add it in one transaction, streamed: rows
        are checked and written `batch_rows` at a time (memory does not hold the source),
        with a progress bar when `progress`."""
        from grpo_core.progress import Bar

        t0 = time.perf_counter()
        report = IngestReport(adapter.source, adapter.split, adapter.origin)
        src, split = adapter.source, adapter.split
        ingest_id, started = uuid.uuid4().hex[:12], now()
        bar = Bar(None, f"ingest {src}/{split}", enabled=progress)

        def write(accepted: list, rejected: list) -> None:
            self._insert(adapter, ingest_id, started, accepted, rejected)
            report.ingested += len(accepted)
            bar.advance(len(accepted) + len(rejected))

        try:
            with transaction(self.con), patient_gold_parsing():
                check_rows(adapter, report, max_problem_chars, self._known(src, split), write,
                           batch_rows)
                if report.total_rows:
                    self._decontaminate_new(report, ingest_id, ngram, min_coverage)
                    self.con.execute(
                        "INSERT INTO ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [ingest_id, src, split, adapter.origin, adapter.fingerprint,
                         report.total_rows, report.ingested, report.quarantined_total,
                         report.duplicates, report.contaminated, report.repaired, started, now()])
        finally:
            bar.close()
        report.seconds = time.perf_counter() - t0
        assert report.total_rows == report.ingested + report.quarantined_total + \
            report.duplicates, "ingest lost rows"
        return report

    def _known(self, source: str, split: str):
        """validation.Known for one source split: which of a batch's fingerprints and text
        keys the store holds (earlier batches of this ingest included), by two joins in
        DuckDB rather than a set of the whole source in Python."""
        def known(fingerprints: list[str], keys: list[str]) -> tuple[set[str], set[str]]:
            batch = pa.table({"fingerprint": pa.array(fingerprints, pa.string()),
                              "text_key": pa.array(keys, pa.string())})
            self.con.register("_batch_keys", batch)
            try:
                found = self.con.execute(
                    "WITH p AS (SELECT fingerprint, text_key FROM problems WHERE source = ? AND "
                    "split = ?) SELECT DISTINCT 'f', fingerprint FROM p SEMI JOIN _batch_keys "
                    "USING (fingerprint) UNION ALL SELECT DISTINCT 'k', text_key FROM p SEMI "
                    "JOIN _batch_keys USING (text_key)", [source, split]).fetchall()
            finally:
                self.con.unregister("_batch_keys")
            return {v for t, v in found if t == "f"}, {v for t, v in found if t == "k"}
        return known

    def _insert(self, adapter: Adapter, ingest_id: str, started, accepted, rejected) -> None:
        """One batch of an ingest's rows and quarantined rows (inside its transaction)."""
        src, split = adapter.source, adapter.split
        columns = list(zip(*((src, split, p.fingerprint, p.id, p.problem, p.answer, p.solution,
                              p.level, p.subject, i, key) for i, p, key in accepted))) or \
            [()] * len(PROBLEM_SCHEMA)  # column by column: from_pylist's dicts cost 2x
        problems = pa.Table.from_arrays([pa.array(c, f.type) for c, f in
                                         zip(columns, PROBLEM_SCHEMA)], schema=PROBLEM_SCHEMA)
        bad = pa.Table.from_pylist(
            [dict(zip(QUARANTINE_SCHEMA.names, (src, split, i, w.code, str(w), _raw_json(raw))))
             for i, w, raw in rejected], schema=QUARANTINE_SCHEMA)
        con = self.con
        con.register("_new_problems", problems)
        con.register("_new_quarantine", bad)
        try:
            # rows are distinct from the store's already (check_rows asked `_known`)
            con.execute(
                "INSERT INTO problems (source, split, fingerprint, id, problem, answer, solution,"
                " level, subject, row_index, text_key, ingest_id, ingested_at) SELECT n.*, ?, ?"
                " FROM _new_problems n", [ingest_id, started])
            con.execute(
                "INSERT INTO quarantine SELECT q.*, ?, ?, ? FROM _new_quarantine q WHERE NOT "
                "EXISTS (SELECT 1 FROM quarantine o WHERE o.source = q.source AND o.split = "
                "q.split AND o.row_index = q.row_index AND o.source_fingerprint = ?)",
                [adapter.fingerprint, ingest_id, started, adapter.fingerprint])
        finally:
            con.unregister("_new_problems")
            con.unregister("_new_quarantine")

    def _decontaminate_new(self, report: IngestReport, ingest_id: str, n: int,
                           min_coverage: float) -> None:
        """Flag what this ingest can newly contaminate (flags are only ever added)."""
        evals_sql = decontam.eval_predicate()
        if decontam.is_eval(report.source, report.split):
            flags = contaminated_rows(self.con, f"NOT ({evals_sql}) AND NOT contaminated",
                                      "source = ? AND split = ?",
                                      [report.source, report.split], n, min_coverage)
            report.flagged_existing += flags.num_rows
        else:
            flags = contaminated_rows(self.con, "ingest_id = ?", evals_sql, [ingest_id], n,
                                      min_coverage)
            report.contaminated += flags.num_rows
            for label, count in Counter(flags["label"].to_pylist()).items():
                report.contaminated_with[label] = report.contaminated_with.get(label, 0) + count
        self._flag(flags)

    def _flag(self, flags: pa.Table) -> None:
        """Mark the (source, split, fingerprint, label) rows of `flags` contaminated."""
        if not flags.num_rows:
            return
        self.con.register("_flags", flags)
        try:
            self.con.execute(
                "UPDATE problems SET contaminated = TRUE, contaminated_with = f.label FROM _flags f "
                "WHERE problems.source = f.source AND problems.split = f.split AND "
                "problems.fingerprint = f.fingerprint")
        finally:
            self.con.unregister("_flags")

    def decontaminate(self, ngram: int = decontam.DEFAULT_N,
                      min_coverage: float = decontam.DEFAULT_MIN_COVERAGE) -> dict[str, int]:
        """Recompute every flag from scratch (e.g. with another n); counts per eval set."""
        evals_sql = decontam.eval_predicate()
        with transaction(self.con):
            self.con.execute("UPDATE problems SET contaminated = FALSE, contaminated_with = NULL")
            flags = contaminated_rows(self.con, f"NOT ({evals_sql})", evals_sql, [], ngram,
                                      min_coverage)
            self._flag(flags)
        return dict(Counter(flags["label"].to_pylist()))

    # -- reading ------------------------------------------------------------------

    def _has_tables(self) -> bool:
        names = {r[0] for r in self.con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        return set(STORE_TABLES) <= names

    def problems(self, source: str | None = None, split: str | None = None,
                 exclude_contaminated: bool = True, limit: int | None = None) -> list[Problem]:
        """Problems in ingest order; contaminated ones left out unless asked for."""
        if not self._has_tables():
            return []
        rows = self.con.execute(
            "SELECT id, source, split, problem, answer, solution, level, subject, fingerprint "
            "FROM problems WHERE (?::VARCHAR IS NULL OR source = ?) AND (?::VARCHAR IS NULL OR "
            "split = ?) AND NOT (? AND contaminated) ORDER BY source, split, row_index "
            "LIMIT ?", [source, source, split, split, exclude_contaminated,
                        limit if limit is not None else 2**62]).fetchall()
        names = ("id", "source", "split", "problem", "answer", "solution", "level", "subject",
                 "fingerprint")
        return [Problem(**dict(zip(names, r))) for r in rows]

    def quarantined(self, source: str | None = None, split: str | None = None) -> list[dict]:
        if not self._has_tables():
            return []
        cur = self.con.execute(
            "SELECT source, split, row_index, code, reason, raw FROM quarantine WHERE "
            "(?::VARCHAR IS NULL OR source = ?) AND (?::VARCHAR IS NULL OR split = ?) "
            "ORDER BY source, split, row_index", [source, source, split, split])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    def stats(self) -> list[dict]:
        """One row per (source, split): problems, contaminated, quarantined, role."""
        if not self._has_tables():
            return []
        rows = self.con.execute(
            "WITH p AS (SELECT source, split, count(*) AS problems, count(*) FILTER "
            "(WHERE contaminated) AS contaminated FROM problems GROUP BY ALL), "
            "q AS (SELECT source, split, count(*) AS quarantined FROM quarantine GROUP BY ALL) "
            "SELECT source, split, coalesce(problems, 0), coalesce(contaminated, 0), "
            "coalesce(quarantined, 0) FROM p FULL OUTER JOIN q USING (source, split) "
            "ORDER BY source, split").fetchall()
        return [{"source": s, "split": sp, "role": "eval" if decontam.is_eval(s, sp) else "train",
                 "problems": n, "contaminated": c, "quarantined": q} for s, sp, n, c, q in rows]

    def contamination(self) -> dict[tuple[str, str], dict[str, int]]:
        """{(train source, split): {eval set: flagged rows}}."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        if not self._has_tables():
            return out
        for s, sp, label, n in self.con.execute(
                "SELECT source, split, contaminated_with, count(*) FROM problems WHERE "
                "contaminated GROUP BY ALL ORDER BY ALL").fetchall():
            out.setdefault((s, sp), {})[label] = n
        return out
