"""grpo_core.eval.metric_names: the one grammar of metric names, and that what evaluation
reports and the config accepts agree with it."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_core.config.sections import EvalConfig
from grpo_core.eval.metric_names import (
    MetricName,
    at_samples,
    benchmarks_in,
    ci_block_keys,
    ci_cells,
    delta_key,
    metric_name,
    parse_metric,
    reported_at,
)
from grpo_core.eval.metrics import summarise

NAMES = ["greedy_accuracy", "avg@4", "avg@8", "maj@1", "maj@2", "pass@4", "pass@16", "avg@04",
         "flexible/avg@4", "strict/pass@1", "flexible/greedy_accuracy", "strict/greedy_accuracy",
         "format_adherence", "avg@", "pass@0", "maj@-1", "maj@3@4", "avg@²", "vote@4",
         "truncation_rate", "flexible/n_problems", "loose/avg@4", "strict/flexible/avg@4",
         "flexible/strict/avg@4", "/avg@4", "k"]


def test_parse_and_spell():
    assert parse_metric("avg@8") == MetricName("strict", "avg", 8)
    assert parse_metric("flexible/maj@4") == MetricName("flexible", "maj", 4)
    assert parse_metric("strict/greedy_accuracy") == MetricName("strict", "greedy_accuracy", None)
    for bad in ("format_adherence", "avg@", "pass@0", "avg@04", "maj@3@4", "avg@²", "loose/avg@4",
                "strict/flexible/avg@4", "/avg@4", "truncation_rate"):
        assert parse_metric(bad) is None, bad
    assert parse_metric("strict/pass@2").name == "pass@2"  # one spelling of each metric
    assert parse_metric("flexible/pass@2").name == "flexible/pass@2"
    assert parse_metric("flexible/pass@2").record_suffix == "_flexible"
    assert parse_metric("pass@2").record_suffix == ""
    assert metric_name("avg", 8) == "avg@8"
    assert metric_name("greedy_accuracy", extraction="flexible") == "flexible/greedy_accuracy"
    for name in NAMES:
        m = parse_metric(name)
        assert m is None or parse_metric(m.name) == m


def test_every_reported_metric_parses_and_is_reported_at_its_samples():
    records = [{"greedy_correct": i % 2 == 0, "sample_correct": [True, False, i % 3 == 0, True],
                "sample_answers": ["1", "2", "1", "1"]} for i in range(6)]
    metrics = summarise(records, n_resamples=10)
    names = [n for n in metrics if parse_metric(n) is not None]
    assert names == ["greedy_accuracy", "avg@4", "maj@1", "maj@2", "maj@4", "pass@1",
                     "pass@2", "pass@4", "gpass50@2", "gpass50@4", "gpass75@2", "gpass75@4",
                     "gpass100@2", "gpass100@4"]  # by kind (G-Pass after pass), then k
    assert all(reported_at(n, 4) for n in names)
    assert not reported_at("avg@2", 4) and not reported_at("pass@8", 4)


@pytest.mark.parametrize("samples", [1, 2, 4, 8])
def test_reported_at_is_the_configs_primary_metric_rule(samples):
    """EvalConfig accepts exactly the metrics an evaluation reports (it asks reported_at),
    in their one spelling."""
    for name in NAMES:
        try:
            cfg = EvalConfig(samples=samples, primary_metric=name)
        except (ValidationError, ValueError):
            accepted = None
        else:
            accepted = cfg.primary_metric
        expected = parse_metric(name).name if reported_at(name, samples) else None
        assert accepted == expected, (name, samples)


def test_at_samples():
    assert at_samples("avg@16", 2) == "avg@2" and at_samples("avg@1", 2) == "avg@2"
    assert at_samples("maj@8", 2) == "maj@2" and at_samples("pass@1", 2) == "pass@1"
    assert at_samples("flexible/maj@8", 4) == "flexible/maj@4"
    assert at_samples("greedy_accuracy", 2) == "greedy_accuracy"
    assert at_samples("format_adherence", 2) == "format_adherence"
    assert all(reported_at(at_samples(n, s), s) for n in NAMES if parse_metric(n)
               for s in (1, 2, 3))


def test_logged_names():
    assert ci_block_keys("gsm8k/pass_at_4") == {
        "mean": "gsm8k/pass_at_4", "lo": "gsm8k/pass_at_4_ci_lo", "hi": "gsm8k/pass_at_4_ci_hi",
        "n": "gsm8k/pass_at_4_n"}
    assert delta_key("gsm8k/avg_at_4") == "gsm8k/avg_at_4_delta"
    assert ci_cells("gsm8k/final") == ("gsm8k/final", "gsm8k/final_lo", "gsm8k/final_hi")
    keys = ["gsm8k/avg_at_4", "gsm8k/avg_at_4_ci_lo", "math500/avg_at_4", "final/gsm8k/avg_at_4",
            "gsm8k/flexible/avg_at_4", "synthetic/final", "synthetic/final_lo", "avg_at_4"]
    assert benchmarks_in(keys, "avg_at_4") == ["gsm8k", "math500"]
    assert benchmarks_in(keys, "flexible/avg_at_4") == ["gsm8k"]
    assert benchmarks_in(keys, "final") == ["synthetic"]
