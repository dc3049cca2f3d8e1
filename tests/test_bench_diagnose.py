"""bench/diagnose.py's own logic, without training (a real fault run takes minutes on 2
cores; the bench itself is the end-to-end check): the in-round findings it reads are the
strings RoundMonitor writes, every fault's overrides make a valid config, the NaN reward
it registers is NaN where it should be, and detection steps come from history prefixes."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from grpo_core.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its `harness` helper
    spec = importlib.util.spec_from_file_location("bench_diagnose", ROOT / "bench" / "diagnose.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_diagnose", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_fault_builds_a_valid_config(bench, monkeypatch):
    from grpo_core.verify import rewards

    monkeypatch.setattr(rewards, "REWARDS", dict(rewards.REWARDS))  # the bench's reward stays here
    bench.register_bench_rewards()
    for case in bench.FAULTS:
        cfg = bench.recipe_config(bench.RECIPE, ["grpo.max_steps=3", *case.overrides])
        assert cfg.grpo.max_steps == 3, case.name
    assert set(bench.QUICK) <= {c.name for c in bench.FAULTS}
    out = bench.digit_share(["<think>x</think> <answer>12</answer>", "no answer", "<answer>1a</answer>"])
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == 0.5


def test_detection_step_is_the_first_prefix_that_fires(bench):
    rows = [{"step": s, "loss": 0.0, "completions/clipped_ratio": 0.9 if s >= 8 else 0.1}
            for s in range(1, 13)]
    # truncation averages the last 5 steps: 0.26 after step 8, 0.42 after step 9
    assert bench.first_detection(rows, config_from_dict({})) == {"truncation": 9}
