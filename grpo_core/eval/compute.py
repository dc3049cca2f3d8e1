"""Compute beside every gain: what each recipe spent to make its model, and whether two
recipes were compute-matched. A recipe comparison that ignores cost misleads: sft_grpo
spends SFT's compute on top of the GRPO rounds both recipes run.

    compute_markdown({"r1_zero": c1, "sft_grpo": c2})   # the table under the comparison
    match_clause(c_ref, c_other, "r1_zero", "sft_grpo")  # "; not compute-matched: ..."

A compute is the pipeline's ledger (tasks.stage_results.Compute as a dict): seconds per
stage kind, steps, tokens trained and generated, training TFLOP (6 x parameters x trained
tokens). Two recipes are compute-matched when their training TFLOP differ by at most
MATCH_TOLERANCE; seconds say the same on one machine but depend on its load."""
from __future__ import annotations

from collections.abc import Mapping

MATCH_TOLERANCE = 0.10  # a relative difference in training TFLOP still called matched


def training_seconds(c: Mapping) -> float:
    """SFT, filters and GRPO rounds: the seconds a recipe spends to make its model."""
    return float(c.get("sft_s", 0.0) + c.get("filter_s", 0.0) + c.get("grpo_s", 0.0))


def short_count(x: float) -> str:
    """1234567 -> "1.23M"; 5300 -> "5.3k"."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.0f}"


def compute_markdown(computes: Mapping[str, Mapping]) -> str:
    """The compute table, one row per recipe; "" when no recipe measured any."""
    rows = [(r, c) for r, c in computes.items() if c]
    if not rows:
        return ""
    lines = ["", "", "Compute (what each recipe spent to make its model; seconds on this "
             "machine, TFLOP = 6 x parameters x trained tokens):", "",
             "| recipe | SFT s (steps) | filter s (samples) | GRPO s (steps) | trained tokens "
             "| generated tokens | training TFLOP | training s |",
             "|---|---|---|---|---|---|---|---|"]
    for recipe, c in rows:
        lines.append(
            f"| {recipe} | {c.get('sft_s', 0):.0f} ({c.get('sft_steps', 0)}) | "
            f"{c.get('filter_s', 0):.0f} ({short_count(c.get('filter_samples', 0))}) | "
            f"{c.get('grpo_s', 0):.0f} ({c.get('grpo_steps', 0)}) | "
            f"{short_count(c.get('train_tokens', 0))} | {short_count(c.get('gen_tokens', 0))} | "
            f"{c.get('train_tflop', 0):.3g} | {training_seconds(c):.0f} |")
    return "\n".join(lines)


def match_clause(ref: Mapping | None, other: Mapping | None, ref_name: str,
                 other_name: str) -> str:
    """The verdict's compute clause: "; compute-matched (...)" or "; not compute-matched:
    sft_grpo spent 1.31x r1_zero's training TFLOP"; "" when either was not measured."""
    if not ref or not other or not ref.get("train_tflop") or not other.get("train_tflop"):
        return ""
    ratio = other["train_tflop"] / ref["train_tflop"]
    said = (f"{other_name} spent {ratio:.2f}x {ref_name}'s training TFLOP "
            f"({other['train_tflop']:.3g} vs {ref['train_tflop']:.3g}; training seconds "
            f"{training_seconds(other):.0f} vs {training_seconds(ref):.0f})")
    if abs(ratio - 1.0) <= MATCH_TOLERANCE:
        return f"; compute-matched: {said}"
    return f"; not compute-matched: {said}"


def matching_steps(sft_recipe: Mapping, rounds: int) -> int:
    """project.compute_match: the extra GRPO steps per round that spend the SFT recipe's
    SFT TFLOP at that recipe's own GRPO TFLOP per step (its rounds, measured); 0 when it
    measured no SFT or no GRPO step."""
    grpo_tflop = sft_recipe.get("train_tflop", 0.0) - sft_recipe.get("sft_tflop", 0.0)
    steps = sft_recipe.get("grpo_steps", 0)
    if not sft_recipe.get("sft_tflop") or grpo_tflop <= 0 or not steps or rounds < 1:
        return 0
    return round(sft_recipe["sft_tflop"] / (grpo_tflop / steps) / rounds)
