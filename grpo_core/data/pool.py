"""The training pool of a config: its `data.train` sources ingested (idempotently) into
the store, then selected once, in SQL, without contaminated rows, shuffled and limited with
the seed, and stored as a table under its content fingerprint (build_pool). After ingest
the store is the pool: stages read the prefix or the ids they need (query_problems) and
never resolve a source again, so no stage but ingest costs more as the pool grows.

Every evaluation set of `eval.benchmarks` is ingested first (role eval), so each run's
training rows are checked against all the sets it will report, before any training."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from grpo_core.config import DataSource, PipelineConfig
from grpo_core.data.adapters import resolve_source
from grpo_core.data.benchmarks import (
    PRESET_EVAL_SPLIT,
    SYNTHETIC_NAMES,
    eval_split,
    stored_eval_rows,
)
from grpo_core.data.db import now, transaction
from grpo_core.data.problems import Problem
from grpo_core.data.store import Store
from grpo_core.data.validation import IngestReport
from grpo_core.workspace import resolve_data_dir


@dataclass(frozen=True)
class PoolRef:
    """A training pool stored by build_pool: its content fingerprint and row count. What
    the flows hand from stage to stage instead of the pool's ids."""

    pool: str
    size: int

    def __len__(self) -> int:
        return self.size


# A problem's part of every pool (SFT or RL), by a stable hash of its content fingerprint:
# the same problem is in the same part whatever the pool, seed or recipe, so no later run
# (a retrain, another seed) can hand GRPO a problem an SFT stage trained on. In [0, 1).
PART_UNIT_SQL = ("(CAST(('0x' || substr(md5('part/' || fingerprint), 1, 12)) AS BIGINT) "
                 "/ 281474976710656.0)")
PARTS = ("sft", "rl", "all")


def part_unit(fingerprint: str) -> float:
    """PART_UNIT_SQL in Python: a problem is in the SFT part when this is < data.sft_share."""
    import hashlib

    return int(hashlib.md5(f"part/{fingerprint}".encode()).hexdigest()[:12], 16) / 2 ** 48


@dataclass(frozen=True)
class PoolSlice:
    """Positions [start, stop) of one part of a stored pool, in the pool's seeded order:
    `part` "sft" (part_unit < share), "rl" (the rest) or "all" (data.stage_overlap).
    What the pipeline hands the SFT stage, each round's filter and the memorisation probe."""

    pool: str
    part: str
    share: float
    start: int = 0
    stop: int | None = None

    def describe(self) -> str:
        """The slice in words, for cache keys and logs: it names the rows exactly."""
        return (f"pool {self.pool} {self.part} part (sft_share {self.share:g}) "
                f"[{self.start}:{'' if self.stop is None else self.stop}]")

    def __len__(self) -> int:
        if self.stop is None:
            raise TypeError("an open-ended slice has no length until read")
        return self.stop - self.start


def _part_where(part: str, share: float) -> tuple[str, list]:
    if part == "all":
        return "TRUE", []
    if part not in PARTS:
        raise ValueError(f"no pool part {part!r}; one of {PARTS}")
    return f"{PART_UNIT_SQL} {'<' if part == 'sft' else '>='} ?", [share]


def part_size(store: Store, pool: str, part: str, share: float) -> int:
    """How many rows of stored pool `pool` are in `part`."""
    where, args = _part_where(part, share)
    return store.con.execute(f"SELECT count(*) FROM pool_rows WHERE pool = ? AND {where}",
                             [pool, *args]).fetchone()[0]


def _adapter(cfg: PipelineConfig, src: DataSource):
    # A synthetic source's limit is how many to generate; a dataset's limit applies after
    # shuffling the whole ingested set, so every run of a config trains on the same rows.
    return resolve_source(src.source, split=src.split, data_dir=resolve_data_dir(cfg.data.data_dir),
                          columns=src.columns, levels=src.levels, seed=cfg.project.seed,
                          config=src.config,
                          limit=src.limit if src.source.startswith("synthetic:") else None)


def ingest_eval_sets(cfg: PipelineConfig, store: Store) -> list[IngestReport]:
    """Store the evaluation split of every preset benchmark (synthetic is disjoint from its
    training split by construction; a user's benchmark is already a stored test/eval set)."""
    reports = []
    for bench in cfg.eval.benchmarks:
        split = eval_split(bench)
        if bench in PRESET_EVAL_SPLIT:
            adapter = resolve_source(bench, split=split,
                                     data_dir=resolve_data_dir(cfg.data.data_dir))
            reports.append(store.ingest(adapter, max_problem_chars=cfg.data.max_problem_chars,
                                        ngram=cfg.data.decontam_ngram))
    return reports


def contamination_by_benchmark(cfg: PipelineConfig, store: Store,
                               train_sets: set[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{eval set: {"problems": its stored rows, "flagged": training rows of this config
    that reproduce one of its problems, "excluded": those kept out of the pool}}, for
    every benchmark (flagged 0 when clean)."""
    out = {b: {"problems": len(stored_eval_rows(b, store, None)),
               "flagged": 0, "excluded": 0}
           for b in cfg.eval.benchmarks if b not in SYNTHETIC_NAMES}
    for train_set, labels in store.contamination().items():
        if train_set not in train_sets:
            continue
        for label, n in labels.items():
            counts = out.setdefault(label.split("/")[0], {"flagged": 0, "excluded": 0})
            counts["flagged"] += n
            counts["excluded"] += n if cfg.data.decontaminate else 0
    return out


def ingest_sources(cfg: PipelineConfig, store: Store, progress: bool = False
                   ) -> list[IngestReport]:
    reports = []
    for src in cfg.data.train:
        adapter = _adapter(cfg, src)
        reports.append(store.ingest(adapter, max_problem_chars=cfg.data.max_problem_chars,
                                    ngram=cfg.data.decontam_ngram, progress=progress))
    return reports


def training_sets(cfg: PipelineConfig, reports: list[IngestReport]
                  ) -> list[tuple[str, str, int | None]]:
    """(source, split, limit) of each `data.train` source, as its ingest named it (the
    reports of ingest_sources, in config order): what build_pool selects from."""
    return [(r.source, r.split, src.limit) for src, r in zip(cfg.data.train, reports)]


def build_pool(cfg: PipelineConfig, store: Store,
               sets: list[tuple[str, str, int | None]]) -> PoolRef:
    """The training pool of `sets`, built in SQL and stored once under its content
    fingerprint: per source, the stored rows (contaminated ones left out when
    data.decontaminate) in a seeded order, cut at the source's limit; then ordered so
    that every prefix is a sample stratified by (source, split, level) in proportion.
    Stages read prefixes of it (query_problems) and never re-read the sources."""
    con = store.con
    want = pa.table({"source": [s for s, _, _ in sets], "split": [sp for _, sp, _ in sets],
                     "lim": pa.array([lim for _, _, lim in sets], pa.int64())})
    seed = str(cfg.project.seed)
    with transaction(con, _want_sets=want):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _pool_new AS "
            "WITH drawn AS (SELECT p.source, p.split, p.fingerprint, p.id, p.level, w.lim, "
            "  md5(? || '/' || p.source || '/' || p.fingerprint) AS draw "
            "  FROM problems p JOIN _want_sets w USING (source, split) "
            "  WHERE NOT (? AND p.contaminated)), "
            "cut AS (SELECT * FROM drawn QUALIFY lim IS NULL OR "
            "  row_number() OVER (PARTITION BY source, split ORDER BY draw) <= lim), "
            # (rank - 1/2) / stratum size: each stratum's rows spread evenly over [0, 1]
            "spread AS (SELECT *, (row_number() OVER (PARTITION BY source, split, level "
            "  ORDER BY draw) - 0.5) / count(*) OVER (PARTITION BY source, split, level) AS q "
            "  FROM cut) "
            "SELECT row_number() OVER (ORDER BY q, draw) - 1 AS pos, source, split, "
            "  fingerprint, id FROM spread", [seed, cfg.data.decontaminate])
        size, digest = con.execute(
            "SELECT count(*), coalesce(md5(string_agg(md5(concat_ws(chr(31), p.id, p.source, "
            "p.split, p.problem, p.answer, coalesce(p.solution, ''), coalesce(p.level::VARCHAR, "
            "''), coalesce(p.subject, ''))), '' ORDER BY n.pos)), '') FROM _pool_new n "
            "JOIN problems p USING (source, split, fingerprint)").fetchone()
        ref = PoolRef(pool=digest[:16] or "empty", size=size)
        if not con.execute("SELECT count(*) FROM pools WHERE pool = ?", [ref.pool]).fetchone()[0]:
            con.execute("INSERT INTO pool_rows SELECT ?, * FROM _pool_new ORDER BY pos",
                        [ref.pool])
            con.execute("INSERT INTO pools VALUES (?, ?, ?)", [ref.pool, ref.size, now()])
        con.execute("DROP TABLE _pool_new")
    return ref


def stored_pool(store: Store, pool: str) -> PoolRef | None:
    """The stored pool `pool`, or None when this store does not hold it."""
    row = store.con.execute("SELECT pool, size FROM pools WHERE pool = ?", [pool]).fetchone()
    return PoolRef(*row) if row else None


_PROBLEM_FIELDS = ("id", "source", "split", "problem", "answer", "solution", "level",
                   "subject", "fingerprint")


def query_problems(store: Store, selection: PoolRef | PoolSlice | list[str],
                   limit: int | None = None,
                   keep: Callable[[Problem], bool] | None = None) -> list[Problem]:
    """The problems of `selection`, read from the store: a pool's (or a pool slice's) first
    `limit` rows in its stratified order (a seeded sample, all of them when limit is None),
    or the problems with the given ids, in that order (unknown ids dropped; an id
    re-ingested with edited content means its latest row). `keep` (pools only): the first
    `limit` rows it accepts, read `limit` positions at a time (the SFT stage: rows with a
    reference solution). Reads only the rows asked for: the cost is the selection's."""
    if isinstance(selection, PoolRef):
        selection = PoolSlice(selection.pool, "all", 0.0, 0, selection.size)
    if not isinstance(selection, PoolSlice):
        return _problems_by_id(store, selection, limit)
    end = selection.stop if selection.stop is not None else 1 << 62
    n = end - selection.start if limit is None else min(limit, end - selection.start)
    if keep is None:
        return _pool_rows(store, selection, selection.start, selection.start + n)
    out: list[Problem] = []
    start, block = selection.start, max(n, _MIN_BLOCK)  # one block when `keep` takes every row
    while len(out) < n and start < end:
        got = _pool_rows(store, selection, start, min(start + block, end))
        out += [p for p in got if keep(p)]
        start += block
        if not got:
            break
    return out[:n]


_MIN_BLOCK = 256  # positions read at a time when rows are filtered (keep), at least


def _pool_rows(store: Store, part: PoolSlice, start: int, stop: int) -> list[Problem]:
    """The rows at positions [start, stop) of a part of a stored pool, in order."""
    cols = ", ".join(f"p.{c}" for c in _PROBLEM_FIELDS)
    if part.part == "all":  # positions are the pool's own: a range, no scan
        keys = store.con.execute(
            "SELECT source, split, fingerprint FROM pool_rows WHERE pool = ? AND pos >= ? "
            "AND pos < ? ORDER BY pos", [part.pool, start, stop]).fetchall()
    else:
        where, args = _part_where(part.part, part.share)
        keys = store.con.execute(
            f"SELECT source, split, fingerprint FROM pool_rows WHERE pool = ? AND {where} "
            "ORDER BY pos LIMIT ? OFFSET ?", [part.pool, *args, max(stop - start, 0), start]
        ).fetchall()
    # The fingerprints as an IN filter: DuckDB scans one column of `problems` for them
    # (half the time of a join on three at a million rows), then reads the few rows.
    found = {tuple(r[1:3]) + (r[-1],): r for r in store.con.execute(
        f"SELECT {cols} FROM problems p WHERE fingerprint IN (SELECT unnest(?::VARCHAR[]))",
        [[k[2] for k in keys]]).fetchall()}
    return [Problem(**dict(zip(_PROBLEM_FIELDS, found[k]))) for k in keys if k in found]


def _problems_by_id(store: Store, ids: list[str], limit: int | None) -> list[Problem]:
    cols = ", ".join(f"p.{c}" for c in _PROBLEM_FIELDS)
    ids = list(ids)[:limit] if limit is not None else list(ids)
    want = pa.table({"ord": pa.array(range(len(ids)), pa.int64()),
                     "id": pa.array(ids, pa.string())})
    store.con.register("_want_ids", want)
    try:
        rows = store.con.execute(
            f"SELECT {cols} FROM _want_ids w JOIN problems p ON p.id = w.id QUALIFY "
            "row_number() OVER (PARTITION BY w.ord ORDER BY p.ingested_at DESC) = 1 "
            "ORDER BY w.ord").fetchall()
    finally:
        store.con.unregister("_want_ids")
    return [Problem(**dict(zip(_PROBLEM_FIELDS, r))) for r in rows]
