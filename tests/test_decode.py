"""Rows leave the batch as they stop (grpo_core.generation.decode): the same completions as
transformers `generate` over fixed batches, greedy and seeded, with fewer rows computed."""
from __future__ import annotations

import pytest

from grpo_core.data.synthetic import generate_problems
from grpo_core.generation.rollout import HFBackend, SamplingParams
from grpo_core.generation.sampling import sample_seeded
from grpo_core.modeling.loading import load_policy
from grpo_core.prompts import render_prompt, resolve_template, stop_strings

pytest_plugins = ["fixtures_models"]


@pytest.fixture(scope="module")
def proxy(proxy_model_path):
    model, tok = load_policy(proxy_model_path)
    template = resolve_template("auto", tok)
    prompts = [render_prompt(p.problem, template, tok)
               for p in generate_problems("train", 12, seed=5, levels=[1, 2, 3])]
    return model, tok, template, prompts


def _backends(proxy, batch_size=8):
    model, tok, template, _ = proxy
    return [HFBackend(model, tok, batch_size=batch_size, stop_strings=stop_strings(template),
                      drop_finished_rows=drop) for drop in (True, False)]


def _rows_per_forward(model):
    """A list the model's forward appends its batch size to (and the hook's handle)."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    return seen, handle


def test_greedy_completions_equal_generate_with_fewer_rows_computed(proxy):
    model, _, _, prompts = proxy
    dropping, fixed = _backends(proxy)
    params = SamplingParams(temperature=0, max_new_tokens=40)
    seen, handle = _rows_per_forward(model)
    try:
        ours = dropping.sample(prompts, 2, params)
    finally:
        handle.remove()
    theirs = fixed.sample(prompts, 2, params)
    assert ours == theirs  # text, token count and finish reason of every completion
    assert [len(r) for r in ours] == [2] * len(prompts)
    # the rows stopped at different lengths and left: some forward ran fewer than a batch
    assert len({c.num_tokens for r in ours for c in r}) > 1 or min(seen) < max(seen)
    assert min(seen) < 8 and max(seen) == 8


def test_seeded_samples_equal_generate_and_end_at_the_stop(proxy):
    _, _, _, prompts = proxy
    dropping, fixed = _backends(proxy, batch_size=16)
    params = SamplingParams(temperature=1.0, max_new_tokens=40)
    seeds = list(range(len(prompts)))
    ours = sample_seeded(dropping, prompts, 3, params, seeds)
    assert ours == sample_seeded(fixed, prompts, 3, params, seeds)
    lengths = {c.num_tokens for r in ours for c in r}
    assert len(lengths) > 1  # rows did stop at different points
    assert all(c.finish_reason == "stop" or c.num_tokens == 40 for r in ours for c in r)


def test_unseeded_sampling_keeps_shapes_and_is_reproducible(proxy):
    _, _, _, prompts = proxy
    dropping, _ = _backends(proxy)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    a = dropping.sample(prompts[:5], 4, params)
    assert [len(r) for r in a] == [4] * 5
    assert all(0 < c.num_tokens <= 24 for r in a for c in r)
    assert a == dropping.sample(prompts[:5], 4, params)
