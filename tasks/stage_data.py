"""What each pipeline stage reads of the training pool (issue 25: after ingest the store
is the pool). A stage is handed the stored pool (a PoolRef: its content fingerprint and
size, the data stage's result) or a list of ids (the filter's kept problems), and reads
only the rows its work needs, by query; nothing here is as large as the pool:

    filter (each round's re-filter too)  the first filter.max_problems rows
    GRPO round                           the rows its steps can draw (round_problem_budget)
    SFT                                  the first rows with a reference solution, as many as
                                         its steps can use (sft_problem_budget)

A stage's cache key holds the pool's content fingerprint (computed once, at ingest) with
these bounds, not the rows: a cache hit reads nothing of the pool (stage_input), and a
stage that computes reads only its rows (tests/test_data_scale.py)."""
from __future__ import annotations

import functools
from collections.abc import Callable

from grpo_core.data.pool import PoolRef
from grpo_core.data.problems import Problem
from tasks.stage_keys import problems_fingerprint


def pool_of(data) -> PoolRef:
    """The training pool the data stage stored (tasks.stage_results.DataResult)."""
    return data.pool_ref()


def open_and_query(ctx, selection: PoolRef | list[str], limit: int | None = None,
                   keep=None) -> list[Problem]:
    """The problems of `selection` (a stored pool's first `limit` that `keep` accepts, or
    these ids): opens the store of `ctx` (tasks.stages.Ctx) for the read and queries it
    (grpo_core.data.pool.query_problems)."""
    from grpo_core.data.pool import query_problems

    with ctx.store() as store:
        return query_problems(store, selection, limit, keep)


def stage_reads(cfg, stage: str) -> tuple[int | None, object]:
    """(limit, keep) of grpo_core.data.pool.query_problems for `stage` ("filter", "grpo",
    "sft") handed a whole pool: the bounds of the table above, one place for the pipeline
    and for `grpo sft` / `grpo train`."""
    if stage == "filter":
        return cfg.filter.max_problems, None
    if stage == "grpo":
        from grpo_core.train.grpo import round_problem_budget

        return round_problem_budget(cfg), None
    if stage == "sft":
        from grpo_core.train.sft import has_trace, sft_problem_budget

        return sft_problem_budget(cfg), has_trace
    raise ValueError(f"no pool reads for stage {stage!r}")


def stage_problems(ctx, stage: str, selection: PoolRef | list[str]) -> list[Problem]:
    """What `stage` works on: of a whole pool, the rows stage_reads bounds; a list of ids
    (the filter's choice) whole (run_filter subsamples it, run_sft keeps those with a
    solution)."""
    if not isinstance(selection, PoolRef):
        return open_and_query(ctx, selection)
    return open_and_query(ctx, selection, *stage_reads(ctx.cfg, stage))


def filter_candidates(ctx, selection: PoolRef | list[str]) -> list[Problem]:
    """What the filter considers (each round's re-filter too): of a whole pool, its first
    filter.max_problems rows, a seeded sample stratified by source and level."""
    return stage_problems(ctx, "filter", selection)


def stage_input(ctx, stage: str, selection: PoolRef | list[str]
                ) -> tuple[str, Callable[[], list[Problem]]]:
    """(fingerprint for the cache key, problems()) of what `stage` works on. A stored
    pool's fingerprint covers its content in order, so with the stage's bounds it names
    the rows exactly: the key reads nothing, and problems() reads the rows once, when the
    stage computes. A list of ids: the content of those problems (an id names a row of a
    source, not its content)."""
    if isinstance(selection, PoolRef):
        limit, keep = stage_reads(ctx.cfg, stage)
        read = functools.cache(lambda: stage_problems(ctx, stage, selection))
        return f"pool {selection.pool}: first {limit} {getattr(keep, '__name__', 'rows')}", read
    problems = open_and_query(ctx, selection)
    return problems_fingerprint(problems), lambda: problems
