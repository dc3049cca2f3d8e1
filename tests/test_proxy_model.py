"""builtin:proxy-qwen2 looks like a real Qwen2.5 checkpoint to the code that loads it:
Qwen2 architecture, bf16 weights, tags of several tokens, ChatML with <|im_end|> as EOS."""
import json
from pathlib import Path

import torch

from grpo_core.modeling.proxy import TAGS

pytest_plugins = ["fixtures_models"]


def test_tags_are_several_tokens_and_template_is_chatml(proxy_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(proxy_model_path)
    for tag in TAGS:
        ids = tok(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) > 1, tag
        assert tok.decode(ids, skip_special_tokens=True) == tag  # ordinary text, never stripped
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id in tok.all_special_ids
    assert tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    from grpo_core.prompts import resolve_template

    assert resolve_template("auto", tok) == "chat"


def test_stored_in_bf16_as_qwen2(proxy_model_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tree = json.loads((Path(proxy_model_path) / "config.json").read_text())
    assert (tree.get("dtype") or tree.get("torch_dtype")) == "bfloat16"
    assert tree["architectures"] == ["Qwen2ForCausalLM"] and tree["model_type"] == "qwen2"
    assert tree["num_key_value_heads"] < tree["num_attention_heads"]  # grouped-query attention
    assert {t.dtype for t in load_file(f"{proxy_model_path}/model.safetensors").values()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(proxy_model_path)
    assert model.dtype == torch.bfloat16  # transformers 5: the stored dtype, as a real Qwen2.5
    assert model.generation_config.eos_token_id == tree["eos_token_id"]


def test_resolved_once_then_reused(tmp_path):
    import time

    from grpo_core.modeling.loading import resolve_model_path

    t0 = time.perf_counter()
    first = resolve_model_path("builtin:proxy-qwen2", tmp_path)
    built = time.perf_counter() - t0
    assert built < 90, f"built in {built:.1f} s"  # ~15 s on 2 idle cores (the warm start)
    stamp = (Path(first) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path("builtin:proxy-qwen2", tmp_path) == first
    assert (Path(first) / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no build leftovers


def test_warm_started_samples_disagree_on_the_format(proxy_model_path):
    """Under both templates, on word problems of GSM8K's length, some samples are in the
    answer format and some are not: GRPO groups have reward variance, so a smoke run's
    GRPO stage has a non-zero advantage to follow (a random model's never do)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.prompts import ANSWER_CLOSE, render_prompt
    from grpo_core.verify.format_rules import is_well_formatted

    tok = AutoTokenizer.from_pretrained(proxy_model_path)
    model = AutoModelForCausalLM.from_pretrained(proxy_model_path, dtype=torch.float32)
    problems = generate_problems("test", 24, seed=7)
    # ~300-character questions, as GSM8K's: three problems run together
    questions = [" ".join(p.problem for p in problems[i:i + 3]) for i in range(0, 24, 3)]
    torch.manual_seed(0)
    for template in ("r1_zero", "chat"):
        batch = tok([render_prompt(q, template, tok) for q in questions for _ in range(4)],
                    return_tensors="pt", padding=True)
        out = model.generate(**batch, do_sample=True, temperature=0.6, max_new_tokens=16,
                             pad_token_id=tok.pad_token_id)
        texts = [tok.decode(row[batch["input_ids"].shape[1]:], skip_special_tokens=True)
                 for row in out]
        cut = [t[:t.index(ANSWER_CLOSE) + len(ANSWER_CLOSE)] if ANSWER_CLOSE in t else t
               for t in texts]
        good = sum(is_well_formatted(t, template == "r1_zero") for t in cut)
        assert 0 < good < len(cut), (template, good, cut[:4])
