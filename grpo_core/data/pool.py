"""The training pool of a config: its `data.train` sources ingested (idempotently) into
the store, read back without contaminated rows, shuffled and limited with the seed.

Every evaluation set of `eval.benchmarks` is ingested first (role eval), so each run's
training rows are checked against all the sets it will report, before any training."""
from __future__ import annotations

import random

from grpo_core.config import DataSource, PipelineConfig
from grpo_core.data.adapters import resolve_source
from grpo_core.data.benchmarks import (
    PRESET_EVAL_SPLIT,
    SYNTHETIC_NAMES,
    eval_split,
    stored_eval_rows,
)
from grpo_core.data.problems import Problem
from grpo_core.data.store import IngestReport, Store
from grpo_core.workspace import resolve_data_dir


def _adapter(cfg: PipelineConfig, src: DataSource):
    # A synthetic source's limit is how many to generate; a dataset's limit applies after
    # shuffling the whole ingested set, so every run of a config trains on the same rows.
    return resolve_source(src.source, split=src.split, data_dir=resolve_data_dir(cfg.data.data_dir),
                          columns=src.columns, levels=src.levels, seed=cfg.project.seed,
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


def ingest_sources(cfg: PipelineConfig, store: Store) -> list[IngestReport]:
    reports = []
    for src in cfg.data.train:
        adapter = _adapter(cfg, src)
        reports.append(store.ingest(adapter, max_problem_chars=cfg.data.max_problem_chars,
                                    ngram=cfg.data.decontam_ngram))
    return reports


def training_pool(cfg: PipelineConfig, store: Store) -> list[Problem]:
    """Problems to train on, in a seed-fixed order (one list per config, every run)."""
    pool: list[Problem] = []
    for src in cfg.data.train:
        adapter = _adapter(cfg, src)
        rows = store.problems(source=adapter.source, split=adapter.split,
                              exclude_contaminated=cfg.data.decontaminate)
        random.Random(f"{cfg.project.seed}/{adapter.source}").shuffle(rows)
        pool += rows[: src.limit] if src.limit else rows
    return pool
