"""Difficulty filter: band counts, stored estimates reused, seeds per problem."""
from __future__ import annotations

import os

import duckdb
import pytest

from grpo_core.config import PipelineConfig
from grpo_core.data.records import read_pass_rates, read_rollouts, rollout_sink
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.difficulty import (
    estimate_pass_rates,
    filter_problems,
    problem_seed,
    run_filter,
    sampling_key,
)
from grpo_core.eval.passrate import wilson_interval
from grpo_core.generation.rollout import Completion, HFBackend, SamplingParams
from grpo_core.generation.sampling import sample_seeded
from grpo_core.prompts import render_prompt

os.environ.setdefault("GRPO_TORCH_THREADS", "1")
pytest_plugins = ["fixtures_models"]  # tiny_model_path

SUCCESSES = {1: 8, 2: 6, 3: 4, 4: 2, 5: 0}  # of k=8, per level


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


class FakeBackend:
    """Answers problem p correctly in the first SUCCESSES[level] of its samples."""

    def __init__(self, problems, template="r1_zero"):
        self.by_prompt = {render_prompt(p.problem, template): p for p in problems}
        self.calls = 0
        self.seeds = []

    def sample(self, prompts, n, params):
        self.calls += 1
        self.seeds.append(params.seed)
        out = []
        for prompt in prompts:
            p = self.by_prompt[prompt]
            ok = SUCCESSES[p.level]
            out.append([Completion(f"x</think> <answer>{p.answer if j < ok else -1}</answer>",
                                   5, "stop" if j % 2 else "length") for j in range(n)])
        return out


def _cfg(**kw) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.filter.k = kw.pop("k", 8)
    cfg.rollout.max_new_tokens = kw.pop("max_new_tokens", 16)
    for name, value in kw.items():
        setattr(cfg.filter, name, value)
    return cfg


def _problems(n=10, seed=0):
    return generate_problems("train", n, seed=seed)  # levels cycle 1..5


def test_band_counts_histogram_and_wilson():
    problems = _problems(10)
    fake = FakeBackend(problems)
    report = filter_problems(fake, problems, "fp", _cfg(), "r1_zero")
    assert report.counts == {"too_easy": 4, "in_band": 2, "too_hard": 4}
    assert [p.level for p in report.kept] == [3, 3]
    assert report.histogram["counts"] == [2, 0, 2, 0, 2, 0, 2, 0, 2]
    assert (report.estimated, report.reused, report.considered) == (10, 0, 10)
    for row, p in zip(report.estimates, problems):
        assert row["successes"] == SUCCESSES[p.level] and row["k"] == 8
        assert (row["wilson_lo"], row["wilson_hi"]) == wilson_interval(row["successes"], 8)
        assert row["truncated"] == 4  # even-numbered samples end by length
    wide = filter_problems(fake, problems, "fp", _cfg(band=(0.2, 0.8)), "r1_zero")
    assert wide.counts == {"too_easy": 2, "in_band": 6, "too_hard": 2}
    text = report.text_histogram(width=10)
    assert text.count("\n") == 8 and "0.500 | ##########     2 kept" in text


def test_stored_estimates_are_reused_not_resampled(tmp_path):
    problems = _problems(10)
    cfg = _cfg()
    with Store.open(tmp_path / "s.duckdb") as store:
        first = FakeBackend(problems)
        r1 = filter_problems(first, problems, "fp", cfg, "r1_zero", con=store)
        assert first.calls == 10 and (r1.estimated, r1.reused) == (10, 0)
        second = FakeBackend(problems)
        r2 = filter_problems(second, problems, "fp", cfg, "r1_zero", con=store)
        assert second.calls == 0 and (r2.estimated, r2.reused) == (0, 10)
        assert r2.counts == r1.counts and [p.id for p in r2.kept] == [p.id for p in r1.kept]
        stored = read_pass_rates(store, "fp", sampling_key(cfg, "r1_zero"))
        assert len(stored) == 10 and {r["model_fingerprint"] for r in stored} == {"fp"}

        # A lazily built backend is not even built when everything is stored.
        def boom():
            raise AssertionError("backend built although every estimate was stored")

        assert filter_problems(boom, problems, "fp", cfg, "r1_zero", con=store).reused == 10

        # Anything the estimate depends on re-samples: weights, k, temperature, gold, seed.
        for change in ({"model_fp": "other"}, {"k": 4}, {"temperature": 0.7}, {"seed": 1}):
            fake = FakeBackend(problems)
            c = _cfg(k=change.get("k", 8), **({"temperature": change["temperature"]}
                                               if "temperature" in change else {}))
            c.project.seed = change.get("seed", 0)
            r = filter_problems(fake, problems, change.get("model_fp", "fp"), c, "r1_zero",
                                con=store)
            assert r.estimated == 10 and fake.calls == 10, change
        edited = list(problems)
        edited[0] = type(problems[0])(**{**problems[0].to_row(), "answer": "12345",
                                         "fingerprint": ""})
        fake = FakeBackend(edited)
        r = filter_problems(fake, edited, "fp", cfg, "r1_zero", con=store)
        assert (r.estimated, r.reused, fake.calls) == (1, 9, 1)


def test_killed_filter_resumes_from_written_chunks():
    problems = _problems(10)
    con = duckdb.connect()

    class Dies(FakeBackend):
        def sample(self, prompts, n, params):
            if self.calls == 6:
                raise KeyboardInterrupt
            return super().sample(prompts, n, params)

    with pytest.raises(KeyboardInterrupt):
        estimate_pass_rates(Dies(problems), problems, "fp", _cfg(), "r1_zero", con=con,
                            chunk_problems=3)
    assert len(read_pass_rates(con)) == 6  # two whole chunks landed
    fake = FakeBackend(problems)
    rows = estimate_pass_rates(fake, problems, "fp", _cfg(), "r1_zero", con=con)
    assert fake.calls == 4 and sum(r["reused"] for r in rows) == 6


def test_seeds_are_per_problem_and_deterministic():
    problems = _problems(10)
    fake = FakeBackend(problems)
    filter_problems(fake, problems, "fp", _cfg(), "r1_zero")
    expected = [problem_seed(0, p) for p in problems]
    assert fake.seeds == expected
    fake2 = FakeBackend(problems)
    filter_problems(fake2, problems[::-1], "fp", _cfg(), "r1_zero")
    assert fake2.seeds == expected[::-1]  # the seed follows the problem, not its position
    assert problem_seed(1, problems[0]) != problem_seed(0, problems[0])


def test_max_problems_subsamples_with_the_seed():
    problems = _problems(20)
    a = filter_problems(FakeBackend(problems), problems, "fp", _cfg(max_problems=7), "r1_zero")
    b = filter_problems(FakeBackend(problems), problems, "fp", _cfg(max_problems=7), "r1_zero")
    assert a.considered == 7 and [r["problem_id"] for r in a.estimates] == \
        [r["problem_id"] for r in b.estimates]
    ids = [p.id for p in problems]
    assert sorted(ids.index(r["problem_id"]) for r in a.estimates) == \
        [ids.index(r["problem_id"]) for r in a.estimates]  # original order kept


def _hf(path, batch_size):
    from grpo_core.modeling.loading import load_policy

    model, tok = load_policy(path)
    return HFBackend(model, tok, batch_size=batch_size)


def test_hf_samples_do_not_depend_on_batch_composition(tiny_model_path):
    problems = _problems(6)
    prompts = [render_prompt(p.problem, "r1_zero") for p in problems]
    seeds = [problem_seed(0, p) for p in problems]
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12)
    whole = sample_seeded(_hf(tiny_model_path, 64), prompts, 3, params, seeds)
    small = _hf(tiny_model_path, 4)
    shards = (sample_seeded(small, prompts[:2], 3, params, seeds[:2])
              + sample_seeded(small, prompts[2:][::-1], 3, params, seeds[2:][::-1])[::-1])
    texts = [[c.text for c in cs] for cs in whole]
    assert texts == [[c.text for c in cs] for cs in shards]
    assert all(len(set(t)) > 1 for t in texts)  # samples of one prompt differ
    other = sample_seeded(small, prompts, 3, params, [s + 1 for s in seeds])
    assert [[c.text for c in cs] for cs in other] != texts


def test_hf_filter_generates_once_then_reuses(tiny_model_path, tmp_path):
    problems = _problems(6)
    cfg = _cfg(k=3)
    backend = _hf(tiny_model_path, 64)
    calls = []
    generate = backend.generate_batch  # every batch, rows leaving it or fixed
    backend.generate_batch = lambda *a, **kw: calls.append(1) or generate(*a, **kw)
    con = duckdb.connect(str(tmp_path / "pr.duckdb"))
    first = estimate_pass_rates(backend, problems, "fp", cfg, "r1_zero", backend.tokenizer, con)
    assert calls and not any(r["reused"] for r in first)
    n = len(calls)
    second = estimate_pass_rates(backend, problems, "fp", cfg, "r1_zero", backend.tokenizer, con)
    assert len(calls) == n and all(r["reused"] for r in second)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("reused", "created_at")}
                          for r in rows]
    assert strip(first) == strip(second)
    # The same estimates sampled again, in shards, without the store: identical.
    shards = (estimate_pass_rates(_hf(tiny_model_path, 2), problems[:4], "fp", cfg, "r1_zero")
              + estimate_pass_rates(backend, problems[4:], "fp", cfg, "r1_zero"))
    assert strip(shards) == strip(first)


def test_run_filter_loads_the_model_only_when_needed(tiny_model_path, tmp_path, monkeypatch):
    from grpo_core.generation import sampling

    problems = _problems(4)
    cfg = _cfg(k=2)
    cfg.rollout.backend = "hf"
    built = []
    real = sampling.build_backend
    monkeypatch.setattr(sampling, "build_backend",
                        lambda *a, **kw: built.append(1) or real(*a, **kw))
    with Store.open(tmp_path / "s.duckdb") as store:
        r1 = run_filter(tiny_model_path, problems, cfg, store=store)
        r2 = run_filter(tiny_model_path, problems, cfg, store=store)
    assert len(built) == 1 and r1.estimated == 4 and r2.reused == 4
    assert r1.model_fingerprint == r2.model_fingerprint != ""


def test_rollouts_roundtrip():
    con = duckdb.connect()
    sink = rollout_sink(con, "run1", round=2)
    sink(3, [{"prompt": "p", "completion": "c", "answer": 5, "problem_id": "a",
              "rewards": {"accuracy": 1.0, "format": -0.5}, "reward": 0.5, "advantage": 1.2},
             {"prompt": "p", "completion": "d", "answer": None, "problem_id": "a",
              "rewards": {}, "reward": 0.0, "advantage": None}])
    assert read_rollouts(con, "run1") == []  # buffered until the checkpoint / end flush
    assert sink.flush() == 2 and sink.flush() == 0
    rows = read_rollouts(con, "run1")
    assert [(r["round"], r["step"], r["idx"]) for r in rows] == [(2, 3, 0), (2, 3, 1)]
    assert rows[0]["rewards"] == {"accuracy": 1.0, "format": -0.5} and rows[0]["answer"] == "5"
    assert read_rollouts(duckdb.connect()) == []  # no table yet: nothing, not an error


@pytest.mark.slow
def test_builtin_pass_rate_falls_with_level(tmp_path):
    """Acceptance (issue 3): on the trained built-in model the estimated pass rate falls as
    the level rises (negative Spearman correlation between level and pass rate)."""
    from grpo_core.eval.passrate import spearman
    from grpo_core.modeling.loading import resolve_model_path

    path = resolve_model_path("builtin:tiny-arith", tmp_path / "models")
    problems = _problems(200, seed=1)  # 40 per level: a base model's rates are low
    cfg = _cfg(k=8, max_new_tokens=64)
    cfg.rollout.backend = "hf"
    report = run_filter(path, problems, cfg)
    levels = [r["level"] for r in report.estimates]
    rates = [r["pass_rate"] for r in report.estimates]
    rho = spearman(levels, rates)
    by_level = {lv: sum(r for l2, r in zip(levels, rates) if l2 == lv) / levels.count(lv)
                for lv in sorted(set(levels))}
    print(f"spearman(level, pass rate) = {rho:.3f}; mean pass rate by level {by_level}")
    assert rho < 0, by_level
