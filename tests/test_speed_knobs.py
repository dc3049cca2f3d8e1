"""CPU speed and memory knobs: TRL's fused log-prob head at the pipeline's tile gives the
full-vocabulary log-probs and gradients, the memory plan follows the tile, and the torch
thread count is measured when $GRPO_TORCH_THREADS is unset."""
from __future__ import annotations

import pytest
import torch

from grpo_core.config import config_from_dict
from grpo_core.modeling import threads
from grpo_core.modeling.memory_plan import logprob_tile, memory_plan
from grpo_core.train.trainer_internals import logprob_tile as current_tile
from grpo_core.train.trainer_internals import set_logprob_tile

pytest_plugins = ["fixtures_models"]


@pytest.fixture
def restore_tile():
    before = current_tile()
    yield
    set_logprob_tile(*before)


def _fused_and_full(model_path, tile):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head  # public: TRL's documented helper

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (3, 11))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt part, not scored
    # full: batch x sequence x vocabulary logits at once
    logits = model(input_ids=ids).logits[:, :-1]
    full = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    full = full.masked_fill(labels[:, 1:] == -100, 0.0)
    full_grad = torch.autograd.grad(full.sum(), model.lm_head.weight)[0]
    set_logprob_tile(*tile)
    add_fused_lm_head(model)
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    fused_grad = torch.autograd.grad(out.log_probs.sum(), model.lm_head.weight)[0]
    return full, full_grad, out.log_probs, fused_grad


@pytest.mark.parametrize("tile", [(5, 64), (512, 8192), (4096, 32768)])
def test_chunked_logprobs_equal_the_full_vocabulary_ones(tiny_model_path, restore_tile, tile):
    full, full_grad, fused, fused_grad = _fused_and_full(tiny_model_path, tile)
    assert fused.shape == full.shape
    torch.testing.assert_close(fused, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_grad, full_grad, rtol=1e-4, atol=1e-6)


def test_the_tile_is_set_and_read_back(restore_tile):
    set_logprob_tile(7, 130)
    assert current_tile() == (7, 130)


def test_cpu_tile_is_smaller_and_the_plan_follows_it():
    cfg = config_from_dict({"model": {"name_or_path": "builtin:proxy-qwen2"}})
    assert logprob_tile(cfg, cpu=False) == (4096, 32768)  # TRL's own on GPU
    assert logprob_tile(cfg, cpu=True) == (512, 8192)
    small = config_from_dict({"model": {"name_or_path": "Qwen/Qwen2.5-0.5B"},
                              "grpo": {"per_device_train_batch_size": 32, "num_generations": 8}})
    big = config_from_dict({"model": {"name_or_path": "Qwen/Qwen2.5-0.5B"},
                            "grpo": {"per_device_train_batch_size": 32, "num_generations": 8},
                            "train": {"logprob_chunk_tokens": 4096, "logprob_chunk_vocab": 32768}})
    assert logprob_tile(big, cpu=True) == (4096, 32768)
    a = memory_plan(small, device="cpu")["bytes"]["logprob_chunk"]
    b = memory_plan(big, device="cpu")["bytes"]["logprob_chunk"]
    assert b > 10 * a and b > 4e9  # TRL's tile on CPU: ~4.4 GB of backward temporaries


def test_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv(threads.ENV, "1")
    monkeypatch.setattr(threads, "choose_threads", lambda *a: pytest.fail("measured"))
    assert threads.configure_threads() == 1 == torch.get_num_threads()


def test_threads_measured_once_when_unset(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv(threads.ENV, raising=False)
    monkeypatch.setattr(threads, "_chosen", None)
    calls = []
    real = threads.choose_threads
    monkeypatch.setattr(threads, "choose_threads",
                        lambda *a: calls.append(1) or real(*a))
    try:
        n = threads.configure_threads()
        assert n in threads.candidates(len(__import__("os").sched_getaffinity(0)))
        assert torch.get_num_threads() == n
        assert threads.configure_threads() == n and calls == [1]  # once per process
    finally:
        torch.set_num_threads(before)


def test_thread_candidates():
    assert threads.candidates(1) == [1]
    assert threads.candidates(2) == [1, 2]
    assert threads.candidates(6) == [1, 2, 4, 6]
    best, times = threads.choose_threads(2)
    assert best in (1, 2) and set(times) == {1, 2} and all(t > 0 for t in times.values())


def test_sft_trains_at_the_configured_tile_whatever_an_earlier_stage_left(
        tiny_model_path, tmp_path, restore_tile):
    """The main job's order bug: a GRPO round set TRL's tile for the process and never put it
    back, so an SFT run after another recipe's rounds trained at their tile (the head's float
    sums in another order: weights different in the last bits, and every stage after SFT
    with them). Each trainer now sets the configured tile for its train() alone: the same
    SFT after two different leftover tiles saves the same weights, and the tile left before
    it is there again after it."""
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.modeling.loading import model_fingerprint
    from grpo_core.train.sft import run_sft

    cfg = config_from_dict({"sft": {"max_steps": 2, "per_device_train_batch_size": 4,
                                    "learning_rate": 1e-3}})
    saved = []
    for left in ((7, 130), (4096, 32768)):
        set_logprob_tile(*left)
        out = run_sft(tiny_model_path, generate_problems("train", 8), cfg,
                      tmp_path / f"sft-{left[0]}", "r1_zero")
        assert current_tile() == left
        saved.append(model_fingerprint(out.output_dir))
    assert saved[0] == saved[1]
