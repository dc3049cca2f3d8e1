"""What each pipeline stage reads of the training pool (issue 25: after ingest the store
is the pool; issue 44: the stages read disjoint parts of it, grpo_core/data/stage_split.py).
A stage is handed a slice of the stored pool (a PoolSlice: the pool's content fingerprint,
its part and positions) or a list of ids (the filter's kept problems), and reads only the
rows its work needs, by query; nothing here is as large as the pool:

    SFT                                  the SFT part's first rows with a reference
                                         solution, as many as its steps can use
    filter, round N                      the RL part's N-th window (fresh every round)
    GRPO round                           the kept ids (else the window, as many rows as
                                         its steps can draw: round_problem_budget)
    memorisation probe                   the RL part's held-back tail (no round reads it)

A stage's cache key holds the slice (pool fingerprint, part, share, positions) with these
bounds, not the rows: a cache hit reads nothing of the pool (stage_input), and a stage that
computes reads only its rows (tests/test_data_scale.py)."""
from __future__ import annotations

import functools
from collections.abc import Callable

from grpo_core.data.pool import PoolRef, PoolSlice
from grpo_core.data.problems import Problem
from grpo_core.data.stage_split import held_out, parts, round_problem_budget, round_window
from tasks.stage_keys import problems_fingerprint

Selection = PoolSlice | list[str]


def pool_of(data) -> PoolRef:
    """The training pool the data stage stored (tasks.stage_results.DataResult)."""
    return data.pool_ref()


def sft_part(cfg, pool: PoolRef) -> PoolSlice:
    """What the SFT stage may read: the SFT part of the pool (under data.stage_overlap the
    whole pool but the probe's held-back tail, which stays unseen)."""
    part = parts(cfg)[0]
    stop = pool.size - held_out(cfg, pool.size) if part == "all" else None
    return PoolSlice(pool.pool, part, cfg.data.sft_share, 0, stop)


def rl_size(ctx, pool: PoolRef) -> int:
    """Rows in the pool's RL part (one count query)."""
    from grpo_core.data.pool import part_size

    with ctx.store() as store:
        return part_size(store, pool.pool, parts(ctx.cfg)[1], ctx.cfg.data.sft_share)


def _rl_rows(cfg, pool: PoolRef, start: int, stop: int) -> PoolSlice:
    return PoolSlice(pool.pool, parts(cfg)[1], cfg.data.sft_share, start, stop)


def round_candidates(cfg, pool: PoolRef, size: int, round_no: int) -> tuple[PoolSlice, str | None]:
    """Round `round_no`'s fresh window of the RL part (`size` rows: rl_size), and the note
    of a re-used window (filter.reuse_prompts); raises PoolExhausted when none is left."""
    start, stop, note = round_window(cfg, size, round_no)
    return _rl_rows(cfg, pool, start, stop), note


def rl_trainable(cfg, pool: PoolRef, size: int) -> PoolSlice:
    """Every RL-part row a round may read: all but the probe's held-back tail (`grpo train`)."""
    return _rl_rows(cfg, pool, 0, size - held_out(cfg, size))


def unseen_part(cfg, pool: PoolRef, size: int) -> PoolSlice:
    """The RL part's held-back tail: problems no stage of this pool trains on (the
    memorisation probe's unseen set)."""
    return _rl_rows(cfg, pool, size - held_out(cfg, size), size)


def open_and_query(ctx, selection: Selection, limit: int | None = None,
                   keep=None) -> list[Problem]:
    """The problems of `selection` (a stored pool's first `limit` that `keep` accepts, or
    these ids): opens the store of `ctx` (tasks.stages.Ctx) for the read and queries it
    (grpo_core.data.pool.query_problems)."""
    from grpo_core.data.pool import query_problems

    with ctx.store() as store:
        return query_problems(store, selection, limit, keep)


def stage_reads(cfg, stage: str) -> tuple[int | None, object]:
    """(limit, keep) of grpo_core.data.pool.query_problems for `stage` ("filter", "grpo",
    "sft", "probe") handed a pool slice: the bounds of the table above, one place for the
    pipeline and for `grpo sft` / `grpo train`."""
    if stage in ("filter", "probe"):
        return None, None  # the window (the probe's tail) is the bound
    if stage == "grpo":
        return round_problem_budget(cfg), None
    if stage == "sft":
        from grpo_core.train.sft import has_trace, sft_problem_budget

        return sft_problem_budget(cfg), has_trace
    raise ValueError(f"no pool reads for stage {stage!r}")


def stage_problems(ctx, stage: str, selection: Selection) -> list[Problem]:
    """What `stage` works on: of a pool slice, the rows stage_reads bounds; a list of ids
    (the filter's choice) whole (run_sft keeps those with a solution)."""
    if isinstance(selection, list):
        return open_and_query(ctx, selection)
    return open_and_query(ctx, selection, *stage_reads(ctx.cfg, stage))


def filter_candidates(ctx, selection: Selection) -> list[Problem]:
    """What the filter considers: a round's window of the RL part (round_candidates)."""
    return stage_problems(ctx, "filter", selection)


def stage_input(ctx, stage: str, selection: Selection
                ) -> tuple[str, Callable[[], list[Problem]]]:
    """(fingerprint for the cache key, problems()) of what `stage` works on. A stored
    pool's fingerprint covers its content in order, so with the slice and the stage's
    bounds it names the rows exactly: the key reads nothing, and problems() reads the rows
    once, when the stage computes. A list of ids: the content of those problems (an id
    names a row of a source, not its content)."""
    if isinstance(selection, PoolSlice):
        limit, keep = stage_reads(ctx.cfg, stage)
        read = functools.cache(lambda: stage_problems(ctx, stage, selection))
        return f"{selection.describe()}: first {limit} {getattr(keep, '__name__', 'rows')}", read
    problems = open_and_query(ctx, selection)
    return problems_fingerprint(problems), lambda: problems
