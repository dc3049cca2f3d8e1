"""Which problems a benchmark name means: always its evaluation split, never training rows.

    benchmark_problems("gsm8k", cfg, store)   # GSM8K test (1,319), even with gsm8k in data.train

| benchmark | evaluation split |
|---|---|
| gsm8k | test |
| math500, aime24, aime25, amc23 | their only split (stored as `test`) |
| math | test (the hub's MATH test; the local copy under shared/data is a training pool) |
| synthetic | the synthetic task's eval split (disjoint from train by construction) |
| any other name | a source ingested with split `test` or `eval` (`grpo data ingest F --split test`) |

There is no fallback to another split: a benchmark whose evaluation split cannot be found
is an error naming it (`check_benchmarks`, before any work). Symmetrically a training
source that *is* an evaluation split is refused unless `data.allow_eval_split_training`.
Light module: no heavy imports (the config validator uses it).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from grpo_core.data.adapters import PRESETS
from grpo_core.data.source import SourceError

SYNTHETIC_NAMES = ("synthetic", "synthetic:arith")
SYNTHETIC_EVAL_N = 200  # the synthetic benchmark's size when no limit is given
SYNTHETIC_EVAL_SEED = 0  # fixed: the benchmark must not move with project.seed
EVAL_SPLIT_NAMES = ("test", "eval")  # the splits a user's own benchmark may live in
# The evaluation split of each preset (adapters.PRESETS names the same datasets).
PRESET_EVAL_SPLIT = {"gsm8k": "test", "math": "test", "math500": "test", "aime24": "test",
                     "aime25": "test", "amc23": "test"}
# A preset's split when none is named (mirrors source.Preset.default_split).
PRESET_DEFAULT_SPLIT = {"gsm8k": "train", "math": "train", "math500": "test",
                        "aime24": "test", "aime25": "test", "amc23": "test"}


class BenchmarkError(SourceError):
    """A benchmark whose evaluation split cannot be found (CLI exit 2): names it."""


def eval_split(benchmark: str) -> str | None:
    """The split a benchmark evaluates; None for a user's source (test or eval, stored)."""
    if benchmark in SYNTHETIC_NAMES:
        return "eval"
    return PRESET_EVAL_SPLIT.get(benchmark)


def is_eval_split(source: str, split: str | None) -> bool:
    """Is (source, split) a preset benchmark's evaluation split? (split None: the default)."""
    if source in PRESET_EVAL_SPLIT:
        return (split or PRESET_DEFAULT_SPLIT[source]) == PRESET_EVAL_SPLIT[source]
    if source == "synthetic:arith":
        return split in EVAL_SPLIT_NAMES
    return False


def fingerprint(problems: Iterable[Any]) -> str:
    """Identifies the exact problem list (content fingerprints, in order)."""
    return hashlib.sha256("\n".join(p.fingerprint for p in problems).encode()).hexdigest()[:16]


def stored_eval_rows(benchmark: str, store, limit: int | None) -> list:
    """The stored rows of a benchmark's evaluation split (any test/eval split for a user's)."""
    for split in ((eval_split(benchmark),) if eval_split(benchmark) else EVAL_SPLIT_NAMES):
        rows = store.problems(benchmark, split, exclude_contaminated=False, limit=limit)
        if rows:
            return rows
    return []


def benchmark_problems(benchmark: str, cfg, store=None, limit: int | None = None) -> list:
    """The fixed problem list of a benchmark's evaluation split (the first `limit`).

    From the store when ingested there (the pipeline ingests every eval set, for
    decontamination), else read from the preset's files / hub. BenchmarkError when the
    evaluation split does not exist."""
    if benchmark in SYNTHETIC_NAMES:
        from grpo_core.data.synthetic import generate_problems

        return generate_problems("eval", n=limit or SYNTHETIC_EVAL_N, seed=SYNTHETIC_EVAL_SEED,
                                 levels=cfg.eval.synthetic_levels)
    if store is not None:
        rows = stored_eval_rows(benchmark, store, limit)
        if rows:
            return rows
    if benchmark in PRESET_EVAL_SPLIT:
        from grpo_core.data.records import stage_problems

        try:
            return stage_problems(benchmark, PRESET_EVAL_SPLIT[benchmark],
                                  data_dir=cfg.data.data_dir, limit=limit)
        except SourceError as exc:
            raise BenchmarkError(f"benchmark {benchmark!r}: its evaluation split "
                                 f"({PRESET_EVAL_SPLIT[benchmark]}) cannot be read: {exc}") from None
    raise BenchmarkError(
        f"benchmark {benchmark!r}: no evaluation split found; a benchmark is a preset "
        f"({', '.join(PRESET_EVAL_SPLIT)}), synthetic, or a source ingested with split "
        f"{' or '.join(EVAL_SPLIT_NAMES)} (grpo data ingest FILE --split test)")


def check_benchmarks(cfg, store=None) -> None:
    """Raise BenchmarkError naming the first benchmark of cfg.eval.benchmarks whose
    evaluation split cannot be found (cheap: files are checked, not read)."""
    from grpo_core.workspace import resolve_data_dir

    root = resolve_data_dir(cfg.data.data_dir)
    for bench in cfg.eval.benchmarks:
        split = eval_split(bench)
        if bench in SYNTHETIC_NAMES:
            continue
        if bench in PRESET_EVAL_SPLIT:
            if root is None:
                continue  # the hub: found (or not) when read; no network probe here
            rel = PRESETS[bench].files.get(split)
            if rel is None or not (root / rel).is_file():
                where = root / rel if rel else f"{root} (no {split} file for {bench})"
                raise BenchmarkError(f"benchmark {bench!r}: its evaluation split ({split}) "
                                     f"is not in the data dir: {where}")
            continue
        if store is None or not stored_eval_rows(bench, store, 1):
            benchmark_problems(bench, cfg, store, 1)  # raises with the explanation
