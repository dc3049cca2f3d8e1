"""Reward functions: TRL's calling convention, each rule, the registry and config binding."""

from __future__ import annotations

import pytest

from grpo_core.config import RewardsConfig, config_from_dict
from grpo_core.verify import answers
from grpo_core.verify.format_rules import is_well_formatted
from grpo_core.verify.rewards import (
    REWARDS,
    accuracy,
    build_reward_funcs,
    completion_text,
    format_reward,
    length,
    length_penalty,
    reasoning_keywords,
    registry_reward,
    repetition,
    scorer_error_counts,
    tag_count,
)

GOOD = "<think>2 + 2 is 4, so</think>\n<answer>4</answer>"


def conv(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_registry_names_are_metric_keys() -> None:
    """TRL logs rewards/<__name__>/mean: each function the trainer gets is named after its
    registry name, whatever the Python function is called (format's is format_reward)."""
    assert {"accuracy", "format", "tag_count", "length", "reasoning_keywords", "repetition"} <= set(
        REWARDS
    )
    assert REWARDS["format"] is format_reward
    funcs, _ = build_reward_funcs(RewardsConfig(funcs=sorted(REWARDS)))
    assert [f.__name__ for f in funcs] == sorted(REWARDS)
    assert registry_reward("format").__name__ == "format"
    assert registry_reward("accuracy") is accuracy  # nothing to fix, nothing to rename


def test_completion_text_shapes() -> None:
    assert completion_text("x") == "x"
    assert completion_text(conv("y")) == "y"
    assert (
        completion_text([{"role": "assistant", "content": [{"type": "text", "text": "z"}]}]) == "z"
    )
    assert completion_text(None) == ""
    assert completion_text([]) == ""


# --- accuracy ----------------------------------------------------------------------------


def test_accuracy_strings_and_conversations() -> None:
    completions = [GOOD, conv(GOOD), "<answer>5</answer>", "no answer", "\\boxed{4}"]
    assert accuracy(completions, answer=["4"] * 5) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_accuracy_none_when_gold_unparseable() -> None:
    assert accuracy([GOOD, GOOD, GOOD], answer=["", None, "9^{9^{9^{9}}}"]) == [None, None, None]


def test_accuracy_gold_forms() -> None:
    # AMC float, GSM8K solution text, LaTeX gold, one gold per completion.
    completions = ["<answer>27</answer>", "<answer>1,234</answer>", "<answer>0.5</answer>"]
    assert accuracy(completions, answer=[27.0, "so\n#### 1234", "\\frac{1}{2}"]) == [1.0, 1.0, 1.0]


def test_accuracy_missing_answer_column() -> None:
    assert accuracy([GOOD]) == [None]


@pytest.fixture
def no_errors():
    answers.SCORER_ERRORS.reset()
    answers.clear_caches()
    yield answers.SCORER_ERRORS
    answers.SCORER_ERRORS.reset()
    answers.clear_caches()


def test_accuracy_scorer_error_is_none_and_counted(no_errors, monkeypatch) -> None:
    """A planted scorer exception: None (TRL leaves it out of the mean), not 0.0; counted
    under reward/accuracy; not cached, so the same pair scores 1.0 once the bug is gone."""

    def broken(*args):
        raise RuntimeError("planted scorer bug")

    completions = ["<answer>3\\sqrt{13}</answer>", "<answer>5</answer>"]
    golds = ["\\sqrt{117}", "5"]  # the second never reaches the broken step
    monkeypatch.setattr(answers, "_mv_check", broken)
    assert accuracy(completions, answer=golds) == [None, 1.0]
    assert scorer_error_counts() == {"reward/accuracy": 1}
    assert len(no_errors.hashes("reward/accuracy")[0]) == 12
    monkeypatch.undo()
    assert accuracy(completions, answer=golds) == [1.0, 1.0]
    assert scorer_error_counts() == {"reward/accuracy": 1}


def test_reward_bug_is_counted_under_its_name(no_errors, monkeypatch) -> None:
    import grpo_core.verify.rewards as R

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(R, "is_well_formatted", broken)
    monkeypatch.setattr(R, "extract_answer", broken)
    assert format_reward([GOOD, GOOD]) == [-0.5, -0.5]  # its neutral value, but counted
    assert accuracy([GOOD], answer=["4"]) == [None]
    assert scorer_error_counts() == {"reward/format": 2, "reward/accuracy": 1}


# --- format / tags -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "after_think", "ok"),
    [
        (GOOD, False, True),
        ("  <think>\nx\n</think>\n\n<answer>\n4\n</answer>\n", False, True),
        ("x</think><answer>4</answer>", True, True),
        ("x</think><answer>4</answer>", False, False),
        ("<think>x</think><answer>4</answer>", True, True),
        ("<think>x</think><answer></answer>", False, False),
        ("<think>x</think> stray <answer>4</answer>", False, False),
        ("<think>x</think><answer>4</answer> trailing", False, False),
        ("<think>x</think><answer>4</answer><answer>5</answer>", False, False),
        ("<think><think>x</think><answer>4</answer>", False, False),
        ("<answer>4</answer><think>x</think>", False, False),
        ("<think>x<answer>4</answer></think>", False, False),
        ("4", False, False),
    ],
)
def test_is_well_formatted(text: str, after_think: bool, ok: bool) -> None:
    assert is_well_formatted(text, after_think) is ok


def test_format_reward_values_and_prompt_inference() -> None:
    assert format_reward([GOOD, "nope"]) == [0.5, -0.5]
    assert format_reward([GOOD], value=1.0) == [1.0]
    body = "x</think><answer>4</answer>"
    assert format_reward([body, body], prompts=["Q: ... Assistant: <think>", "Q: plain"]) == [0.5, -0.5]
    assert format_reward([conv(body)], prompts=[[{"role": "user", "content": "Q <think>"}]]) == [0.5]
    assert format_reward([body], prompt_ends_with_think=True) == [0.5]


def test_tag_count_partial_credit() -> None:
    assert tag_count([GOOD, "", "<think>x</think>"]) == [1.0, 0.0, 0.5]
    # No think tag and a prompt that opened none: the chat shape (marked, real, last; no
    # reasoning before it), grpo_core/verify/format_rules.py
    assert tag_count(["<answer>4</answer>"]) == [0.75]
    # A tag used twice earns nothing (no farming by repetition).
    assert tag_count(["<think><think>x</think><answer>4</answer>"]) == [0.75]
    assert tag_count(["x</think><answer>4</answer>"], prompt_ends_with_think=True) == [1.0]
    assert tag_count(["x</think><answer>4</answer>"]) == [0.75]


# --- length ------------------------------------------------------------------------------


def test_length_penalty_shape() -> None:
    assert length_penalty(500, 200, 800, -0.5) == 0.0
    assert length_penalty(0, 200, 800, -0.5) == -0.5
    assert length_penalty(100, 200, 800, -0.5) == -0.25
    assert length_penalty(1200, 200, 800, -0.5) == -0.25
    assert length_penalty(5000, 200, 800, -0.5) == -0.5
    assert length_penalty(0, 0, 800, -0.5) == 0.0


def test_length_counts_words_or_completion_ids() -> None:
    words = " ".join(["w"] * 300)
    assert length([words], min_tokens=200, max_tokens=800) == [0.0]
    assert length([words], min_tokens=200, max_tokens=800, completion_ids=[[1] * 100]) == [-0.25]


# --- keywords / repetition ---------------------------------------------------------------


def test_reasoning_keywords() -> None:
    assert reasoning_keywords(["Therefore x. So y. also"]) == [pytest.approx(0.2)]
    assert reasoning_keywords(["also"]) == [0.0]  # word boundaries for ASCII words
    assert reasoning_keywords(["所以答案是4"]) == [pytest.approx(0.1)]
    assert reasoning_keywords(["so so so so so so so"]) == [pytest.approx(0.1)]  # distinct markers
    text = "therefore thus hence because so 因此 所以"
    assert reasoning_keywords([text]) == [0.5]  # capped at max_reward
    assert reasoning_keywords([text], keywords=["wait"], per_hit=0.3, max_reward=1.0) == [0.0]


def test_repetition() -> None:
    assert repetition(["a b c d e f g"]) == [0.0]
    assert repetition(["x"]) == [0.0]
    assert repetition(["a b " * 200], ngram=2) == [pytest.approx(-0.5, abs=0.01)]
    half = repetition(["a b c d e f g h " + "z z z z z z z z"], ngram=2)[0]
    assert -0.5 < half < 0.0


# --- robustness --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_rewards_return_one_value_per_completion(name: str) -> None:
    fn = REWARDS[name]
    completions = [GOOD, conv(GOOD), None, 5, [], [{"role": "assistant", "content": None}]]
    out = fn(completions, answer=["4"] * 6, prompts=["p"] * 6, completion_ids=[[1, 2]] * 6)
    assert len(out) == len(completions)
    assert all(v is None or isinstance(v, float) for v in out)


def test_rewards_tolerate_short_kwarg_lists() -> None:
    assert accuracy([GOOD, GOOD], answer=["4"]) == [1.0, None]
    assert format_reward([GOOD, GOOD], prompts=["p"]) == [0.5, 0.5]


# --- config binding ------------------------------------------------------------------------


def test_build_reward_funcs_binds_config() -> None:
    cfg = RewardsConfig(
        funcs=["accuracy", "format", "length", "reasoning_keywords", "repetition", "tag_count"],
        weights=[1.0, 0.5, 0.2, 0.1, 0.3, 0.25],
        format_reward=1.0,
        length={"min_tokens": 1, "max_tokens": 3, "penalty": -1.0},
        reasoning_keywords={"keywords": ["wait"], "per_hit": 0.4, "max_reward": 0.4},
        repetition={"ngram": 1, "max_penalty": -1.0},
    )
    funcs, weights = build_reward_funcs(cfg)
    assert [f.__name__ for f in funcs] == cfg.funcs
    assert weights == [1.0, 0.5, 0.2, 0.1, 0.3, 0.25]
    by_name = {f.__name__: f for f in funcs}
    assert by_name["format"](["nope"]) == [-1.0]
    assert by_name["length"](["a b c d e f"]) == [-1.0]
    assert by_name["reasoning_keywords"](["wait, so"]) == [0.4]
    assert by_name["repetition"](["a a a a"]) == [-1.0]
    assert by_name["accuracy"]([GOOD], answer=["4"]) == [1.0]


def test_accuracy_flexible_scores_the_answer_written_without_tags() -> None:
    prose = ["3 plus 4 is 7.", "The answer is 7", "I get 8.", "<answer>7</answer>", "no number"]
    assert accuracy(prose, answer=["7"] * 5) == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert accuracy(prose, answer=["7"] * 5, extraction="flexible") == [1.0, 1.0, 0.0, 1.0, 0.0]
    funcs, _ = build_reward_funcs(RewardsConfig(funcs=["accuracy"], extraction="flexible"))
    assert funcs[0].__name__ == "accuracy"  # TRL's metric key: rewards/accuracy/mean
    assert funcs[0](prose, answer=["7"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert build_reward_funcs(RewardsConfig(funcs=["accuracy"]))[0] == [accuracy]  # strict: as is


def test_build_reward_funcs_default_config() -> None:
    funcs, weights = build_reward_funcs(config_from_dict({}).rewards)
    assert [f.__name__ for f in funcs] == ["accuracy", "format"]
    assert weights == [1.0, 1.0]


# --- soft overlong (DAPO) ------------------------------------------------------------------


def test_overlong_penalty_ramps_over_the_buffer() -> None:
    from grpo_core.verify.rewards import overlong_penalty

    # limit 20, ramp over the last 4 tokens: 0 up to 16, -0.25 per token to -1 at 20, flat beyond
    assert [overlong_penalty(n, 20, 4, -1.0) for n in (0, 16, 17, 18, 20, 25)] == [
        0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


def test_soft_overlong_counts_trl_completion_ids_and_binds_grpo_length() -> None:
    cfg = RewardsConfig(funcs=["accuracy", "soft_overlong"])
    funcs, _ = build_reward_funcs(cfg, max_completion_length=10)
    soft = {f.__name__: f for f in funcs}["soft_overlong"]
    # defaults: the ramp ends at grpo.max_completion_length (10) and is a fifth of it (2)
    ids = [list(range(n)) for n in (3, 8, 9, 10)]
    assert soft(["x"] * 4, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0]
    # without ids (not under TRL): whitespace words
    assert soft(["a " * 9]) == [-0.5]
    own = RewardsConfig(funcs=["soft_overlong"], soft_overlong={"max_tokens": 100, "buffer_tokens": 50,
                                                                 "penalty": -0.4})
    (soft,) = build_reward_funcs(own, max_completion_length=10)[0]
    assert soft(["x"], completion_ids=[list(range(75))]) == [pytest.approx(-0.2)]
    assert own.soft_overlong.resolved(10) == (100, 50)
    with pytest.raises(ValueError, match="penalty"):
        RewardsConfig(funcs=["soft_overlong"], soft_overlong={"penalty": 0.5})
