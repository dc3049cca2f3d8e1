"""Stage attribution and the verdict sentence (issue 27) on constructed per-problem results:
every expected number below is worked out by hand from the construction (K samples per
problem, a stage adds a known number of correct samples on every problem)."""
from __future__ import annotations

import pytest

from grpo_core.eval.attribution import (
    ci_phrase,
    decimals,
    phase_gains,
    stage_gains,
    verdict,
)
from grpo_core.eval.paired import paired_delta

K = 8
METRIC = f"avg@{K}"
N = 40
BASE = [(3 * i) % 5 for i in range(N)]  # 0..4 of 8 right: spread difficulty


def rows(counts: list[int]) -> list[dict]:
    return [{"problem_id": f"p{i:03d}", "greedy_correct": c * 2 >= K,
             "sample_correct": [True] * c + [False] * (K - c)} for i, c in enumerate(counts)]


def plus(counts: list[int], extra: int) -> list[int]:
    return [min(K, c + extra) for c in counts]


# sft_grpo: SFT adds 2 of 8 on every problem (+0.25, CI [0.25, 0.25]), its GRPO round adds
# one sample on half the problems and loses one on the other half (0 on average, CI holds 0).
SFT = plus(BASE, 2)
ROUND = [c + (1 if i % 2 else -1) for i, c in enumerate(SFT)]
# r1_zero: its GRPO round adds one sample on every problem (+0.125).
ZERO = plus(BASE, 1)


def sft_grpo_stages():
    return [("eval/base", rows(BASE)), ("eval/sft", rows(SFT)), ("eval/round-1", rows(ROUND))]


def test_stage_gains_pair_each_stage_with_the_one_before():
    gains = stage_gains(sft_grpo_stages(), METRIC)
    assert [(g["stage"], g["over"]) for g in gains] == [("eval/sft", "eval/base"),
                                                        ("eval/round-1", "eval/sft")]
    sft, rnd = gains
    assert sft["delta"] == pytest.approx(0.25) and sft["lo"] == pytest.approx(0.25)
    assert sft["hi"] == pytest.approx(0.25) and sft["n"] == N
    assert rnd["delta"] == pytest.approx(0.0) and rnd["lo"] < 0 < rnd["hi"]


def test_a_stage_without_records_or_on_other_problems_is_skipped():
    stages = [("eval/base", rows(BASE)), ("eval/sft", []), ("eval/round-1", rows(ZERO)),
              ("eval/round-2", rows(ZERO[:10])), ("eval/final", rows(plus(ZERO, 1)))]
    gains = stage_gains(stages, METRIC)
    assert [(g["stage"], g["over"]) for g in gains] == [("eval/round-1", "eval/base"),
                                                        ("eval/final", "eval/round-1")]
    assert [g["delta"] for g in gains] == pytest.approx([0.125, 0.125])


def test_phases_split_sft_from_grpo():
    phases = phase_gains(sft_grpo_stages(), METRIC)
    assert phases["SFT"]["delta"] == pytest.approx(0.25)
    assert phases["GRPO"]["delta"] == pytest.approx(0.0)  # round-1 minus SFT, paired directly
    zero = phase_gains([("eval/base", rows(BASE)), ("eval/round-1", rows(ZERO))], METRIC)
    assert set(zero) == {"GRPO"} and zero["GRPO"]["delta"] == pytest.approx(0.125)
    assert phase_gains([("eval/base", rows(BASE))], METRIC) == {}


def test_the_grpo_phase_is_the_final_model_over_sft_across_its_rounds():
    # two rounds after SFT, each adding one sample on every problem: GRPO's phase is the
    # final model (round 2, eval/final the same) minus SFT's, paired directly: +0.25
    stages = [("eval/base", rows(BASE)), ("eval/sft", rows(SFT)),
              ("eval/round-1", rows(plus(SFT, 1))), ("eval/round-2", rows(plus(SFT, 2)))]
    phases = phase_gains(stages, METRIC)
    assert phases["GRPO"]["delta"] == pytest.approx(0.25) and phases["GRPO"]["rounds"] == 2
    assert "rounds" not in phases["SFT"]
    from grpo_core.eval.attribution import phases_phrase

    said = phases_phrase(phases)
    assert "GRPO after SFT (2 rounds) +0.250" in said
    # a phrase from phases without a round count (an older cached report) says none
    assert "GRPO after SFT +0.250" in phases_phrase({k: {kk: vv for kk, vv in v.items()
                                                         if kk != "rounds"}
                                                     for k, v in phases.items()})
    zero = phase_gains([("eval/base", rows(BASE)), ("eval/round-1", rows(ZERO)),
                        ("eval/round-2", rows(plus(ZERO, 1)))], METRIC)
    assert zero["GRPO"]["rounds"] == 2
    assert "GRPO from the base model (2 rounds) gave +0.250" in phases_phrase(zero)


def test_values_are_rounded_to_the_ci_precision():
    assert decimals(0.062, 0.131) == 3  # half-width 0.0345
    assert decimals(0.1, 0.7) == 2      # 0.3
    assert decimals(0.1, 0.1008) == 5   # 0.0004
    assert decimals(None, None) == 3
    assert ci_phrase({"delta": 0.09612345, "lo": 0.0621, "hi": 0.1309}) == "+0.096 [0.062, 0.131]"
    assert ci_phrase({"delta": 0.18121874999999998, "lo": 0.1, "hi": 0.7}) == "+0.18 [0.10, 0.70]"


def _verdict(a_counts, b_counts, a="sft_grpo", b="r1_zero"):
    paired = paired_delta(rows(a_counts), rows(b_counts), METRIC)
    phases = {"sft_grpo": phase_gains(sft_grpo_stages(), METRIC),
              "r1_zero": phase_gains([("eval/base", rows(BASE)), ("eval/round-1", rows(ZERO))],
                                     METRIC)}
    return verdict(a, b, "synthetic", METRIC, paired, phases)


def test_verdict_names_the_winner_and_the_stage_that_earned_it():
    # sft_grpo's final: two more samples than r1_zero's on every problem (+0.25).
    text = _verdict(plus(ZERO, 2), ZERO)
    assert text.startswith("sft_grpo beats r1_zero on synthetic avg@8 by +0.250")
    assert "(paired, 40 problems)" in text
    assert "SFT alone gave +0.250" in text
    assert "GRPO after SFT (1 round) +0.00" in text and "(not significant)" in text


def test_verdict_the_other_direction():
    # r1_zero wins; asked as "sft_grpo vs r1_zero" the margin is said for the winner, positive.
    text = _verdict(ZERO, plus(ZERO, 3))
    assert text.startswith("r1_zero beats sft_grpo on synthetic avg@8 by +0.375")
    assert "GRPO from the base model (1 round) gave +0.125" in text
    assert "SFT alone" not in text  # the loser's stages are not the answer


def test_verdict_no_significant_difference_when_the_ci_holds_zero():
    swings = [c + (1 if i % 2 else -1) for i, c in enumerate(plus(ZERO, 1))]
    text = _verdict(swings, plus(ZERO, 1))
    assert text.startswith("no significant difference between sft_grpo and r1_zero on synthetic avg@8")
    assert "beats" not in text
    assert "sft_grpo: SFT alone gave" in text and "r1_zero: GRPO from the base model (1 round) gave" in text


def test_verdict_without_paired_records_says_so():
    text = verdict("sft_grpo", "r1_zero", "synthetic", METRIC, None)
    assert "cannot be compared" in text and "beats" not in text


def test_logged_numbers_without_float_noise():
    from grpo_core.eval.metric_names import shown

    assert repr(shown(0.18121874999999998)) == "0.18121875"
    assert shown(29 / 160) == 0.18125 and shown(1 / 3) == 0.3333333333
