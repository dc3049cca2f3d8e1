"""Adaptive difficulty filter and rollouts as evidence (issue 15, items 3 and 4): the stop
rule on constructed counts, adaptive samples as a prefix of the fixed-k ones (fake and
real HF sampling), sharded == unsharded, stored-estimate reuse by rule and prior, old
stores readable, and a real GRPO round's rollouts cutting the next filter's samples."""
from __future__ import annotations

import os

import duckdb
import pytest

from grpo_core.config import PipelineConfig
from grpo_core.data.db import PASS_RATE_SCHEMA, ensure_tables
from grpo_core.data.records import problem_key, read_pass_rates, write_rollouts
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval import adaptive
from grpo_core.eval.adaptive import Evidence, StopPlan, budget
from grpo_core.eval.difficulty import filter_problems, run_filter, sampling_key, sampling_spec
from grpo_core.eval.evidence import (
    evidence_fingerprint,
    priors_from_counts,
    rollout_counts,
    rollout_priors,
)
from grpo_core.eval.passrate import wilson_interval, z_for
from grpo_core.generation.rollout import Completion
from grpo_core.prompts import render_prompt

os.environ.setdefault("GRPO_TORCH_THREADS", "1")
pytest_plugins = ["fixtures_models"]  # tiny_model_path

BAND = (0.3, 0.7)
# Outcome of sample j of a level-L problem: PATTERNS[L][j] ("1" correct). Level 1 always
# right, 5 never, 3 half, 2 and 4 near the band's edges.
PATTERNS = {1: "1" * 16, 2: "1101101111011011", 3: "1010101010101010",
            4: "0010000100100000", 5: "0" * 16}


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


class PatternBackend:
    """Sample j of problem p is right iff PATTERNS[p.level][j]: depends on j alone, as
    seeded sampling does. Counts every completion it draws."""

    def __init__(self, problems, template="r1_zero"):
        self.by_prompt = {render_prompt(p.problem, template): p for p in problems}
        self.drawn = 0

    def sample(self, prompts, n, params):
        out = []
        for prompt in prompts:
            p = self.by_prompt[prompt]
            self.drawn += n
            out.append([Completion(f"</think> <answer>{p.answer if PATTERNS[p.level][j] == '1' else -1}"
                                   "</answer>", 4, "stop") for j in range(n)])
        return out


def _cfg(k=16, adaptive_on=True, **filt) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.filter.k = k
    cfg.filter.adaptive = adaptive_on
    cfg.rollout.max_new_tokens = 16
    for name, value in filt.items():
        setattr(cfg.filter, name, value)
    return cfg


# ----------------------------------------------------------------------------- the rule


def test_stop_rule_on_constructed_counts():
    plan = StopPlan(start=4, step=4, z=z_for(0.8), band=BAND)
    assert plan.decided(0, 4) and plan.decided(4, 4)  # 0/4 and 4/4: outside the band
    assert not plan.decided(2, 4) and not plan.decided(1, 4)  # could still be either
    assert plan.decided(8, 16)  # [0.35, 0.65] at 80%: wholly inside
    assert not plan.decided(3, 8) and not plan.decided(0, 0)
    strict = StopPlan(4, 4, z_for(0.95), BAND)
    assert not strict.decided(0, 4)  # the 95% interval of 0/4 reaches 0.49
    n_needed = next(n for n in range(1, 30) if strict.decided(0, n))
    assert n_needed == 9 and wilson_interval(0, 9)[1] < 0.3 < wilson_interval(0, 8)[1]
    assert StopPlan(4, 4, 1.0, (0.0, 1.0)).decided(0, 1)  # everything is in that band
    # The schedule: start, then steps, capped by the budget.
    counts, n = [], 0
    while n < 16:
        n = plan.next_count(n, 16)
        counts.append(n)
    assert counts == [4, 8, 12, 16] and plan.next_count(0, 3) == 3
    # A prior adds pseudo-counts: 3 of 4 fresh decide nothing; with 6 of 6 pseudo, too easy.
    assert not plan.decided(3, 4) and plan.decided(3 + 6.0, 4 + 6.0)
    assert not plan.decided(3 + 1.5, 4 + 1.5)
    assert budget(16) == 16 and budget(16, Evidence(1.0, 2.5)) == 14


def test_exact_rule_stops_only_when_no_later_sample_changes_the_class():
    wide = StopPlan(start=2, step=2, z=None, band=(0.125, 0.875))  # k 8: 1-7 successes
    assert wide.decided(1, 2, 6) and wide.decided(1, 4, 4)  # one of each: in band for good
    assert not wide.decided(0, 2, 6) and not wide.decided(2, 2, 6) and not wide.decided(0, 6, 2)
    assert wide.decided(0, 8, 0) and not wide.decided(0, 0, 8)
    plan = StopPlan(start=2, step=2, z=None, band=BAND)  # k 8: 3-5 successes of 8
    assert plan.decided(3, 6, 2)  # 3/8 .. 5/8: in band whatever comes
    assert not plan.decided(1, 6, 2)  # 1/8 .. 3/8: two classes
    assert not plan.decided(2, 6, 2) and not plan.decided(0, 4, 4)
    # Too hard for good (at most 2/8), but a success would still put it among the problems
    # solved only sometimes, the fallback when the band keeps too few: not decided.
    assert not plan.decided(0, 6, 2) and not plan.decided(6, 6, 2)
    assert plan.decided(0, 8, 0) and plan.decided(1, 6, 1)  # 1/7 .. 2/7: too hard, in (0, 1)
    # With a prior: 2 of 4 pseudo-counts plus 1 of 2 fresh, 2 left: 3/8 .. 5/8; 5 left: 3/11 ..
    assert plan.decided(1 + 2.0, 2 + 4.0, 2) and not plan.decided(1 + 2.0, 2 + 4.0, 5)


def test_exact_keeps_what_fixed_k_keeps_with_fewer_samples():
    problems = generate_problems("train", 10, seed=0)  # levels 1..5 twice
    for band in (BAND, (1 / 16, 15 / 16)):
        fixed_backend = PatternBackend(problems)
        fixed = filter_problems(fixed_backend, problems, "fp",
                                _cfg(adaptive_on=False, band=band), "r1_zero")
        exact = filter_problems(PatternBackend(problems), problems, "fp",
                                _cfg(adaptive_on="exact", band=band, adaptive_start=2,
                                     adaptive_step=2), "r1_zero")
        assert [p.id for p in exact.kept] == [p.id for p in fixed.kept]
        assert exact.counts == fixed.counts and exact.summary()["adaptive"] == "exact"
        # and the problems solved only sometimes, the round's fallback (tasks.stages)
        assert [0 < e["pass_rate"] < 1 for e in exact.estimates] == \
            [0 < f["pass_rate"] < 1 for f in fixed.estimates]
        for f, e in zip(fixed.estimates, exact.estimates):
            assert f["outcomes"].startswith(e["outcomes"]) and e["samples"] <= 16
        assert exact.sampled < fixed.sampled == fixed_backend.drawn == 160
    # The wide band: levels 2-4 mix right and wrong within their first 2-4 samples.
    assert {p.level: e["samples"] for p, e in zip(problems, exact.estimates)} == \
        {1: 16, 2: 4, 3: 2, 4: 4, 5: 16}


def test_exact_draws_on_while_a_success_could_still_come(monkeypatch):
    """Level 5 solved once, at its last sample: too hard from sample 12 on, but fixed k
    counts it among the problems solved only sometimes, and so must the exact rule."""
    monkeypatch.setitem(PATTERNS, 5, "0" * 15 + "1")
    problems = generate_problems("train", 10, seed=0)
    fixed = filter_problems(PatternBackend(problems), problems, "fp", _cfg(adaptive_on=False),
                            "r1_zero")
    exact = filter_problems(PatternBackend(problems), problems, "fp",
                            _cfg(adaptive_on="exact"), "r1_zero")
    level5 = [e for p, e in zip(problems, exact.estimates) if p.level == 5]
    assert [e["outcomes"] for e in level5] == ["0" * 15 + "1"] * 2
    assert [0 < e["pass_rate"] < 1 for e in exact.estimates] == \
        [0 < f["pass_rate"] < 1 for f in fixed.estimates]
    assert exact.counts == fixed.counts


def test_wilson_takes_fractional_counts():
    lo, hi = wilson_interval(2.5, 6.5)
    assert wilson_interval(2, 6)[0] < lo < hi < wilson_interval(3, 7)[1]
    assert wilson_interval(0.0, 0.0) == (0.0, 1.0)
    assert z_for(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert z_for(0.95) == pytest.approx(1.959964, abs=1e-6)


def test_adaptive_outcomes_are_a_prefix_and_classes_agree():
    problems = generate_problems("train", 10, seed=0)  # levels 1..5 twice
    fixed_backend, adaptive_backend = PatternBackend(problems), PatternBackend(problems)
    fixed = filter_problems(fixed_backend, problems, "fp", _cfg(adaptive_on=False), "r1_zero")
    adapt = filter_problems(adaptive_backend, problems, "fp", _cfg(), "r1_zero")
    by_level = {}
    for f, a, p in zip(fixed.estimates, adapt.estimates, problems):
        assert f["outcomes"].startswith(a["outcomes"]) and a["samples"] == len(a["outcomes"])
        assert a["successes"] == a["outcomes"].count("1")
        assert (a["wilson_lo"], a["wilson_hi"]) == wilson_interval(a["successes"], a["samples"])
        by_level[p.level] = a["samples"]
    # Always or never right: one round. Half right: inside the band after 12 at 80%.
    assert by_level == {1: 4, 2: 16, 3: 12, 4: 16, 5: 4}
    assert adapt.counts == fixed.counts and [p.id for p in adapt.kept] == [p.id for p in fixed.kept]
    assert fixed.sampled == fixed_backend.drawn == 160
    assert adapt.sampled == sum(by_level.values()) * 2 < fixed.sampled
    assert adapt.summary()["sampled"] == adapt.sampled and adapt.summary()["adaptive"]


def test_sampling_keys_tell_adaptive_from_fixed_and_reuse_by_rule(tmp_path):
    fixed_cfg = _cfg(adaptive_on=False)
    assert "adaptive" not in sampling_spec(fixed_cfg, "r1_zero")  # old keys stay valid
    keys = {sampling_key(c, "r1_zero") for c in (
        fixed_cfg, _cfg(), _cfg(adaptive_start=2), _cfg(adaptive_step=2),
        _cfg(adaptive_confidence=0.9), _cfg(band=(0.2, 0.8)), _cfg(adaptive_on="exact"))}
    assert len(keys) == 7
    # A fixed-k key ignores the adaptive settings while they are off.
    assert sampling_key(_cfg(adaptive_on=False, adaptive_start=2), "r1_zero") == \
        sampling_key(fixed_cfg, "r1_zero")
    problems = generate_problems("train", 5, seed=0)
    with Store.open(tmp_path / "s.duckdb") as store:
        filter_problems(PatternBackend(problems), problems, "fp", fixed_cfg, "r1_zero", con=store)
        again = PatternBackend(problems)
        r = filter_problems(again, problems, "fp", _cfg(), "r1_zero", con=store)
        assert again.drawn > 0 and r.estimated == 5  # a fixed estimate is not an adaptive one
        same = PatternBackend(problems)
        r = filter_problems(same, problems, "fp", _cfg(), "r1_zero", con=store)
        assert same.drawn == 0 and r.reused == 5 and r.sampled == 0
        # Stored under another prior: sampled again.
        key = problem_key(problems[0])
        other = PatternBackend(problems)
        r = filter_problems(other, problems, "fp", _cfg(), "r1_zero", con=store,
                            priors={key: Evidence(1.0, 2.0)})
        assert (r.estimated, r.reused, r.with_evidence) == (1, 4, 1)


def test_old_stores_are_read_as_fixed_k_estimates():
    problems = generate_problems("train", 5, seed=0)
    con = duckdb.connect()
    cfg = _cfg(k=8, adaptive_on=False)
    first = filter_problems(PatternBackend(problems), problems, "fp", cfg, "r1_zero", con=con)
    new = ("samples", "outcomes", "prior_successes", "prior_samples")
    for col in new:  # as a store made before these columns existed
        con.execute(f"ALTER TABLE pass_rates DROP COLUMN {col}")
    fake = PatternBackend(problems)
    again = filter_problems(fake, problems, "fp", cfg, "r1_zero", con=con)
    assert fake.drawn == 0 and again.reused == 5 and again.sampled == 0
    assert [r["samples"] for r in again.estimates] == [8] * 5
    assert [r["pass_rate"] for r in again.estimates] == [r["pass_rate"] for r in first.estimates]
    ensure_tables(con)  # a write adds the columns back; old rows hold NULL there
    cols = [d[0] for d in con.execute("SELECT * FROM pass_rates").description]
    assert set(PASS_RATE_SCHEMA.names) <= set(cols)
    assert con.execute("SELECT count(*) FROM pass_rates WHERE samples IS NULL").fetchone()[0] == 5


# ----------------------------------------------------------------------------- real sampling


def _spy(monkeypatch):
    """Record every sample_seeded call the adaptive draws make: (prompt, start, texts)."""
    calls = []
    real = adaptive.sample_seeded

    def spy(backend, prompts, n, params, seeds, start=0):
        out = real(backend, prompts, n, params, seeds, start=start)
        calls.extend((p, start, [c.text for c in cs]) for p, cs in zip(prompts, out))
        return out

    monkeypatch.setattr(adaptive, "sample_seeded", spy)
    return calls


def _real_cfg(adaptive_on: bool) -> PipelineConfig:
    # The random model never answers right: with a band above 0 the interval of 0/n must
    # shrink below it, so every problem runs several rounds (2, 4, 6, 8).
    cfg = _cfg(k=8, adaptive_on=adaptive_on, adaptive_start=2, adaptive_step=2,
               band=(0.15, 1.0))
    cfg.rollout.backend = "hf"
    cfg.rollout.batch_size = 8
    cfg.rollout.max_new_tokens = 10
    cfg.model.template = "r1_zero"
    cfg.project.seed = 3
    return cfg


def test_real_adaptive_samples_are_the_fixed_samples_prefix(tiny_model_path, monkeypatch):
    problems = generate_problems("train", 6, seed=2)
    calls = _spy(monkeypatch)
    adapt = run_filter(tiny_model_path, problems, _real_cfg(True))
    fixed_calls = len(calls)
    fixed = run_filter(tiny_model_path, problems, _real_cfg(False))
    assert len(calls) == fixed_calls + 6  # one call, k samples each
    whole = {p: texts for p, start, texts in calls[fixed_calls:]}
    rounds = calls[:fixed_calls]
    assert len({start for _, start, _ in rounds}) > 1  # several rounds
    for prompt, start, texts in rounds:
        assert whole[prompt][start : start + len(texts)] == texts
    for a, f in zip(adapt.estimates, fixed.estimates):
        assert f["outcomes"].startswith(a["outcomes"]) and a["samples"] <= f["samples"] == 8


def _shard_rows(store) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created_at"} for r in read_pass_rates(store)]


def test_sharded_adaptive_gives_the_unsharded_rows(tiny_model_path, tmp_path):
    """The shard workers' code path (estimate_shard -> Parquet -> ingest_shards), run in
    this process, with a prior on some problems: the rows equal the unsharded filter's."""
    from grpo_core.eval.shards import (
        estimate_shard,
        ingest_shards,
        priors_path,
        read_priors,
        split,
        write_priors,
    )
    from grpo_core.modeling.loading import load_tokenizer, model_fingerprint
    from grpo_core.prompts import resolve_template

    problems = generate_problems("train", 9, seed=4)
    cfg = _real_cfg(True)
    priors = {problem_key(problems[1]): Evidence(0.0, 2.5),
              problem_key(problems[6]): Evidence(1.5, 3.0)}
    with Store.open(tmp_path / "one.duckdb") as store:
        one = run_filter(tiny_model_path, problems, cfg, store=store, priors=priors)
        expected = _shard_rows(store)
    assert one.with_evidence == 2 and len(expected) == 9
    template = resolve_template(cfg.model.template, load_tokenizer(tiny_model_path))
    fp = model_fingerprint(tiny_model_path)
    paths = []
    for i, part in enumerate(split(problems, 2)):
        out = tmp_path / f"shard-{i:03d}.parquet"
        mine = {problem_key(p): priors[problem_key(p)] for p in part if problem_key(p) in priors}
        write_priors(mine, priors_path(out))
        paths.append(estimate_shard(tiny_model_path, cfg.model_dump(mode="json"), template, fp,
                                    part, out, threads=1, priors=read_priors(priors_path(out))))
    with Store.open(tmp_path / "two.duckdb") as store:
        fresh = ingest_shards(store, paths)
        assert _shard_rows(store) == expected  # every column but created_at
        two = run_filter(tiny_model_path, problems, cfg, store=store, fresh=fresh, priors=priors)
    assert (two.estimated, two.reused) == (9, 0) and two.sampled == one.sampled
    assert two.counts == one.counts


# ----------------------------------------------------------------------------- evidence


def test_evidence_rule_and_counts_from_the_rollouts_table():
    problems = generate_problems("train", 3, seed=0)
    a, b, c = problems
    con = duckdb.connect()

    def row(p, acc, completion="x"):
        rewards = {"format": 0.5} if acc is None else {"accuracy": acc, "format": 0.5}
        return {"prompt": "q", "completion": completion, "answer": p.answer,
                "problem_id": p.id, "rewards": rewards, "reward": 1.0, "advantage": 0.0}

    good = f"</think> <answer>{b.answer}</answer>"
    write_rollouts(con, [row(a, 1.0), row(a, 0.0), row(a, 1.0), row(a, 1.0)], "run-1", 1)
    # No accuracy reward recorded (or NaN): the completion is scored again.
    write_rollouts(con, [row(b, None, good), row(b, float("nan"), "no answer")], "run-1", 2)
    write_rollouts(con, [row(c, 1.0)], "run-2", 1)  # another run: not this round's
    counts = rollout_counts(con, "run-1")
    assert counts == {a.id: (3, 4), b.id: (1, 2)}
    priors = priors_from_counts(counts, problems, weight=0.5, k=16)
    assert priors == {problem_key(a): Evidence(1.5, 2.0), problem_key(b): Evidence(0.5, 1.0)}
    capped = priors_from_counts({a.id: (30, 40)}, problems, weight=0.5, k=16)
    assert capped[problem_key(a)] == Evidence(6.0, 8.0)  # at most k/2 pseudo-samples
    assert priors_from_counts(counts, problems, weight=0.0, k=16) == {}
    cfg = _cfg(rollout_evidence_weight=0.5)
    assert rollout_priors(con, "run-1", problems, cfg) == priors
    assert rollout_priors(con, None, problems, cfg) == {}
    assert rollout_priors(con, "run-1", problems, _cfg()) == {}  # weight 0: off
    assert evidence_fingerprint({}) is None
    assert evidence_fingerprint(priors) != evidence_fingerprint(capped)


def test_a_prior_cuts_fresh_samples_and_moves_the_estimate():
    problems = generate_problems("train", 5, seed=0)
    often = next(p for p in problems if p.level == 2)  # 12 of 16 right: too easy
    key = problem_key(often)
    for adaptive_on in (False, True):
        cfg = _cfg(adaptive_on=adaptive_on)
        plain = filter_problems(PatternBackend(problems), problems, "fp", cfg, "r1_zero")
        seen = filter_problems(PatternBackend(problems), problems, "fp", cfg, "r1_zero",
                               priors={key: Evidence(4.0, 4.0)})
        before = next(r for r in plain.estimates if r["problem_id"] == key)
        after = next(r for r in seen.estimates if r["problem_id"] == key)
        assert after["samples"] < before["samples"] and seen.sampled < plain.sampled
        assert after["outcomes"] == before["outcomes"][: after["samples"]]  # still a prefix
        s, n = after["successes"] + 4.0, after["samples"] + 4.0
        assert after["pass_rate"] == pytest.approx(s / n)
        assert (after["wilson_lo"], after["wilson_hi"]) == pytest.approx(wilson_interval(s, n))
        assert (after["prior_successes"], after["prior_samples"]) == (4.0, 4.0)
    # Fixed k=16 with a 4-sample prior draws 12 fresh.
    assert budget(16, Evidence(4.0, 4.0)) == 12


@pytest.mark.integration
def test_a_real_rounds_rollouts_cut_the_next_filters_samples(tiny_model_path, tmp_path):
    """Round 1 trains for real (TRL GRPO, 3 steps) and stores its rollouts; round 2's filter
    under round 1's model draws fewer fresh samples with them as evidence than without,
    fixed-k and adaptive, and the kept sets are compared."""
    from grpo_core.data.records import rollout_sink
    from grpo_core.train.grpo import run_grpo_round

    problems = generate_problems("train", 8, seed=11)
    cfg = _real_cfg(False)
    cfg.grpo.max_steps, cfg.grpo.per_device_train_batch_size, cfg.grpo.num_generations = 3, 16, 4
    cfg.grpo.max_completion_length, cfg.grpo.save_steps = 10, 100
    with Store.open(tmp_path / "s.duckdb") as store:
        sink = rollout_sink(store, run_id="round-1", round=1)
        result = run_grpo_round(tiny_model_path, problems, cfg, tmp_path / "round-1",
                                "r1_zero", rollout_sink=sink)
        sink.flush()
        counts = rollout_counts(store, "round-1")
    assert sum(t for _, t in counts.values()) == 3 * 4 * 4
    model = result.output_dir
    report = {}
    for adaptive_on in (False, True):
        cfg2 = _real_cfg(adaptive_on)
        cfg2.filter.band, cfg2.filter.rollout_evidence_weight = BAND, 0.5
        with Store.open(tmp_path / "s.duckdb") as store:
            priors = rollout_priors(store, "round-1", problems, cfg2)
        assert priors and all(e.samples <= cfg2.filter.k / 2 for e in priors.values())
        without = run_filter(model, problems, cfg2)
        with_ = run_filter(model, problems, cfg2, priors=priors)
        assert with_.sampled < without.sampled, (adaptive_on, with_.sampled, without.sampled)
        kept = {p.id for p in without.kept}, {p.id for p in with_.kept}
        report["adaptive" if adaptive_on else "fixed"] = {
            "sampled": (without.sampled, with_.sampled), "kept": tuple(map(len, kept)),
            "kept_same": kept[0] == kept[1], "counts": (without.counts, with_.counts)}
        # The random model solves nothing: every estimate is too hard, with or without.
        assert kept[0] == kept[1] and with_.counts == without.counts
    print(f"round 2 filter (without, with) rollout evidence: {report}")
