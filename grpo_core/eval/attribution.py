"""Which stage earned a recipe's gain, and the one sentence that answers "which recipe
won, by how much, and why".

A pipeline evaluates its model after every stage on the same problems (eval/base, eval/sft,
eval/round-N, eval/final on the first benchmark), so each stage's gain over the stage
before is a paired difference of per-problem scores, with the paired bootstrap CI
(grpo_core.eval.paired.paired_delta):

    stage_gains([("eval/base", rows), ("eval/sft", rows), ("eval/round-1", rows), ...])
        -> [{"stage": "eval/sft", "over": "eval/base", "delta", "lo", "hi", "n"}, ...]
    phase_gains(...) -> {"SFT": sft minus base, "GRPO": last stage minus (sft or base), over
                         its "rounds"}

The phases are the recipe-level question (did SFT or GRPO earn it?); a sum of the
per-round deltas would carry every round's noise, so the GRPO phase is paired directly.

`verdict` says recipe against recipe in one sentence, with each number rounded to the
precision its CI supports (two significant digits of the CI's half-width); "no
significant difference" when the paired CI holds 0.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

from grpo_core.eval.paired import paired_delta

Stage = tuple[str, Sequence[dict]]  # (eval label, per-problem records)


def stage_gains(stages: Sequence[Stage], metric: str, canon: Callable[[str], Hashable] | None = None,
                n_resamples: int = 1000, seed: int = 0) -> list[dict]:
    """Each stage minus the stage before it that has records, paired on `metric`. A stage
    without records, or whose records cannot be paired with the one before (other
    problems or sample counts), is skipped: the next one is compared with the last one
    that could be."""
    out, prev = [], None
    for label, rows in stages:
        if not rows:
            continue
        if prev is not None:
            try:
                d = paired_delta(rows, prev[1], metric, canon=canon, n_resamples=n_resamples,
                                 seed=seed)
            except ValueError:
                continue
            out.append({"stage": label, "over": prev[0], **d})
        prev = (label, rows)
    return out


def is_sft(label: str) -> bool:
    return label.rsplit("/", 1)[-1] == "sft"


def phase_gains(stages: Sequence[Stage], metric: str,
                canon: Callable[[str], Hashable] | None = None, n_resamples: int = 1000,
                seed: int = 0) -> dict[str, dict]:
    """{"SFT": SFT's model minus the base, "GRPO": the last stage minus SFT's model (or
    the base without SFT)}, each {"delta", "lo", "hi", "n"}; a phase that did not run or
    cannot be paired is absent. GRPO's also holds "rounds": how many GRPO rounds' models
    (eval/round-N stages) lie between the two, so a sentence can say the final model is
    that many rounds past SFT. The stages are in pipeline order, the base first."""
    have = [(label, rows) for label, rows in stages if rows]
    if len(have) < 2:
        return {}
    base, last = have[0], have[-1]
    sft = next((s for s in have[1:] if is_sft(s[0])), None)
    pairs = {"SFT": (sft, base), "GRPO": (last, sft or base)}
    out = {}
    for phase, (a, b) in pairs.items():
        if a is None or b is None or a[0] == b[0]:
            continue
        try:
            out[phase] = paired_delta(a[1], b[1], metric, canon=canon, n_resamples=n_resamples,
                                      seed=seed)
        except ValueError:
            continue
        if phase == "GRPO":
            after = have[[s[0] for s in have].index(b[0]) + 1:]
            out[phase]["rounds"] = sum(is_round(label) for label, _ in after)
    return out


def is_round(label: str) -> bool:
    """eval/round-N: the model of GRPO round N."""
    name = label.rsplit("/", 1)[-1]
    return name.startswith("round-") and name.removeprefix("round-").isdigit()


# --------------------------------------------------------------------------- wording

def decimals(lo: float | None, hi: float | None, default: int = 3) -> int:
    """Decimals a value with CI [lo, hi] deserves: two significant digits of the CI's
    half-width (0.0345 -> 3, 0.3 -> 2), within [1, 6]; `default` without a CI."""
    if lo is None or hi is None or not (hi > lo):
        return default
    return min(6, max(1, 1 - math.floor(math.log10((hi - lo) / 2))))


def ci_phrase(d: Mapping, signed: bool = True) -> str:
    """"+0.096 [0.062, 0.131]": a paired delta ({"delta", "lo", "hi"}) rounded to its CI."""
    n = decimals(d.get("lo"), d.get("hi"))
    value = f"{d['delta']:{'+' if signed else ''}.{n}f}"
    if d.get("lo") is None or d.get("hi") is None:
        return value
    return f"{value} [{d['lo']:.{n}f}, {d['hi']:.{n}f}]"


def significant(d: Mapping) -> bool:
    """A paired CI that excludes 0 (either sign)."""
    return d.get("lo") is not None and d.get("hi") is not None and (d["lo"] > 0 or d["hi"] < 0)


def _negated(d: Mapping) -> dict:
    return {**d, "delta": -d["delta"], "lo": -d["hi"], "hi": -d["lo"]}


def phases_phrase(phases: Mapping[str, Mapping]) -> str:
    """"SFT alone gave +0.167 [..], GRPO after SFT (2 rounds) +0.012 [..] (not significant)":
    the GRPO phase is the final model against SFT's (or the base's), over its rounds."""
    parts = []
    if "SFT" in phases:
        parts.append(f"SFT alone gave {ci_phrase(phases['SFT'])}" + _ns(phases["SFT"]))
    if "GRPO" in phases:
        grpo = phases["GRPO"]
        rounds = grpo.get("rounds")
        over = f" ({rounds} round{'s' if rounds != 1 else ''})" if rounds else ""
        lead = f"GRPO after SFT{over}" if "SFT" in phases else f"GRPO from the base model{over} gave"
        parts.append(f"{lead} {ci_phrase(grpo)}" + _ns(grpo))
    return ", ".join(parts)


def _ns(d: Mapping) -> str:
    return "" if significant(d) or d.get("lo") is None else " (not significant)"


def verdict(a: str, b: str, benchmark: str, metric: str, paired: Mapping | None,
            phases: Mapping[str, Mapping[str, Mapping]] | None = None) -> str:
    """The answer in one sentence. `paired`: a's final minus b's final on the same problems
    ({"delta", "lo", "hi", "n"}, None when they could not be paired); `phases`:
    {recipe: phase_gains}. The winner's phases follow its margin; with no significant
    difference, both recipes' phases follow."""
    phases = phases or {}
    on = f"on {benchmark} {metric}"
    if paired is None:
        return (f"{a} and {b} cannot be compared {on}: their final models were not scored on "
                "the same problems")
    size = f"(paired, {paired['n']} problems)" if paired.get("n") else "(paired)"
    if significant(paired):
        win, lose, d = (a, b, paired) if paired["lo"] > 0 else (b, a, _negated(paired))
        text = f"{win} beats {lose} {on} by {ci_phrase(d)} {size}"
        said = phases_phrase(phases.get(win) or {})
        return f"{text}; {said}" if said else text
    text = f"no significant difference between {a} and {b} {on}: {a} minus {b} {ci_phrase(paired)} {size}"
    said = [f"{r}: {p}" for r in (a, b) if (p := phases_phrase(phases.get(r) or {}))]
    return "; ".join([text, *said])
