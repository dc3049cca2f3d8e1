"""What the format rewards (`format`, `tag_count`) pay for, and what they never pay for.

Two shapes of a well-formatted completion, chosen per completion:

- **Tagged** (the R1 format): `<think> reasoning </think> <answer> answer </answer>`. Used
  when the prompt opened `<think>` (the r1_zero template ends inside the block) or when
  the completion writes a think tag itself. Four checks, 0.25 each in `tag_score`: the
  block opened (by the prompt or at the completion's start), `</think>` once after real
  reasoning, `<answer>` once after it, `</answer>` once closing a real answer at the end.
- **Chat** (an instruct model under the chat template, which answers in plain text: the
  chat template never puts `<think>` in the prompt, and a small instruct model seldom
  writes the tags): reasoning in plain text, then the final answer *marked*, as an
  `<answer>` block or a `\\boxed{}` (the two marks strict extraction reads), and nothing
  after it. Four checks, 0.25 each: reasoning before the answer, the answer marked, the
  mark holds a real answer, the mark ends the completion. So a chat completion gets a
  graded reward towards the format that strict scoring reads, where the tagged checks
  gave every plain-text completion the same 0 (no advantage, nothing learned).

`is_well_formatted` is every check of the completion's shape passing.

Template text is never paid. The templates show the format with placeholders
(`<think> reasoning process here </think> <answer> answer here </answer>`, the chat
prompt's `<answer> 42 </answer>`), and a policy trained on tag rewards learns to copy them:
a SmolLM2 run wrote `<answer> here </answer>` in 31% of its completions (issue 24). A
block whose words all come from the templates' own tag contents (`PLACEHOLDER_WORDS`,
read from the template texts, so a new template's placeholders count at once) earns no
credit for its tags; nor does an empty answer. An empty think block is the R1 format's
own (its reference regex `<think>.*?</think>` allows it; the warm-started proxy model
writes it), so it is paid; the template's placeholder words in it are not. The accuracy
reward is untouched: it pays a correct answer, whatever its words (a gold of 42 answered
42 is correct; only its format credit is withheld).

Plain string scans and one linear regex: linear time on any input."""

from __future__ import annotations

import re

from grpo_core.prompts import CHAT_SYSTEM_PROMPT, R1_ZERO_TEMPLATE
from grpo_core.verify.extraction import BOX_COMMAND, MAX_BOXED_SCAN, extract_boxed

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
TEMPLATES = (R1_ZERO_TEMPLATE, CHAT_SYSTEM_PROMPT)
_TAG_BLOCK = re.compile(r"<(think|answer)>([^<]*)</\1>")
_WORD = re.compile(r"[a-z0-9]+")
# What may follow a boxed final answer and still end the completion: closing math
# delimiters, markdown emphasis, a full stop.
_AFTER_BOX = " \t\r\n.$*)]\\"


def template_placeholders(templates: tuple[str, ...] = TEMPLATES) -> frozenset[str]:
    """The words inside the templates' example tag blocks: {"reasoning", "process",
    "here", "answer", "42"} for the shipped ones."""
    return frozenset(w for t in templates for _, body in _TAG_BLOCK.findall(t)
                     for w in _WORD.findall(body.lower()))


PLACEHOLDER_WORDS = template_placeholders()


def is_template_text(text: str) -> bool:
    """True when `text` holds nothing but the templates' placeholder words (case and
    punctuation aside), or nothing at all: what copying the template produces."""
    return all(m.group() in PLACEHOLDER_WORDS for m in _WORD.finditer(text.lower()))


def is_placeholder_reasoning(text: str) -> bool:
    """Reasoning that is the templates' placeholder words ("reasoning process here"); an
    empty block is not (the R1 format allows it)."""
    return _WORD.search(text) is not None and is_template_text(text)


def uses_tags(text: str, prompt_ends_with_think: bool) -> bool:
    """The tagged shape applies: the prompt opened <think>, or the completion writes a think tag."""
    return prompt_ends_with_think or THINK_OPEN in text or THINK_CLOSE in text


# --- tagged ------------------------------------------------------------------------------


def _tag_checks(text: str, prompt_ends_with_think: bool) -> list[bool]:
    count = {t: text.count(t) for t in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)}
    pos = {t: text.find(t) for t in count}
    opened = (text.lstrip().startswith(THINK_OPEN) if count[THINK_OPEN] == 1
              else (count[THINK_OPEN] == 0 and prompt_ends_with_think))
    think_from = pos[THINK_OPEN] + len(THINK_OPEN) if count[THINK_OPEN] == 1 else 0
    closed = (count[THINK_CLOSE] == 1 and pos[THINK_CLOSE] > pos[THINK_OPEN]
              and not is_placeholder_reasoning(text[think_from:pos[THINK_CLOSE]]))
    answer_ok = (count[ANSWER_OPEN] == 1 and count[ANSWER_CLOSE] == 1
                 and pos[ANSWER_CLOSE] > pos[ANSWER_OPEN]
                 and not is_template_text(text[pos[ANSWER_OPEN] + len(ANSWER_OPEN):pos[ANSWER_CLOSE]]))
    return [
        opened,
        closed,
        answer_ok and pos[ANSWER_OPEN] > pos[THINK_CLOSE],
        answer_ok and text.rstrip().endswith(ANSWER_CLOSE),
    ]


def _is_well_tagged(text: str, prompt_ends_with_think: bool) -> bool:
    """`<think>...</think>` then `<answer>...</answer>`, whitespace around, each tag once,
    a real answer (not template text), reasoning that is not the template's placeholder. With `prompt_ends_with_think`
    the opening <think> may be missing."""
    s = text.strip()
    if s.count(THINK_OPEN) == 1 and s.startswith(THINK_OPEN):
        s = s[len(THINK_OPEN):]
    elif not (prompt_ends_with_think and THINK_OPEN not in s):
        return False
    if s.count(THINK_CLOSE) != 1 or s.count(ANSWER_OPEN) != 1 or s.count(ANSWER_CLOSE) != 1:
        return False
    think_end = s.index(THINK_CLOSE)
    answer_start = s.index(ANSWER_OPEN)
    if answer_start < think_end or s[think_end + len(THINK_CLOSE):answer_start].strip():
        return False
    if not s.endswith(ANSWER_CLOSE) or is_placeholder_reasoning(s[:think_end]):
        return False
    return not is_template_text(s[answer_start + len(ANSWER_OPEN):-len(ANSWER_CLOSE)])


# --- chat --------------------------------------------------------------------------------


def _final_mark(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the final answer's mark: the one complete <answer> block,
    else the last \\boxed{}; None when there is neither."""
    if text.count(ANSWER_OPEN) == 1 and text.count(ANSWER_CLOSE) == 1:
        start, end = text.find(ANSWER_OPEN), text.find(ANSWER_CLOSE)
        if start < end:
            return start, end + len(ANSWER_CLOSE), text[start + len(ANSWER_OPEN):end]
    content = extract_boxed(text)
    if content is None:
        return None
    # extract_boxed read the last box that closes, in the text's last MAX_BOXED_SCAN chars:
    # the last opening whose text continues with that (brace-balanced) content is it.
    offset = max(0, len(text) - MAX_BOXED_SCAN)
    for m in reversed(list(BOX_COMMAND.finditer(text, offset))):
        if text.startswith(content + "}", m.end()):
            return m.start(), m.end() + len(content) + 1, content
    return None


def _chat_checks(text: str) -> list[bool]:
    mark = _final_mark(text)
    if mark is None:
        return [False, False, False, False]
    start, end, content = mark
    return [
        not is_template_text(text[:start]),
        True,
        not is_template_text(content),
        not text[end:].strip(_AFTER_BOX),
    ]


# --- both --------------------------------------------------------------------------------


def format_checks(text: str, prompt_ends_with_think: bool = False) -> list[bool]:
    """The four checks of the completion's shape (tagged or chat; module docstring)."""
    if uses_tags(text, prompt_ends_with_think):
        return _tag_checks(text, prompt_ends_with_think)
    return _chat_checks(text)


def tag_score(text: str, prompt_ends_with_think: bool = False) -> float:
    """0.25 per check passed (module docstring); a tag that appears more than once earns
    nothing, nor do tags around template text."""
    return 0.25 * sum(format_checks(text, prompt_ends_with_think))


def is_well_formatted(text: str, prompt_ends_with_think: bool = False) -> bool:
    """Tagged: the strict R1 format (each tag once, nothing between the blocks, ending on
    `</answer>`). Chat: reasoning, then the final answer in an <answer> block or a
    \\boxed{}, ending the completion. Neither pays template text."""
    if uses_tags(text, prompt_ends_with_think):
        return _is_well_tagged(text, prompt_ends_with_think)
    return all(_chat_checks(text))
