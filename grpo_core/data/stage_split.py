"""Which rows of the pool each training stage reads, so that no stage trains on a problem
an earlier stage trained on (DESIGN: "each training stage learns from problems no earlier
stage trained on"). The pool is split once, by a stable hash of each problem
(grpo_core.data.pool.part_unit), into an SFT part and an RL part (data.sft_share):

    SFT                 the SFT part (rows with a reference solution)
    round N's filter    the N-th window of the RL part, in the pool's seeded order: fresh
                        candidates every round (filter.max_problems a window)
    memorisation probe  the RL part's last probe.problems rows: no round ever reads them

data.stage_overlap (an ablation) gives every stage the whole pool. Pure arithmetic: the
sizes come from the store (tasks/stage_data.py)."""
from __future__ import annotations

from grpo_core.config import PipelineConfig, generation_batch


class PoolExhausted(ValueError):
    """The RL part has no fresh window for a round: the numbers and the fix. Exit code 2
    (a config that asks for more data than it has), before any training."""

    exit_code = 2


def parts(cfg: PipelineConfig) -> tuple[str, str]:
    """(the SFT stage's part, the RL stages' part) of the pool."""
    return ("all", "all") if cfg.data.stage_overlap else ("sft", "rl")


def held_out(cfg: PipelineConfig, rl_size: int) -> int:
    """Rows at the RL part's end held back for the memorisation probe's unseen set."""
    return min(cfg.probe.problems, rl_size // 2)


def prompts_per_update(cfg: PipelineConfig) -> int:
    """Prompts one generation consumes: TRL's generation batch (config.generation_batch,
    one optimizer step's completions by default) / num_generations. TRL drops an
    incomplete last batch."""
    return generation_batch(cfg) // cfg.grpo.num_generations


def round_problem_budget(cfg: PipelineConfig) -> int:
    """The most distinct prompts a round can draw: one generation batch per optimizer step
    (an upper bound), times the regenerations dynamic sampling may ask for, plus the
    in-round eval's held-out problems. A round handed a whole pool reads this many of it."""
    draws = 1 + (cfg.dynamic_sampling.max_regenerations if cfg.dynamic_sampling.enabled else 0)
    held = cfg.in_round_eval.problems if cfg.in_round_eval.every else 0
    return cfg.grpo.max_steps * prompts_per_update(cfg) * draws + held


def window_size(cfg: PipelineConfig, available: int) -> int:
    """Rows of each round's window: filter.max_problems candidates (without a filter, what
    the round can draw: round_problem_budget), else an equal share of the RL part per
    round, one share left for a retrain's round (flows/retrain.py); at least one optimizer
    step's prompts (a band that keeps too few trains on the whole window)."""
    per_round = cfg.filter.max_problems if cfg.filter.enabled else round_problem_budget(cfg)
    return max(per_round or available // (cfg.rounds.count + 1), prompts_per_update(cfg), 1)


def round_window(cfg: PipelineConfig, rl_size: int, round_no: int) -> tuple[int, int, str | None]:
    """(start, stop, note) of round `round_no`'s candidates among the RL part's rows, the
    probe's held-back tail excluded. Raises PoolExhausted when the window runs past the RL
    part, unless filter.reuse_prompts (then it starts over, and the note says so)."""
    available = rl_size - held_out(cfg, rl_size)
    size = window_size(cfg, available)
    start, stop = (round_no - 1) * size, round_no * size
    if stop <= available:
        return start, stop, None
    if cfg.filter.reuse_prompts and available >= size:
        start = start % (available - size + 1) if available > size else 0
        return start, start + size, (f"round {round_no}: the RL part has no fresh window of "
                                     f"{size} left; re-using rows {start}-{start + size} "
                                     "(filter.reuse_prompts)")
    raise PoolExhausted(
        f"round {round_no} needs {size} fresh RL-part problems (filter.max_problems) after "
        f"{start} used by earlier rounds, but the RL part has {available} (of {rl_size}: "
        f"data.sft_share {cfg.data.sft_share:g}; {rl_size - available} held back for the "
        f"memorisation probe, probe.problems): add training data (data.train limit), lower "
        f"filter.max_problems or rounds.count, or set filter.reuse_prompts: true")


def check_rounds(cfg: PipelineConfig, rl_size: int) -> list[str]:
    """Every round's window, before any work: raises PoolExhausted for the first that does
    not fit; returns the notes of windows re-used under filter.reuse_prompts."""
    notes = [round_window(cfg, rl_size, r)[2] for r in range(1, cfg.rounds.count + 1)]
    return [n for n in notes if n]

