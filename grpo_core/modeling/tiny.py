"""`builtin:tiny-arith`: a small Llama-style *base* model built offline, in-process.

It is pretrained briefly on plain arithmetic text (sums written out, sometimes with a
\\boxed{} answer, as math web text has) so that it continues text, has never seen the
<think>/<answer> format, and solves some problems but not most.

Its weights ship with the package (`grpo_core/builtin_models/tiny-arith`, 0.8 MB), and
`builtin:tiny-arith` loads them: pretraining is deterministic on one machine, but another
CPU (other float kernels: AVX2 vs AVX-512, MKL vs OpenBLAS, thread count) gives another
model, and the demo's numbers must not depend on the machine. `grpo model build` rebuilds
from the recipe (~2 min on 2 cores) and says whether the weights equal the shipped ones;
a recipe without shipped weights is built and cached under the workspace, keyed by it.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_core.data.synthetic import arithmetic_facts, generate_problems
from grpo_core.progress import Bar
from grpo_core.prompts import CHAT_SYSTEM_PROMPT, R1_ZERO_TEMPLATE

BUILTIN_PREFIX = "builtin:"
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "builtin_models" / "tiny-arith"
REASONING_TAGS = ["<think>", "</think>", "<answer>", "</answer>"]


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the built model; its hash names the cache folder."""

    seed: int = 0
    hidden_size: int = 64
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 192
    vocab_size: int = 512
    pretrain_steps: int = 900
    batch_size: int = 16  # packed rows per step
    seq_len: int = 160  # longer than the R1-Zero prompt (~115 tokens) plus an answer
    learning_rate: float = 3e-3
    corpus_problems: int = 3000
    corpus_levels: tuple[int, ...] = (1, 2, 3, 4, 5)
    fact_repeats: int = 6
    two_digit_facts: int = 600
    max_filler: int = 3
    chat_share: float = 0.3  # share of problems as a chat transcript after filler text
    version: int = 2  # bump when the build code changes meaning

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


# Generic lead-in sentences, as transcripts on the web have: the model learns to find the
# question after a long preamble (the R1-Zero prompt is ~90 tokens), not the template.
FILLER = [
    "The following is a conversation with a patient tutor.",
    "A chat between a student and a teacher about numbers.",
    "Read the question carefully and answer it.",
    "This page collects practice questions with worked answers.",
    "Each exercise below is followed by its solution.",
    "The teacher explains every step of the calculation in the reply.",
    "Below, a learner asks questions and a helper replies with the result.",
    "Questions are short and the replies give the final number at the end.",
    # The R1-Zero preamble's first sentences (not the one naming the tags): a base model
    # has read instructions like these; it has never seen a <think>/<answer> completion.
    "A conversation between User and Assistant.",
    "The user asks a question, and the Assistant solves it.",
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer.",
]


def _corpus(recipe: TinyRecipe) -> list[str]:
    """Arithmetic facts and worked *train* problems: eval problems never leak."""
    rng = random.Random(recipe.seed)
    facts = arithmetic_facts(recipe.seed, n_two_digit=recipe.two_digit_facts)
    docs = []
    for _ in range(recipe.fact_repeats):  # the facts are what a tiny model must memorise
        rng.shuffle(facts)
        docs += [" ".join(facts[i : i + 8]) for i in range(0, len(facts), 8)]
    for p in generate_problems("train", recipe.corpus_problems, levels=recipe.corpus_levels, seed=recipe.seed):
        steps = p.solution.rsplit(" The answer is", 1)[0]
        style = rng.random()
        if style < 0.1:
            docs.append(steps)
        elif style < 1.0 - recipe.chat_share:
            docs.append(f"Question: {p.problem}\nAnswer: {steps} The answer is \\boxed{{{p.answer}}}.")
        else:
            lead = " ".join(rng.sample(FILLER, rng.randint(0, recipe.max_filler)))
            docs.append(f"{lead} User: {p.problem} Assistant: {steps} So the answer is \\boxed{{{p.answer}}}.".strip())
    rng.shuffle(docs)
    return docs


def build_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with single-digit tokens (arithmetic needs per-digit tokens).

    The reasoning tags are ordinary added tokens, not special ones: TRL decodes with
    skip_special_tokens=True, which would strip special tags and break the rewards.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    # One digit per token, the space before a number kept on its first digit (" 45" ->
    # "Ġ4" "5"): with a bare "Ġ" token before every number, copying an operand from the
    # question needs a two-token match, which a tiny model learns far more slowly.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r" ?[0-9]"), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The templates are tokenizer text too, so prompts compress to words, not bytes.
    tok.train_from_iterator(texts + [R1_ZERO_TEMPLATE, CHAT_SYSTEM_PROMPT] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        padding_side="left",
    )
    fast.add_tokens(REASONING_TAGS)
    return fast


def _pretrain(model, tokenizer, docs: list[str], recipe: TinyRecipe, progress: bool) -> float:
    """Causal-LM training on packed windows: documents joined by eos and cut into rows of
    seq_len tokens, so no compute goes to padding and the model learns to answer the last
    question after a long, unrelated context (the R1-Zero preamble is ~115 tokens)."""
    import torch

    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(docs, add_special_tokens=False)["input_ids"]:
        stream += ids + [eos]
    data = torch.tensor(stream, dtype=torch.long)
    n_rows = max(1, len(stream) // recipe.seq_len)
    rows = data[: n_rows * recipe.seq_len].view(n_rows, recipe.seq_len)
    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=recipe.learning_rate, total_steps=recipe.pretrain_steps, pct_start=0.1
    )
    model.train()
    bar = Bar(recipe.pretrain_steps, "pretraining builtin:tiny-arith", progress)
    loss_val = float("nan")
    for _ in range(recipe.pretrain_steps):
        ids = rows[torch.randint(0, n_rows, (recipe.batch_size,), generator=gen)]
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_val = out.loss.item()
        bar.advance(info=f"loss {loss_val:.3f}")
    bar.close()
    model.eval()
    return loss_val


def _mean_init_tags(model, tokenizer) -> None:
    """Give the never-seen tag tokens the mean embedding, as resize_token_embeddings does
    for new tokens: random rows would make the model's first step after <think> noise."""
    import torch

    ids = tokenizer.convert_tokens_to_ids(REASONING_TAGS)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        keep = torch.ones(emb.shape[0], dtype=torch.bool)
        keep[ids] = False
        emb[ids] = emb[keep].mean(0)


def build_tiny_model(out_dir: str | Path, recipe: TinyRecipe = TinyRecipe(), progress: bool = False) -> Path:
    """Build, pretrain and save the tiny base model (tokenizer + weights) to out_dir."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    docs = _corpus(recipe)
    tokenizer = build_tokenizer(docs, recipe.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    t0 = time.time()
    loss = _pretrain(model, tokenizer, docs, recipe, progress)
    _mean_init_tags(model, tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    meta = {"recipe": asdict(recipe), "final_loss": loss, "pretrain_seconds": time.time() - t0}
    (out / "builtin.json").write_text(json.dumps(meta, indent=2))
    return out


def weights_sha256(model_dir: str | Path) -> str:
    return hashlib.sha256((Path(model_dir) / "model.safetensors").read_bytes()).hexdigest()


def build_record() -> dict:
    """What a build's bits depend on besides the recipe (stored beside shipped weights)."""
    import platform

    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(), "threads": torch.get_num_threads()}


def shipped_tiny(recipe: TinyRecipe = TinyRecipe()) -> Path | None:
    """The packaged build of `recipe`, or None (no shipped weights, or another recipe's)."""
    meta = SHIPPED_DIR / "builtin.json"
    if not meta.is_file():
        return None
    recorded = json.loads(meta.read_text()).get("recipe", {})
    key = hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:10]
    return SHIPPED_DIR if key == recipe.key() else None


def ensure_builtin(name: str, cache_root: str | Path, progress: bool = False) -> Path:
    """Path of the built-in model `name`: the shipped weights when they are this recipe's,
    else the workspace's cached build (built once, atomically, if absent)."""
    kind = name.removeprefix(BUILTIN_PREFIX)
    if kind != "tiny-arith":
        raise ValueError(f"unknown built-in model {name!r}; known: builtin:tiny-arith")
    recipe = TinyRecipe()
    where = tiny_dir(cache_root, recipe)
    if where == SHIPPED_DIR:
        return where
    return build_once(where, lambda tmp: build_tiny_model(tmp, recipe, progress=progress))


def tiny_dir(cache_root: str | Path, recipe: TinyRecipe = TinyRecipe()) -> Path:
    """Where builtin:tiny-arith of `recipe` is: the shipped weights when they are this
    recipe's, else the workspace's cache folder (built or not)."""
    return shipped_tiny(recipe) or Path(cache_root) / f"tiny-arith-{recipe.key()}"


def build_once(final: Path, build) -> Path:
    """`final`, built by `build(tmp)` into a temporary sibling and renamed into place once
    (atomically), unless a finished build (its builtin.json) is there already."""
    if (final / "builtin.json").is_file():
        return final
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        tmp.rename(final)  # a concurrent builder may have won: keep theirs
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
