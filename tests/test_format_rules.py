"""Format rewards that the template cannot game, and a graded format reward for chat
completions (grpo_core/verify/format_rules.py; issue 24 item 4)."""

from __future__ import annotations

import pytest

from grpo_core.prompts import R1_ZERO_TEMPLATE
from grpo_core.verify.format_rules import (
    PLACEHOLDER_WORDS,
    is_template_text,
    is_well_formatted,
    tag_score,
    template_placeholders,
)
from grpo_core.verify.rewards import accuracy, format_reward, tag_count

R1_PROMPT = R1_ZERO_TEMPLATE.format(problem="What is 2 + 3?")
CHAT_PROMPT = "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"


def test_placeholders_are_read_from_the_templates() -> None:
    # the shipped templates' example blocks: "reasoning process here", "answer here", "42"
    assert {"here", "answer", "reasoning", "process", "42"} == PLACEHOLDER_WORDS
    # a new template's placeholder counts without a code change
    assert template_placeholders(("e.g. <answer> your number </answer>",)) == {"your", "number"}
    assert is_template_text(" Here. ") and is_template_text("answer here") and is_template_text("")
    assert not is_template_text("5") and not is_template_text("here is 5")


# The R1-Zero template's placeholders as a trained SmolLM2 wrote them (issue 24: "here" in
# 31% of completions), after the prompt's opening <think>; with the tag credit left: the
# block the prompt opened (the same for every completion), and an empty reasoning's close.
R1_GAMING = [
    ("</think> <answer> here </answer>", 0.5),
    ("reasoning process here </think> <answer> answer here </answer>", 0.25),
    ("</think> <answer> </answer>", 0.5),
    ("</think><answer>Here.</answer>", 0.5),
    ("Reasoning here. </think><answer>answer</answer>", 0.25),
]


@pytest.mark.parametrize(("completion", "tags"), R1_GAMING)
def test_template_text_is_not_paid_under_r1_zero(completion: str, tags: float) -> None:
    prompts = [R1_PROMPT]
    assert format_reward([completion], prompts=prompts) == [-0.5]
    assert not is_well_formatted(completion, True)
    assert tag_count([completion], prompts=prompts) == [tags]
    assert accuracy([completion], answer=["5"]) == [0.0]


def test_reasoning_placeholder_is_not_paid_but_empty_reasoning_is_r1s_format() -> None:
    """The R1 format allows an empty think block (its regex `<think>.*?</think>`); the
    template's placeholder words as the reasoning are not paid."""
    empty, copied = " </think> <answer> 5 </answer>", "reasoning process here </think> <answer> 5 </answer>"
    assert tag_count([empty, copied], prompts=[R1_PROMPT] * 2) == [1.0, 0.75]
    assert format_reward([empty, copied], prompts=[R1_PROMPT] * 2) == [0.5, -0.5]
    assert accuracy([empty, copied], answer=["5", "5"]) == [1.0, 1.0]


def test_placeholder_answer_earns_no_tag_credit() -> None:
    """Before the fix "<answer> here </answer>" earned the full 1.0 tag reward and +0.5
    format; the same text with a real answer still does."""
    real = "2 plus 3 is 5 </think> <answer> 5 </answer>"
    gamed = "2 plus 3 is 5 </think> <answer> here </answer>"
    assert tag_count([real, gamed], prompt_ends_with_think=True) == [1.0, 0.5]
    assert format_reward([real, gamed], prompt_ends_with_think=True) == [0.5, -0.5]
    assert accuracy([real, gamed], answer=["5", "5"]) == [1.0, 0.0]
    # the chat system prompt's own example answer is template text for the format rewards
    assert tag_score("<think>6 times 7</think><answer> 42 </answer>") == 0.5


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("2 plus 3 is 5, so the answer is \\boxed{5}.", 1.0),
        ("2 + 3 = 5\n<answer>5</answer>", 1.0),
        ("2 plus 3 is $\\boxed{5}$", 1.0),
        ("\\boxed{5}", 0.75),  # no reasoning before it
        ("2 plus 3 is \\boxed{5}, I think. Let me check again: 2 + 3", 0.75),  # not last
        ("2 plus 3 is \\boxed{here}", 0.75),  # template text in the box
        ("2 plus 3 is \\boxed{}", 0.75),  # empty box
        ("here \\boxed{answer}", 0.5),  # template text only
        ("2 plus 3 is 5", 0.0),  # no marked final answer
        ("", 0.0),
    ],
)
def test_chat_completions_get_a_graded_format_reward(text: str, score: float) -> None:
    """A chat prompt does not open <think> and a plain-text completion writes no think tag:
    the chat shape (reasoning, then the final answer marked by <answer> or \\boxed{}, and
    nothing after it) is scored in quarters, where the tag checks gave every such
    completion the same 0."""
    assert tag_count([text], prompts=[CHAT_PROMPT]) == [score]
    assert format_reward([text], prompts=[CHAT_PROMPT]) == [0.5 if score == 1.0 else -0.5]


def test_chat_rewards_vary_within_a_group() -> None:
    """The point of a graded reward: a chat group of typical instruct completions has
    reward variance, so GRPO has an advantage to follow."""
    group = ["2 + 3 = 5", "2 + 3 = 5, so \\boxed{5}", "The sum is 5. \\boxed{5} Done, I hope.",
             "<answer>5</answer>"]
    scores = tag_count(group, prompts=[CHAT_PROMPT] * 4)
    assert len(set(scores)) >= 3, scores


def test_chat_completion_with_think_tags_uses_the_tagged_shape() -> None:
    good = "<think>2 plus 3 is 5</think><answer>5</answer>"
    assert tag_count([good], prompts=[CHAT_PROMPT]) == [1.0]
    assert format_reward([good], prompts=[CHAT_PROMPT]) == [0.5]
    assert tag_count(["<think>here</think><answer>here</answer>"], prompts=[CHAT_PROMPT]) == [0.0]


def test_boxed_end_is_found_with_a_later_brace() -> None:
    # the last box is \boxed{4}; a later "4}" elsewhere must not be read as its end
    text = "so \\boxed{4} and then \\frac{1}{4} more"
    assert tag_score(text) == 0.75


def test_strict_extraction_reads_the_first_block_as_the_docs_say() -> None:
    """docs/evaluation.md and code agree: strict extraction reads the first complete
    <answer> block (generation stops there), so a model echoing the template's example
    block is scored on the echo, not rescued by a later block."""
    from pathlib import Path

    from grpo_core.verify.extraction import extract_answer

    echo = "i.e. <think> reasoning process here </think> <answer> answer here </answer> 2+3=5 <answer>5</answer>"
    assert extract_answer(echo) == "answer here"
    assert accuracy([echo], answer=["5"]) == [0.0]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text(encoding="utf-8")
    bullet = doc[doc.index("**Two extractions, both reported.**"):][:300]
    assert "*first*" in bullet and "last\n  `<answer>" not in bullet and "(the last" not in bullet


def test_no_registry_reward_pays_the_templates_own_example() -> None:
    """The templates' example completions, copied: no shaping reward of the registry pays
    them more than it pays nothing at all (accuracy: wrong; format and tags: template
    text; keywords: the examples hold none)."""
    from grpo_core.prompts import CHAT_SYSTEM_PROMPT
    from grpo_core.verify.rewards import REWARDS

    r1_copy = R1_ZERO_TEMPLATE[R1_ZERO_TEMPLATE.index("i.e., ") + 6:R1_ZERO_TEMPLATE.index(". User:")]
    chat_copy = CHAT_SYSTEM_PROMPT[CHAT_SYSTEM_PROMPT.index("e.g. ") + 5:].rstrip(".")
    for copy, prompt in ((r1_copy, "plain"), (chat_copy, CHAT_PROMPT)):
        for name in ("accuracy", "format", "tag_count", "reasoning_keywords", "repetition"):
            paid, nothing = REWARDS[name]([copy, ""], answer=["7", "7"], prompts=[prompt] * 2)
            assert paid <= nothing, (name, copy, paid, nothing)
