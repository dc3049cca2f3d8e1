"""Whether an evaluation's token budget decides a delta: a model cut off at
eval.max_new_tokens in many of its completions scores low because it was not let finish,
and a later model that answers sooner "gains" what a larger budget would have given the
earlier one too (SmolLM2's base: 43% cut off at 48 tokens, its trained model 0%).

`budget_findings` says so as the finding `eval_budget_truncates` whenever the earlier
model of a delta was cut off in more than eval.max_truncated of its completions (all of
them: greedy and samples) and more than the later one, naming the budget to re-evaluate
at. Pure: the caller passes the two evaluations' results."""
from __future__ import annotations

from grpo_core.eval.score import BenchmarkScore, Scores
from grpo_core.findings import Finding


def truncated_share(score: BenchmarkScore | None) -> float | None:
    """The share of an evaluation's completions cut off at the budget (greedy and samples)
    on one benchmark (its metric truncation_rate's "all")."""
    return score.metric("truncation_rate").get("all") if score else None


def budget_findings(earlier: tuple[str, Scores], later: tuple[str, Scores],
                    max_new_tokens: int, max_truncated: float) -> list[Finding]:
    """One `eval_budget_truncates` (warn) per benchmark of `later` whose `earlier` model
    (label, scores) was cut off in more than `max_truncated` of its completions
    and more often than the later one."""
    (was_label, was), (now_label, now) = earlier, later
    out = []
    for bench, result in now.items():
        before, after = truncated_share(was.get(bench)), truncated_share(result)
        if before is None or before <= max_truncated or (after is not None and after >= before):
            continue
        suggest = max_new_tokens * 2
        out.append(Finding("eval_budget_truncates", "warn", [], {
            "benchmark": bench, "earlier": was_label, "later": now_label,
            "earlier_truncated": round(before, 4),
            "later_truncated": None if after is None else round(after, 4),
            "max_new_tokens": max_new_tokens, "suggested_max_new_tokens": suggest},
            summary=(f"{bench}: {was_label} was cut off at eval.max_new_tokens={max_new_tokens} "
                     f"in {before:.0%} of its completions, {now_label} in "
                     f"{'?' if after is None else format(after, '.0%')}: part of the delta "
                     f"{now_label} - {was_label} may be the budget; re-evaluate both at "
                     f"eval.max_new_tokens={suggest}")))
    return out
