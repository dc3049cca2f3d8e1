"""One stopping rule: filter/eval sampling (hf backend) and GRPO rollouts (TRL) end at the
template's closing tag </answer>, which is several tokens in a real tokenizer (and in
builtin:proxy-qwen2's). The proxy's output is near noise, so it is forced: a logits
processor, put on model.generate, spells a fixed text per row and then junk forever. The
rule must cut every row, on its own, right after its first </answer>."""
import pytest
import torch

from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.generation.rollout import HFBackend, SamplingParams, stop_token_ids, text_stops

pytest_plugins = ["fixtures_models"]

JUNK = " junk"
# A marker in the prompt picks the row's forced text: rows of one batch end at different steps.
FORCED = {"alpha": " 2 + 3 = 5 </think> <answer>5</answer>",
          "beta": " so it is 12345 </think> <answer>12345</answer>"}


def force_output(model, tok, default: str = FORCED["alpha"]) -> list[int]:
    """model.generate emits, per row, the FORCED text whose marker its prompt holds (else
    `default`), then JUNK without end: whatever stops a row, stops it early. Returns the
    list each call's number of generated steps is appended to."""
    from transformers import LogitsProcessor, LogitsProcessorList

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    junk = ids(JUNK)
    generate = model.generate

    def forced_generate(*args, **kw):
        prompt = kw.get("input_ids", args[0] if args else None)
        plen = prompt.shape[1]
        rows = []
        for text in tok.batch_decode(prompt, skip_special_tokens=True):
            target = next((t for m, t in FORCED.items() if m in text), default)
            rows.append(ids(target) + junk * 200)

        class Force(LogitsProcessor):
            def __call__(self, input_ids, scores):
                step = input_ids.shape[1] - plen
                out = torch.full_like(scores, float("-inf"))
                for r, seq in enumerate(rows):
                    out[r, seq[step]] = 0.0
                return out

        kw["logits_processor"] = LogitsProcessorList([*(kw.get("logits_processor") or []), Force()])
        out = generate(*args, **kw)
        steps.append(out.shape[1] - plen)
        return out

    steps: list[int] = []
    model.generate = forced_generate
    return steps


@pytest.fixture
def proxy_backend(proxy_model_path):
    from grpo_core.generation.sampling import build_backend

    # the forcing patches model.generate: the fixed-batch path calls it (tests/test_decode.py
    # shows the default path, rows leaving the batch, gives generate's completions)
    cfg = config_from_dict({"model": {"template": "chat"},
                            "rollout": {"backend": "hf", "batch_size": 8, "drop_finished_rows": False}})
    backend, tok = build_backend(proxy_model_path, cfg)
    force_output(backend.model, tok)
    return backend, tok


def _prompts(tok):
    from grpo_core.prompts import render_prompt

    # different lengths (left padding) and different forced texts in one batch
    return [render_prompt("alpha: what is 2 + 3?", "chat", tok),
            render_prompt("beta: what is 12000 + 345, written out at some length?", "chat", tok)]


def _check(completions, tok, prompts):
    for prompt, row in zip(prompts, completions):
        want = FORCED["beta" if "beta:" in prompt else "alpha"]
        for c in row:
            assert c.text == want, c.text
            assert c.finish_reason == "stop" and not c.truncated
            assert c.num_tokens == len(tok(want, add_special_tokens=False)["input_ids"])


def test_proxy_close_tag_is_a_text_stop(proxy_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(proxy_model_path)
    assert text_stops(tok) == ("</answer>",) and stop_token_ids(tok) == [tok.eos_token_id]


def test_single_token_tag_keeps_the_token_stop(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)  # builtin-style tokenizer: one token
    assert stop_token_ids(tok) == [tok.eos_token_id, tok.convert_tokens_to_ids("</answer>")]
    assert text_stops(tok) == ()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_sample_stops_at_multi_token_close_tag(proxy_backend, temperature):
    backend, tok = proxy_backend
    prompts = _prompts(tok)
    out = backend.sample(prompts, 3, SamplingParams(temperature=temperature, max_new_tokens=48))
    _check(out, tok, prompts)


def test_seeded_filter_and_eval_sampling_stop_at_close_tag(proxy_backend):
    from grpo_core.generation.sampling import sample_seeded

    backend, tok = proxy_backend
    prompts = _prompts(tok)
    out = sample_seeded(backend, prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=48), [7, 8])
    _check(out, tok, prompts)


def test_without_the_stop_the_forced_junk_runs_on(proxy_model_path):
    """The control: the forcing does run past </answer>, so the tests above see the rule cut."""
    from grpo_core.modeling.loading import load_policy

    model, tok = load_policy(proxy_model_path)
    force_output(model, tok)
    backend = HFBackend(model, tok, stop_strings=(), drop_finished_rows=False)
    [[c]] = backend.sample(_prompts(tok)[:1], 1, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert c.text.startswith(FORCED["alpha"] + JUNK) and c.finish_reason == "length"


def test_grpo_rollouts_stop_at_multi_token_close_tag(proxy_model_path, tmp_path, monkeypatch):
    """One real TRL step on the proxy: the completions TRL scores end at </answer>, and
    count as terminated (eos appended), not clipped."""
    from transformers import AutoTokenizer

    from grpo_core.train import grpo

    load = grpo.load_for_training
    calls: list[list[int]] = []  # per round: generated steps per generate call

    def forced_load(path):
        model, dtype = load(path)
        calls.append(force_output(model, AutoTokenizer.from_pretrained(path)))
        return model, dtype

    monkeypatch.setattr(grpo, "load_for_training", forced_load)
    rows = []
    cfg = config_from_dict({
        "grpo": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2, "learning_rate": 1e-6,
                 "max_completion_length": 40, "save_steps": 10, "logging_steps": 1},
        "rewards": {"funcs": ["accuracy", "format"]}})
    problems = generate_problems("train", 2, levels=[1])
    tok = AutoTokenizer.from_pretrained(proxy_model_path)
    want = len(tok(FORCED["alpha"], add_special_tokens=False)["input_ids"]) + 1
    for template in ("chat", "r1_zero"):
        rows.clear()
        result = grpo.run_grpo_round(proxy_model_path, problems, cfg, tmp_path / template, template,
                                     rollout_sink=lambda step, batch: rows.extend(batch))
        assert result.steps == 1 and len(rows) == 4
        for row in rows:
            assert row["completion"] == FORCED["alpha"], row["completion"]
        logged = result.history[-1]
        assert logged["completions/clipped_ratio"] == 0.0  # ended by the stop, not the length
        assert logged["completions/max_length"] == want  # the forced text and the added eos
        assert calls[-1] == [want - 1]  # generation itself stopped there, not at 40 tokens
