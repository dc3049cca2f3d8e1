"""The training pool of a config: its `data.train` sources ingested (idempotently) into
the store, read back without contaminated rows, shuffled and limited with the seed."""
from __future__ import annotations

import random

from grpo_core.adapters import resolve_source
from grpo_core.config import DataSource, PipelineConfig
from grpo_core.problems import Problem
from grpo_core.store import IngestReport, Store
from grpo_core.workspace import resolve_data_dir


def _adapter(cfg: PipelineConfig, src: DataSource):
    # A synthetic source's limit is how many to generate; a dataset's limit applies after
    # shuffling the whole ingested set, so every run of a config trains on the same rows.
    return resolve_source(src.source, split=src.split, data_dir=resolve_data_dir(cfg.data.data_dir),
                          columns=src.columns, levels=src.levels, seed=cfg.project.seed,
                          limit=src.limit if src.source.startswith("synthetic:") else None)


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
