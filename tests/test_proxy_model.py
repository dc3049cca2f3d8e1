"""builtin:proxy-qwen2 looks like a real Qwen2.5 checkpoint to the code that loads it:
Qwen2 architecture, bf16 weights, tags of several tokens, ChatML with <|im_end|> as EOS."""
import json
from pathlib import Path

import torch

from grpo_core.proxy_model import TAGS

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

    from grpo_core.models import resolve_model_path

    t0 = time.perf_counter()
    first = resolve_model_path("builtin:proxy-qwen2", tmp_path)
    built = time.perf_counter() - t0
    assert built < 30, f"built in {built:.1f} s"
    stamp = (Path(first) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path("builtin:proxy-qwen2", tmp_path) == first
    assert (Path(first) / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no build leftovers
