"""`builtin:proxy-qwen2`: a small *randomly initialised* Qwen2-architecture model that
looks like a real checkpoint to the code that loads it, so a real preset's code paths run
on a CPU in seconds. Its answers are noise; what matters is what it shares with Qwen2.5:

- the architecture (Qwen2ForCausalLM: grouped-query attention, tied embeddings);
- weights stored in bfloat16 (config dtype bfloat16), as every Qwen2.5 checkpoint;
- a byte-level BPE tokenizer in which `<think>`, `</think>`, `<answer>`, `</answer>` are
  each several tokens (true of every real tokenizer, false of builtin:tiny-arith's);
- a ChatML chat template and `<|im_end|>` as a special EOS token, as Qwen's instruct models.

Built offline from a seed (no training) and cached under the workspace like tiny-arith.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_core.prompts import CHAT_SYSTEM_PROMPT, R1_ZERO_TEMPLATE

PROXY_NAME = "proxy-qwen2"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"  # Qwen's names

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


@dataclass(frozen=True)
class ProxyRecipe:
    """Everything that determines the built proxy; its hash names the cache folder."""

    seed: int = 0
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 400  # BPE merges; the special tokens come on top
    max_position_embeddings: int = 2048
    version: int = 1  # bump when the build code changes meaning

    def key(self) -> str:
        import hashlib

        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


def build_proxy_tokenizer(texts: list[str], vocab_size: int = 400):
    """Byte-level BPE (GPT-2 pre-tokenisation, as Qwen's) trained on `texts`, with no
    added tag tokens: `</answer>` splits as `</` `answer` `>` or finer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts + [R1_ZERO_TEMPLATE, CHAT_SYSTEM_PROMPT] * 5, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                   padding_side="left")
    fast.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    fast.chat_template = CHATML
    for tag in TAGS:  # the point of the proxy: a stop rule must cope with this
        n = len(fast(tag, add_special_tokens=False)["input_ids"])
        assert n > 1, f"{tag} is a single token in the proxy tokenizer"
    return fast


def build_proxy_qwen2(out_dir: str | Path, recipe: ProxyRecipe = ProxyRecipe()) -> Path:
    """Build and save the proxy (tokenizer + bf16 weights) to out_dir; ~1 s."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.synthetic import generate_problems

    torch.manual_seed(recipe.seed)
    texts = [p.problem + " " + p.solution for p in generate_problems("train", 100, seed=recipe.seed)]
    tok = build_proxy_tokenizer(texts, recipe.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "builtin.json").write_text(json.dumps({"recipe": asdict(recipe)}, indent=2) + "\n")
    return out


def ensure_proxy(cache_root: str | Path, recipe: ProxyRecipe = ProxyRecipe()) -> Path:
    """Path of the cached proxy, building it once (atomically) if absent."""
    final = Path(cache_root) / f"{PROXY_NAME}-{recipe.key()}"
    if (final / "builtin.json").is_file():
        return final
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build_proxy_qwen2(tmp, recipe)
    try:
        tmp.rename(final)  # a concurrent builder may have won: keep theirs
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
