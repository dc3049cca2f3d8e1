"""Compatibility re-export: the reward functions live in grpo_core.verify.rewards.

Kept so that scripts written against `grpo_core.rewards` (REWARDS, build_reward_funcs, ...)
keep working; project code imports grpo_core.verify.rewards.
The reward registered as "format" is the function format_reward (its +-value argument is
`value`); `bind` became registry_reward(name, **params)."""
from grpo_core.verify.rewards import (
    MAX_KEYWORD_SCAN,
    MAX_REPETITION_TOKENS,
    REWARDS,
    RewardFunc,
    accuracy,
    build_reward_funcs,
    completion_text,
    format_reward,
    is_well_formatted,
    keyword_score,
    length,
    length_penalty,
    reasoning_keywords,
    registry_reward,
    repetition,
    repetition_score,
    scorer_error_counts,
    tag_count,
    tag_score,
)

__all__ = [
    "MAX_KEYWORD_SCAN", "MAX_REPETITION_TOKENS", "REWARDS", "RewardFunc", "accuracy",
    "build_reward_funcs", "completion_text", "format_reward", "is_well_formatted",
    "keyword_score", "length", "length_penalty", "reasoning_keywords", "registry_reward",
    "repetition", "repetition_score",
    "scorer_error_counts", "tag_count", "tag_score",
]  # fmt: skip
