"""The one completion decoder (rollout.finish, used by hf sampling seeded or not) and the
vLLM request/output translation shared by both vLLM paths, without a model or a GPU."""
from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from grpo_core.generation.rollout import (
    SamplingParams,
    VLLMBackend,
    finish,
    stop_index,
    vllm_completions,
)
from grpo_core.generation.sampling import sample_seeded

CLOSE = "</a>"


class CharTokenizer:
    """One character per token (id = code point); ids below 32 are special tokens that
    decode to nothing with skip_special_tokens. `pad` and `eos` are set per test."""

    def __init__(self, eos: int, pad: int):
        self.eos_token_id, self.pad_token_id = eos, pad

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i < 32))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


EOS, PAD = 2, 0


@pytest.mark.parametrize("pad", [EOS, PAD], ids=["pad==eos", "pad!=eos"])
def test_row_ended_by_eos_keeps_its_tokens_and_drops_the_padding(pad):
    tok = CharTokenizer(eos=EOS, pad=pad)
    c = finish(tok, ids("x = 5") + [EOS, pad, pad, pad], [EOS], (CLOSE,))
    assert (c.text, c.num_tokens, c.finish_reason) == ("x = 5", 6, "stop")  # 5 tokens + eos


@pytest.mark.parametrize("pad", [EOS, PAD], ids=["pad==eos", "pad!=eos"])
def test_row_ended_by_a_stop_string_drops_the_padding(pad):
    tok = CharTokenizer(eos=EOS, pad=pad)
    want = "so 5 <a>5" + CLOSE
    c = finish(tok, ids(want) + [pad] * 4, [EOS], (CLOSE,))
    assert (c.text, c.num_tokens, c.finish_reason) == (want, len(want), "stop")


@pytest.mark.parametrize("pad", [EOS, PAD], ids=["pad==eos", "pad!=eos"])
def test_row_cut_by_length_keeps_every_token(pad):
    tok = CharTokenizer(eos=EOS, pad=pad)
    row = ids("no end in sight")
    c = finish(tok, row, [EOS], (CLOSE,))
    assert (c.text, c.num_tokens, c.finish_reason) == ("no end in sight", len(row), "length")
    assert c.truncated


def test_text_past_the_stop_string_is_cut():
    tok = CharTokenizer(eos=EOS, pad=EOS)
    c = finish(tok, ids("<a>7" + CLOSE + " junk") + [EOS], [EOS], (CLOSE,))
    assert (c.text, c.num_tokens, c.finish_reason) == ("<a>7" + CLOSE, 8, "stop")
    assert stop_index(tok, ids("ab" + CLOSE + "cd"), (CLOSE,)) == 6
    assert stop_index(tok, ids("abcd"), (CLOSE,)) is None


@pytest.fixture
def fake_vllm(monkeypatch):
    """A vllm module whose SamplingParams records its arguments, and an engine double."""
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)
    calls = []

    def generate(prompts, sps, use_tqdm):
        calls.append(sps)
        return [SimpleNamespace(outputs=[SimpleNamespace(text=f"{p}{CLOSE}", token_ids=[1, 2, 3],
                                                         finish_reason="stop"),
                                         SimpleNamespace(text=p, token_ids=[1] * 8,
                                                         finish_reason="length")])
                for p in prompts]

    backend = VLLMBackend.__new__(VLLMBackend)  # skip __init__: it builds a real engine
    backend.llm = SimpleNamespace(generate=generate)
    backend._stop, backend.stop_strings = [EOS], [CLOSE]
    return backend, calls


def test_vllm_paths_share_params_and_decoding(fake_vllm):
    backend, calls = fake_vllm
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=3)
    plain = backend.sample(["p", "q"], 2, params)
    seeded = sample_seeded(backend, ["p", "q"], 2, params, [5, 2**31 + 6])
    assert plain == seeded
    assert [[(c.text, c.num_tokens, c.finish_reason) for c in row] for row in plain] == \
        [[("p" + CLOSE, 3, "stop"), ("p", 8, "length")], [("q" + CLOSE, 3, "stop"), ("q", 8, "length")]]
    common = {"n": 2, "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stop_token_ids": [EOS],
              "stop": [CLOSE], "include_stop_str_in_output": True}
    assert calls[0] == {**common, "seed": 3}  # one request for every prompt
    assert calls[1] == [{**common, "seed": 5}, {**common, "seed": 6}]  # one per prompt, 31-bit
    assert vllm_completions([]) == []
