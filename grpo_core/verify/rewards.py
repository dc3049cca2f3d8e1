"""Rule-based rewards for GRPO, in TRL's reward-function shape.

    fn(completions, **kwargs) -> list[float | None]

A completion is a string or a conversational list `[{"role": "assistant", "content": ...}]`.
TRL passes the dataset's columns as kwargs lists aligned with `completions` (`answer`),
plus `prompts` and `completion_ids`. TRL logs a reward function as
`rewards/<its __name__>/mean`: `build_reward_funcs` names each one after its registry name
(REWARDS), so the metric keys are the names configs use (`format`, whose function is
`format_reward`: `format` is a builtin). No reward raises: a completion that breaks a rule
scores 0.0.
accuracy is None ("not scored": TRL leaves it out of the mean) when the gold is unreadable
or when the scorer itself failed. A reward's own exception is never silent: it is logged
and counted (grpo_core.verify.answers.SCORER_ERRORS, label `reward/<name>`; read them with
`scorer_error_counts()`), and the reward takes its neutral value (accuracy: None).
Nothing here executes or evaluates model output.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from grpo_core.verify import answers
from grpo_core.verify.answers import grade
from grpo_core.verify.extraction import extract_answer, normalise_gold
from grpo_core.verify.format_rules import THINK_OPEN, is_well_formatted, tag_score
from grpo_core.verify.gold import parse_gold
from grpo_core.verify.scorer_errors import (
    SCORER_ERRORS,
    ScorerError,
    count_scorer_errors,
    record_scorer_error,
)

RewardFunc = Callable[..., list]

# Bounded work on megabyte completions: only this much of the text is examined.
MAX_REPETITION_TOKENS = 50_000
MAX_KEYWORD_SCAN = 200_000


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last message of a
    conversational completion (content may be a string or a list of text parts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and isinstance(p.get("text", ""), str)
            )
    return ""


def _column(kwargs: dict, name: str, n: int) -> list:
    """A dataset column from TRL's kwargs, as a list of length n (None where missing)."""
    values = kwargs.get(name)
    if values is None or isinstance(values, (str, bytes)):
        return [values] * n
    values = list(values)
    return (values + [None] * n)[:n]


def _prompt_ends_with_think(prompt: Any) -> bool:
    return completion_text(prompt).rstrip().endswith(THINK_OPEN)


def _think_flags(n: int, kwargs: dict, prompt_ends_with_think: bool | None) -> list[bool]:
    """Per completion: did the prompt already open the <think> block (R1-Zero template)?"""
    if prompt_ends_with_think is not None:
        return [bool(prompt_ends_with_think)] * n
    return [
        _prompt_ends_with_think(p) if p is not None else False
        for p in _column(kwargs, "prompts", n)
    ]


def scorer_error_counts() -> dict[str, int]:
    """Scorer errors so far by label (`reward/accuracy`, ...), as answers counts them."""
    return SCORER_ERRORS.counts()


def _each(
    values: Sequence, fn: Callable[..., float | None], default: float | None, name: str
) -> list:
    """fn(*args) per completion; an exception (a bug: a reward must never crash training)
    gives `default`, and is counted and logged under `reward/<name>`."""
    out = []
    with count_scorer_errors(f"reward/{name}"):
        for args in values:
            try:
                out.append(fn(*args))
            except ScorerError:  # already counted where it was raised
                out.append(default)
            except Exception as exc:  # noqa: BLE001
                record_scorer_error(args[1:] if len(args) > 1 else "", args[0], exc)
                out.append(default)
    return out


# --- accuracy ----------------------------------------------------------------------------


def _accuracy_one(completion: Any, gold: Any, extraction: str = "strict") -> float | None:
    start = time.monotonic()
    gold_text = normalise_gold(gold)  # AMC floats, GSM8K "#### n" solutions, plain strings
    # lazy: math-verify reads the gold only for a prediction that needs it (see grade)
    parsed = parse_gold(gold_text, lazy=True) if gold_text is not None else None
    if parsed is None:
        return None
    # One time budget per completion, shared with the gold's parse when it was not cached.
    seconds = max(0.05, answers.BUDGET_S - (time.monotonic() - start))
    # grade raises ScorerError on a scorer failure: _each makes it None, never 0.0; it
    # says None when the gold itself proved unreadable.
    verdict = grade(parsed, extract_answer(completion_text(completion), extraction), seconds)
    return None if verdict is None else float(verdict)


def accuracy(completions: list, answer: list | None = None, extraction: str = "strict",
             **kwargs: Any) -> list[float | None]:
    """1.0 when the final answer is equivalent to the gold `answer`, else 0.0; None when
    the gold cannot be parsed or the scorer failed (counted under `reward/accuracy`).
    Golds are parsed once and shared across the group.

    `extraction` reads the final answer (grpo_core.verify.extraction): `strict`, the
    template's `<answer>` / `\\boxed{}` (R1's accuracy reward: an untagged answer scores 0);
    `flexible`, the standard evaluators' chain down to the last number (zero-RL: the answer
    a base model writes in prose counts, no format gate; rewards.extraction)."""
    golds = _column({"answer": answer}, "answer", len(completions))
    one = functools.partial(_accuracy_one, extraction=extraction)
    return _each(list(zip(completions, golds)), one, None, "accuracy")


# --- format and tags ---------------------------------------------------------------------


def format_reward(
    completions: list,
    value: float = 0.5,
    prompt_ends_with_think: bool | None = None,
    **kwargs: Any,
) -> list[float]:
    """+value (rewards.format_reward) for a well-formatted completion, -value otherwise: the R1
    format `<think>...</think><answer>...</answer>` when the prompt opened <think> or the
    completion writes a think tag; for a chat completion in plain text, reasoning then
    the final answer in an <answer> block or a \\boxed{} that ends it. Template text (the
    placeholders `<answer> here </answer>`, an empty <think>) is never well formatted
    (grpo_core.verify.format_rules).

    `prompt_ends_with_think`: None infers it per completion from the `prompts` kwarg
    (the R1-Zero prompt ends with "<think>", so the completion starts inside the block)."""
    flags = _think_flags(len(completions), kwargs, prompt_ends_with_think)
    return _each(
        list(zip(completions, flags)),
        lambda c, f: value if is_well_formatted(completion_text(c), f) else -value,
        -value,
        "format",
    )


def tag_count(
    completions: list, prompt_ends_with_think: bool | None = None, **kwargs: Any
) -> list[float]:
    """Partial format credit, 0.25 per check of the completion's shape (each tag of the R1
    format; for a plain-text chat completion: reasoning, a marked final answer, a real
    answer in it, nothing after it), so a model that never wrote the format still gets a
    gradient towards it. Tags around template text earn nothing
    (grpo_core.verify.format_rules)."""
    flags = _think_flags(len(completions), kwargs, prompt_ends_with_think)
    return _each(
        list(zip(completions, flags)),
        lambda c, f: tag_score(completion_text(c), f),
        0.0,
        "tag_count",
    )


# --- length ------------------------------------------------------------------------------


def length_penalty(n_tokens: int, min_tokens: int, max_tokens: int, penalty: float) -> float:
    """0 inside [min_tokens, max_tokens]; linear to `penalty` at 0 tokens and at twice
    max_tokens (and beyond)."""
    if n_tokens < min_tokens:
        return penalty * (min_tokens - n_tokens) / min_tokens
    if n_tokens > max_tokens:
        return penalty * min(1.0, (n_tokens - max_tokens) / max_tokens)
    return 0.0


def length(
    completions: list,
    min_tokens: int = 200,
    max_tokens: int = 800,
    penalty: float = -0.5,
    completion_ids: list | None = None,
    **kwargs: Any,
) -> list[float]:
    """Penalise completions shorter than min_tokens or longer than max_tokens. Tokens are
    TRL's `completion_ids` when given, else whitespace-separated words."""
    # The penalty is flat from 2 * max_tokens on: count no further.
    cap = int(max(min_tokens, 2 * max_tokens)) if max_tokens > 0 else -1
    return _by_length(completions, completion_ids, cap, "length",
                      lambda n: length_penalty(n, min_tokens, max_tokens, penalty))


def _by_length(completions: list, completion_ids: list | None, cap: int, name: str,
               score: Callable[[int], float]) -> list[float]:
    """score(token count) per completion: TRL's `completion_ids` when given, else
    whitespace-separated words, split at most `cap` times (a full split of a megabyte of
    "ab ab ..." is a 20 MB list of words)."""
    ids = _column({"ids": completion_ids}, "ids", len(completions))

    def one(c: Any, tok: Any) -> float:
        return score(len(tok) if tok is not None else len(completion_text(c).split(None, cap)))

    return _each(list(zip(completions, ids)), one, 0.0, name)


def overlong_penalty(n_tokens: int, max_tokens: int, buffer_tokens: int, penalty: float) -> float:
    """DAPO's soft overlong punishment: 0 up to max_tokens - buffer_tokens, linear to
    `penalty` at max_tokens, `penalty` beyond."""
    start = max_tokens - buffer_tokens
    if n_tokens <= start:
        return 0.0
    return penalty * min(1.0, (n_tokens - start) / buffer_tokens)


def soft_overlong(
    completions: list,
    max_tokens: int = 64,
    buffer_tokens: int = 12,
    penalty: float = -1.0,
    completion_ids: list | None = None,
    **kwargs: Any,
) -> list[float]:
    """Penalise completions in the last buffer_tokens before the length limit (DAPO), so a
    trace about to be cut learns to finish. Tokens are TRL's `completion_ids` (they end in
    eos when the completion ended on its own) when given, else whitespace-separated words."""
    return _by_length(completions, completion_ids, max_tokens + 1, "soft_overlong",
                      lambda n: overlong_penalty(n, max_tokens, buffer_tokens, penalty))


# --- reasoning keywords ------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _keyword_patterns(keywords: tuple[str, ...]) -> tuple[tuple[str, re.Pattern], ...]:
    out = []
    for kw in dict.fromkeys(k.strip().lower() for k in keywords if k and k.strip()):
        escaped = re.escape(kw)
        # ASCII words need word boundaries ("so" is not in "also"); CJK markers do not.
        pattern = rf"(?<![a-z0-9_]){escaped}(?![a-z0-9_])" if kw.isascii() else escaped
        out.append((kw, re.compile(pattern)))
    return tuple(out)


def keyword_score(text: str, keywords: Sequence[str], per_hit: float, max_reward: float) -> float:
    """per_hit for each distinct keyword present, capped at max_reward."""
    lowered = text[:MAX_KEYWORD_SCAN].lower()
    hits = sum(
        1
        for kw, pattern in _keyword_patterns(tuple(keywords))
        if kw in lowered and pattern.search(lowered)  # `in` is a fast C prefilter
    )
    return min(max_reward, per_hit * hits)


def reasoning_keywords(
    completions: list,
    keywords: Sequence[str] = ("therefore", "so", "thus", "hence", "because", "因此", "所以"),
    per_hit: float = 0.1,
    max_reward: float = 0.5,
    **kwargs: Any,
) -> list[float]:
    """Reward reasoning markers ("therefore", "所以", ...): per_hit per distinct marker."""
    return _each(
        [(c,) for c in completions],
        lambda c: keyword_score(completion_text(c), keywords, per_hit, max_reward),
        0.0,
        "reasoning_keywords",
    )


# --- repetition --------------------------------------------------------------------------


def repetition_score(text: str, ngram: int, max_penalty: float) -> float:
    """max_penalty * (1 - distinct n-grams / n-grams) over whitespace tokens: 0 when no
    n-gram repeats, max_penalty as the text becomes one n-gram over and over."""
    # maxsplit: the words past the cap are never made (the rest stays one string)
    tokens = text.split(None, MAX_REPETITION_TOKENS)[:MAX_REPETITION_TOKENS]
    total = len(tokens) - ngram + 1
    if total <= 1:
        return 0.0
    distinct = len(set(zip(*(tokens[i:] for i in range(ngram)))))
    if distinct == total:
        return 0.0
    return max_penalty * (total - distinct) / (total - 1)


def repetition(
    completions: list, ngram: int = 3, max_penalty: float = -0.5, **kwargs: Any
) -> list[float]:
    """Penalise repeated n-grams, from 0 (none repeat) down to max_penalty."""
    return _each(
        [(c,) for c in completions],
        lambda c: repetition_score(completion_text(c), ngram, max_penalty),
        0.0,
        "repetition",
    )


# Registry name (config's rewards.funcs, TRL's metric key rewards/<name>/mean) -> function.
REWARDS: dict[str, RewardFunc] = {
    "accuracy": accuracy,
    "format": format_reward,
    "tag_count": tag_count,
    "length": length,
    "soft_overlong": soft_overlong,
    "reasoning_keywords": reasoning_keywords,
    "repetition": repetition,
}


def _params(name: str, cfg: Any, max_completion_length: int) -> dict:
    """The config fields that parametrise registry reward `name`."""
    if name == "accuracy":
        return {} if cfg.extraction == "strict" else {"extraction": cfg.extraction}
    if name == "format":
        return {"value": cfg.format_reward}
    if name == "length":
        return {
            "min_tokens": cfg.length.min_tokens,
            "max_tokens": cfg.length.max_tokens,
            "penalty": cfg.length.penalty,
        }
    if name == "soft_overlong":
        top, buffer = cfg.soft_overlong.resolved(max_completion_length)
        return {"max_tokens": top, "buffer_tokens": buffer, "penalty": cfg.soft_overlong.penalty}
    if name == "reasoning_keywords":
        k = cfg.reasoning_keywords
        return {"keywords": tuple(k.keywords), "per_hit": k.per_hit, "max_reward": k.max_reward}
    if name == "repetition":
        return {"ngram": cfg.repetition.ngram, "max_penalty": cfg.repetition.max_penalty}
    return {}


def registry_reward(name: str, **params: Any) -> RewardFunc:
    """REWARDS[name] with `params` fixed, its __name__ the registry name: TRL logs it as
    rewards/<name>/mean, whatever the function is called in Python."""
    fn = REWARDS[name]
    if not params and fn.__name__ == name:
        return fn

    @functools.wraps(fn)
    def bound(completions: list, **kwargs: Any) -> list:
        return fn(completions, **{**kwargs, **params})

    bound.__name__ = bound.__qualname__ = name
    return bound


def build_reward_funcs(rewards_cfg: Any, max_completion_length: int = 64) -> tuple[list[RewardFunc], list[float]]:
    """Reward functions and weights from a `grpo_core.config.RewardsConfig`;
    max_completion_length (grpo's) is where soft_overlong's ramp ends by default."""
    funcs = []
    for name in rewards_cfg.funcs:
        if name not in REWARDS:
            raise KeyError(f"unknown reward {name!r}; known: {sorted(REWARDS)}")
        funcs.append(registry_reward(name, **_params(name, rewards_cfg, max_completion_length)))
    return funcs, rewards_cfg.resolved_weights()
