"""What each pipeline stage reads of the training pool (issue 25: after ingest the store
is the pool). A stage is handed the stored pool (a PoolRef: its content fingerprint and
size, the data stage's result) or a list of ids (the filter's kept problems), and reads
only the rows its work needs, by query; nothing here is as large as the pool:

    filter (each round's re-filter too)  the first filter.max_problems rows
    GRPO round                           the rows its steps can draw (round_problem_budget)
    SFT                                  the first rows with a reference solution, as many as
                                         its steps can use (sft_problem_budget)

The rows read are also what the stage's cache key fingerprints (tasks/stage_keys.py), so
a cache hit costs the stage's selection, not the pool (tests/test_data_scale.py)."""
from __future__ import annotations

from grpo_core.data.pool import PoolRef
from grpo_core.data.problems import Problem


def pool_of(data: dict) -> PoolRef:
    """The training pool the data stage stored (its result's `pool` and `pool_size`)."""
    return PoolRef(data["pool"], data["pool_size"])


def pool_problems(ctx, selection: PoolRef | list[str], limit: int | None = None,
                  keep=None) -> list[Problem]:
    """The problems of `selection` (a stored pool's first `limit` that `keep` accepts, or
    these ids), read from the store of `ctx` (tasks.stages.Ctx) by query
    (grpo_core.data.pool.pool_problems)."""
    from grpo_core.data.pool import pool_problems as read

    with ctx.store() as store:
        return read(store, selection, limit, keep)


def stage_reads(cfg, stage: str) -> tuple[int | None, object]:
    """(limit, keep) of grpo_core.data.pool.pool_problems for `stage` ("filter", "grpo",
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
        return pool_problems(ctx, selection)
    return pool_problems(ctx, selection, *stage_reads(ctx.cfg, stage))


def filter_candidates(ctx, selection: PoolRef | list[str]) -> list[Problem]:
    """What the filter considers (each round's re-filter too): of a whole pool, its first
    filter.max_problems rows, a seeded sample stratified by source and level."""
    return stage_problems(ctx, "filter", selection)
