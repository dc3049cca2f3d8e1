"""Prompt templates. The template text is part of the evaluation protocol hash, so two
numbers are only compared when they were produced under the same words."""
from __future__ import annotations

import hashlib

# DeepSeek-R1-Zero's template (R1 paper, Table 1). The prompt ends inside "<think>" so a
# base model starts reasoning at once; the completion closes the tag itself.
R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think> <answer> answer here </answer>. User: {problem} Assistant: <think>"
)

# System prompt for instruct models, rendered through the tokenizer's chat template.
CHAT_SYSTEM_PROMPT = (
    "You are a helpful assistant. First think about the reasoning process, then give the "
    "answer. Enclose the reasoning in <think> </think> and the final answer in "
    "<answer> </answer> tags, e.g. <think> reasoning here </think> <answer> 42 </answer>."
)


def resolve_template(template: str, tokenizer) -> str:
    """`auto` picks the chat template when the tokenizer has one, else R1-Zero."""
    if template != "auto":
        return template
    return "chat" if getattr(tokenizer, "chat_template", None) else "r1_zero"


def render_prompt(problem: str, template: str, tokenizer=None) -> str:
    """The text the policy sees for one problem under a resolved template."""
    if template == "r1_zero":
        return R1_ZERO_TEMPLATE.format(problem=problem.strip())
    if template == "chat":
        messages = [
            {"role": "system", "content": CHAT_SYSTEM_PROMPT},
            {"role": "user", "content": problem.strip()},
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    raise ValueError(f"unknown template {template!r}")


def template_text(template: str) -> str:
    return R1_ZERO_TEMPLATE if template == "r1_zero" else CHAT_SYSTEM_PROMPT


def template_hash(template: str) -> str:
    return hashlib.sha256(template_text(template).encode()).hexdigest()[:12]


# Both templates ask for the answer in <answer> </answer>: generation stops at the closing
# tag (filter, eval and GRPO rollouts alike), so nothing a model invents after its answer
# (a next "User:" turn, another answer) is kept or scored.
ANSWER_CLOSE = "</answer>"


def stop_strings(template: str) -> tuple[str, ...]:
    """Texts generation stops at (kept in the output) under a template, `auto` included."""
    return (ANSWER_CLOSE,) if template in ("auto", "r1_zero", "chat") else ()
