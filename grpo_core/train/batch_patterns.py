"""A completion pattern that repeats across most of a batch: evidence for the
`reward_hacking_suspect` rule (grpo_core/train/diagnosis.py).

Different problems have different answers. The same wrong answer, or the same whole
completion, under most of a batch's prompts is something the policy writes whatever the
problem asks: the template's placeholder (`<answer> here </answer>`, issue 24), a fixed
"0", a copied example. A shaping reward that pays it rises while accuracy does not, but
the reward curves alone show that only once the damage is done; the batch shows it at once.

Per generation batch, two patterns of each completion: its text and its final answer
(strict extraction), each normalised (case, punctuation and spacing aside). A pattern's
share is the fraction of the batch's prompts under which at least one completion carries
it; `repeated_patterns` reports the most shared pattern of each kind. Left out: correct
completions (problems can share a gold, and a right answer repeated is no hack),
completions without an answer (for the answer pattern), and batches of fewer than
diagnosis.repeated_pattern_min_prompts prompts (one problem's completions agreeing is the
no_diversity rule's business). The GRPO round logs the shares per step as `SHARE_METRICS`."""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from grpo_core.verify.extraction import canonical, extract_answer

MAX_PATTERN_CHARS = 2_000  # a completion's pattern is its first 2,000 characters, normalised
KINDS = ("text", "answer")
SHARE_METRICS = {kind: f"completions/repeated_{kind}_share" for kind in KINDS}
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class RepeatedPattern:
    kind: str  # "text" | "answer"
    pattern: str  # normalised
    share: float  # of the batch's prompts
    prompts: int  # prompts in the batch


def normalise(text: str) -> str:
    """Lower case, words only, single spaces: "<answer> Here. </answer>" -> "answer here answer"."""
    return " ".join(_WORD.findall(text[:MAX_PATTERN_CHARS].lower()))


def _correct(row: Mapping, answer: str | None) -> bool:
    """Right by the round's accuracy reward when it ran, else by spelling against the gold."""
    acc = (row.get("rewards") or {}).get("accuracy")
    if acc is not None:
        return acc == 1.0
    gold = row.get("answer")
    return answer is not None and gold is not None and canonical(answer) == canonical(str(gold))


def repeated_patterns(rows: Iterable[Mapping],
                      min_prompts: int = 3) -> dict[str, RepeatedPattern] | None:
    """{kind: its most shared pattern} over one batch of rollout rows (the GRPO trainer's
    rollout-sink rows: completion, answer (the gold), problem_id or prompt, rewards); a
    kind is missing when no wrong completion had one. None (not measured) with fewer than
    min_prompts prompts."""
    seen: dict[str, dict[str, set]] = {kind: defaultdict(set) for kind in KINDS}
    prompts = set()
    for row in rows:
        prompt = row.get("problem_id") or row.get("prompt")
        prompts.add(prompt)
        text = row.get("completion") or ""
        answer = extract_answer(text)
        if _correct(row, answer):
            continue
        seen["text"][normalise(text)].add(prompt)
        if answer is not None and (key := normalise(answer)):
            seen["answer"][key].add(prompt)
    if len(prompts) < min_prompts:
        return None
    out = {}
    for kind, by_pattern in seen.items():
        counts = Counter({pattern: len(ps) for pattern, ps in by_pattern.items()})
        if counts:
            pattern, n = counts.most_common(1)[0]
            out[kind] = RepeatedPattern(kind, pattern, n / len(prompts), len(prompts))
    return out


def share_metrics(found: Mapping[str, RepeatedPattern] | None) -> dict[str, float]:
    """The per-step metrics: each kind's top share (0.0 when nothing wrong repeated);
    none when the batch was not measured."""
    if found is None:
        return {}
    return {SHARE_METRICS[kind]: (found[kind].share if kind in found else 0.0) for kind in KINDS}
