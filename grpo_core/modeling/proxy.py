"""`builtin:proxy-qwen2`: a small Qwen2-architecture model that looks like a real
checkpoint to the code that loads it, so a real preset's code paths run on a CPU in
seconds. Its answers are nearly noise; what matters is what it shares with Qwen2.5:

- the architecture (Qwen2ForCausalLM: grouped-query attention, tied embeddings);
- weights stored in bfloat16 (config dtype bfloat16), as every Qwen2.5 checkpoint;
- a byte-level BPE tokenizer in which `<think>`, `</think>`, `<answer>`, `</answer>` are
  each several tokens (true of every real tokenizer, false of builtin:tiny-arith's);
- a ChatML chat template and `<|im_end|>` as a special EOS token, as Qwen's instruct models.

Built offline from a seed and cached under the workspace like tiny-arith. The random
weights get a few seconds of warm start (`warm_start`) on short completions of which half
follow the answer format and half do not, so a group of its samples disagrees on the format
reward. A purely random model's samples all earn the same rewards: every GRPO advantage is
0, and a smoke run could not show that a GRPO stage changes the weights.
"""
from __future__ import annotations

import json
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
    warm_steps: int = 120  # Adam steps of the format warm start (0: the random weights)
    warm_lr: float = 3e-3
    version: int = 2  # bump when the build code changes meaning

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


def warm_pairs(tok, n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, completion) pairs under both templates (R1-Zero and the chat template).
    Every other completion breaks the format (no tags, or no closing think tag), and the
    answers are right only sometimes, so the warm-started model's samples differ."""
    import random

    from grpo_core.data.synthetic import generate_problems
    from grpo_core.prompts import render_prompt

    rng = random.Random(seed)
    problems = generate_problems("train", n, seed=seed + 1)
    out = []
    for i, p in enumerate(problems):
        # Word problems of real benchmarks run to hundreds of characters: lengthen the
        # question with other problems' sentences so the format is learnt at those lengths.
        question = " ".join([q.problem for q in rng.sample(problems, rng.randint(0, 8))] + [p.problem])
        ans = p.answer if rng.random() < 0.5 else str(int(p.answer) + rng.randint(1, 9))
        good = i % 2 == 0
        body = (f" </think> <answer> {ans} </answer>" if good
                else rng.choice([f" The answer is {ans}.", f" <answer> {ans} </answer>"]))
        if i % 4 >= 2:  # chat: the completion opens its own think block, then EOS
            prompt = render_prompt(question, "chat", tok)
            out.append((prompt, ("<think>" + body if good else body.lstrip()) + IM_END))
        else:  # R1-Zero: the prompt ends inside <think>
            out.append((render_prompt(question, "r1_zero"), body))
    return out


def warm_start(model, tok, recipe: ProxyRecipe) -> None:
    """A few seconds of causal-LM steps (fp32, before the cast to bf16) on `warm_pairs`,
    the loss on completion tokens only (learning to copy the prompt would teach nothing)."""
    import torch

    if recipe.warm_steps <= 0:
        return
    pairs = warm_pairs(tok, 256, recipe.seed)
    rows = []
    for prompt, completion in pairs:
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tok(completion, add_special_tokens=False)["input_ids"]
        rows.append((p_ids + c_ids, [-100] * len(p_ids) + c_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.warm_lr)
    gen = torch.Generator().manual_seed(recipe.seed)
    model.train()
    for _ in range(recipe.warm_steps):
        batch = [rows[i] for i in torch.randint(len(rows), (16,), generator=gen).tolist()]
        width = max(len(ids) for ids, _ in batch)
        pad = tok.pad_token_id  # left padding, as the pipeline samples
        ids = torch.tensor([[pad] * (width - len(i)) + i for i, _ in batch])
        labels = torch.tensor([[-100] * (width - len(lab)) + lab for _, lab in batch])
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def build_proxy_qwen2(out_dir: str | Path, recipe: ProxyRecipe = ProxyRecipe()) -> Path:
    """Build and save the proxy (tokenizer + bf16 weights) to out_dir; seconds."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.data.synthetic import generate_problems

    torch.manual_seed(recipe.seed)
    texts = [p.problem + " " + p.solution for p in generate_problems("train", 100, seed=recipe.seed)]
    tok = build_proxy_tokenizer(texts, recipe.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    warm_start(model, tok, recipe)
    model = model.to(torch.bfloat16)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "builtin.json").write_text(json.dumps({"recipe": asdict(recipe)}, indent=2) + "\n")
    return out


# The built-in proxies by name. -hd32: attention heads of 32 (2 heads, 1 KV head), the
# smallest vLLM's CPU attention takes (grpo_core.generation.vllm_cpu): the vLLM tests' model.
PROXIES = {PROXY_NAME: ProxyRecipe(), f"{PROXY_NAME}-hd32": ProxyRecipe(num_heads=2, num_kv_heads=1)}


def proxy_recipe(name: str) -> ProxyRecipe | None:
    """The recipe of built-in proxy `name` (with or without "builtin:"), None for another."""
    return PROXIES.get(name.removeprefix("builtin:"))


def proxy_dir(cache_root: str | Path, recipe: ProxyRecipe = ProxyRecipe()) -> Path:
    """Where the proxy of `recipe` is cached, built or not."""
    name = next((n for n, r in PROXIES.items() if r == recipe), PROXY_NAME)
    return Path(cache_root) / f"{name}-{recipe.key()}"


def ensure_proxy(cache_root: str | Path, recipe: ProxyRecipe = ProxyRecipe()) -> Path:
    """Path of the cached proxy, building it once (atomically) if absent."""
    from grpo_core.modeling.tiny import build_once

    return build_once(proxy_dir(cache_root, recipe), lambda tmp: build_proxy_qwen2(tmp, recipe))
