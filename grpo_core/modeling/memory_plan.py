"""Memory plan of a config's GRPO stage for its real model: what one device holds.

    plan = memory_plan(cfg, gpu_gb=80)              # one GPU: bytes per item, total, fits
    plan = memory_plan(cfg, device="cpu")           # the same stage on CPU (use_cpu, fp32)

The seed's memory argument made concrete: GRPO keeps a policy and a frozen reference
(no critic, no value model). Per device, with P parameters and N = train.num_processes
(GB = 10^9 bytes, GiB = 2^30: `gpu_gb` is what a GPU's name says, "H100 80GB", in GB):

| item | bytes | sharded by |
|---|---|---|
| policy weights (fp32 master weights, whatever the checkpoint's dtype) | 4 P | ZeRO-3 / FSDP |
| gradients (fp32, on the master weights) | 4 P | ZeRO-2, ZeRO-3 / FSDP |
| Adam state (exp_avg + exp_avg_sq, fp32; fused AdamW: no temporaries) | 8 P | ZeRO-1, -2, -3 / FSDP |
| reference model, built by TRL in the policy's dtype: fp32 (none when beta == 0) | 4 P | ZeRO-3 / FSDP |
| with model.peft (LoRA, A adapter parameters): weights 4 P + 4 A, gradients 4 A, Adam 8 A, reference 0 (the base with adapters disabled) | | |
| GPU, bf16/fp16 autocast: 16-bit copies of the linear layers' weights, kept for backward | 2 P_linear | - |
| activations of one micro-batch (16-bit under autocast, fp32 on CPU) | see `activation_bytes` | - |
| TRL's fused LM head: one log-prob tile of tokens x vocabulary chunk | see `logprob_chunk_bytes` | - |
| KV cache of one generation batch (bf16 on GPU, fp32 on CPU) | 2 L n_kv d_head x bytes x tokens | - |
| CPU: the runtime (see `CPU_RUNTIME_BYTES`) | constant | - |

Peak = states + max(training transients, generation transients). Architecture numbers come
from a small table of known models (hub ids cannot be fetched here) or a local folder's
config.json. Pure arithmetic: no torch, no transformers. bench/memory_plan.py compares the
CPU plan with measured peaks.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 2**30
GB = 10**9
PROMPT_TOKENS = 256  # assumed prompt length (the config has no prompt budget)


@dataclass(frozen=True)
class Arch:
    """The numbers of a decoder-only transformer that decide its memory."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = True  # Qwen2 has q/k/v biases; Llama (SmolLM2) has none

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def params(self) -> int:
        """Parameter count: embeddings (+ an untied LM head), per layer q/k/v/o (GQA: k and v
        are kv_heads x head_dim wide), the gated MLP (gate, up, down) and two RMSNorms, plus
        the final norm."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h


# config.json numbers of the models the shipped presets name (and a few neighbours).
_QWEN25_15B = Arch(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960,
                   vocab=151936, tied=True)
KNOWN: dict[str, Arch] = {
    "qwen2.5-0.5b": Arch(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab=151936, tied=True),
    "qwen2.5-1.5b": _QWEN25_15B,
    "qwen2.5-math-1.5b": _QWEN25_15B,
    "qwen2.5-7b": Arch(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944,
                       vocab=152064, tied=False),
    "smollm2-135m": Arch(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536,
                         vocab=49152, tied=True, qkv_bias=False),
}


def known_key(name_or_path: str) -> str | None:
    """`Qwen/Qwen2.5-1.5B-Instruct` -> `qwen2.5-1.5b` (suffixes -instruct/-base dropped)."""
    stem = name_or_path.rstrip("/").rsplit("/", 1)[-1].lower()
    stem = re.sub(r"-(instruct|base|chat)$", "", stem)
    return stem if stem in KNOWN else None


def arch_from_config(tree: dict) -> Arch:
    """An Arch from a Hugging Face config.json mapping (Llama/Qwen2/Mistral naming)."""
    heads = tree["num_attention_heads"]
    return Arch(hidden=tree["hidden_size"], layers=tree["num_hidden_layers"], heads=heads,
                kv_heads=tree.get("num_key_value_heads") or heads,
                intermediate=tree["intermediate_size"], vocab=tree["vocab_size"],
                tied=bool(tree.get("tie_word_embeddings", False)),
                qkv_bias=bool(tree.get("attention_bias", tree.get("model_type") == "qwen2")))


def builtin_arch(name: str) -> Arch | None:
    """The built-in CPU models from their build recipes (vocabulary: the BPE size; the
    few special tokens on top are left out)."""
    if name == "builtin:proxy-qwen2":
        from grpo_core.modeling.proxy import ProxyRecipe

        r = ProxyRecipe()
        return Arch(hidden=r.hidden_size, layers=r.num_layers, heads=r.num_heads,
                    kv_heads=r.num_kv_heads, intermediate=r.intermediate_size,
                    vocab=r.vocab_size, tied=True)
    if name.startswith("builtin:"):
        from grpo_core.modeling.tiny import TinyRecipe

        t = TinyRecipe()
        return Arch(hidden=t.hidden_size, layers=t.num_layers, heads=t.num_heads,
                    kv_heads=t.num_heads, intermediate=t.intermediate_size,
                    vocab=t.vocab_size, tied=True, qkv_bias=False)
    return None


def resolve_arch(name_or_path: str) -> tuple[Arch | None, str]:
    """(architecture, where it came from); (None, why) when it cannot be known offline."""
    if (arch := builtin_arch(name_or_path)) is not None:
        return arch, f"build recipe of {name_or_path}"
    key = known_key(name_or_path)
    if key:
        return KNOWN[key], f"table: {key}"
    config = Path(name_or_path).expanduser() / "config.json"
    if config.is_file():
        try:
            return arch_from_config(json.loads(config.read_text())), str(config)
        except (KeyError, TypeError, ValueError) as exc:
            return None, f"{config}: unreadable ({exc})"
    return None, (f"unknown architecture for {name_or_path!r}: not in the table "
                  f"({', '.join(KNOWN)}) and no local config.json")


def zero_stage(accelerate_config: str | None) -> int:
    """ZeRO stage implied by an accelerate file: its name (zero1/2/3, fsdp: full shard,
    as FSDP2 with reshard_after_forward), else a `zero_stage:` line in it, else 0 (DDP)."""
    if not accelerate_config:
        return 0
    name = Path(accelerate_config).name.lower()
    if "fsdp" in name:
        return 3
    m = re.search(r"zero([123])", name)
    if m:
        return int(m.group(1))
    path = Path(accelerate_config)
    if not path.is_absolute():
        path = Path(__file__).resolve().parents[2] / path  # the project root
    try:
        m = re.search(r"zero_stage:\s*([123])", path.read_text())
    except OSError:
        m = None
    return int(m.group(1)) if m else 0


def activation_bytes(arch: Arch, batch: int, seq: int, checkpointing: bool,
                     dtype_bytes: int = 2) -> int:
    """Activations kept for backward in one micro-batch of `batch` sequences of `seq`
    tokens, `dtype_bytes` per value (2: 16-bit autocast on GPU; 4: fp32 on CPU).

    Counted from what transformers' Qwen2/Llama decoder layer saves with SDPA attention,
    per token and layer: each RMSNorm its input and normalised output (2 x 2h); the
    attention's rotated q and k and its v (h + 2 kv, kv = n_kv x d_head: SDPA with GQA),
    its output and the contiguous copy o_proj reads (2h); the gated MLP's gate output,
    SiLU output, up output and their product (4 i): 7h + 2kv + 4i. SDPA (flash or
    memory-efficient, on GPU and CPU) keeps no s x s score matrix. At the top, the final
    norm (2h) and the hidden states TRL's fused LM head saves (h). With activation
    checkpointing each layer keeps only its input (h) and one layer's activations are
    live again during its recomputation."""
    kv = arch.kv_heads * arch.head_dim
    per_layer = 7 * arch.hidden + 2 * kv + 4 * arch.intermediate
    top = 3 * arch.hidden
    kept = arch.hidden * arch.layers + per_layer if checkpointing else per_layer * arch.layers
    return (kept + top) * batch * seq * dtype_bytes


# trl/trainer/utils.py:1506 `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768` (vocabulary columns per
# tile) and trl/kernels/chunked_logprob.py:31 `TOKEN_CHUNK_SIZE = 4096` (rows per tile):
# TRL's tile, kept on GPU; on CPU the pipeline sets a smaller one (train.logprob_chunk_*)
LOGPROB_VOCAB_CHUNK = 32768
LOGPROB_TOKEN_CHUNK = 4096
CPU_LOGPROB_VOCAB_CHUNK = 8192
CPU_LOGPROB_TOKEN_CHUNK = 512


def logprob_tile(cfg, cpu: bool) -> tuple[int, int]:
    """(positions, vocabulary columns) per tile of TRL's fused LM head for cfg's training:
    train.logprob_chunk_tokens / _vocab when set, else TRL's on GPU and the smaller CPU
    tile (its torch fallback holds ~33 bytes per tile element in backward)."""
    t = cfg.train
    tokens = t.logprob_chunk_tokens or (CPU_LOGPROB_TOKEN_CHUNK if cpu else LOGPROB_TOKEN_CHUNK)
    vocab = t.logprob_chunk_vocab or (CPU_LOGPROB_VOCAB_CHUNK if cpu else LOGPROB_VOCAB_CHUNK)
    return tokens, vocab


def logprob_chunk_bytes(arch: Arch, tokens: int, triton: bool, dtype_bytes: int = 2,
                        tile: tuple[int, int] = (LOGPROB_TOKEN_CHUNK, LOGPROB_VOCAB_CHUNK)) -> int:
    """Peak of TRL 1.16's fused LM head (trl/trainer/utils.py:1548 `add_fused_lm_head`,
    trl/kernels/chunked_logprob.py:299 `ChunkedLogProbFunction`), which never
    materialises batch x sequence x vocabulary logits: it projects tiles of at most
    `tile` (positions, vocabulary entries) and folds each into running log-sum-exp
    statistics. `tokens` are the positions scored: the completion tokens with Triton (GPU,
    `compact`: only labels != -100, utils.py:1642), every position elsewhere (CPU).

    With Triton the fold runs in registers: one tile buffer in the autocast dtype
    (`mm_buf`, chunked_logprob.py:413). Without it (`_backward_tile`, chunked_logprob.py:257)
    the backward keeps, per tile element, the buffer and y, z, log_p, p, grad and two
    temporaries of the gradient expression in fp32, plus the bool `is_target`: 8 x 4 + 1
    bytes. Both also accumulate the hidden states' gradient in fp32 (tokens x h x 4; the
    weight's gradient in fp32 is the LM head's gradient, counted with the gradients)."""
    rows = min(tokens, tile[0])
    cols = min(arch.vocab, tile[1])
    per_element = dtype_bytes if triton else 8 * 4 + 1
    return rows * cols * per_element + 4 * tokens * arch.hidden


def linear_params(arch: Arch) -> int:
    """Parameters of the decoder layers' linear layers (weights and biases): what autocast
    casts to 16 bits. The embedding is looked up in fp32, the norms run in fp32 and the
    fused LM head casts its weight a chunk at a time, uncached."""
    h, kv = arch.hidden, arch.kv_heads * arch.head_dim
    attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if arch.qkv_bias else 0)
    return arch.layers * (attn + 3 * h * arch.intermediate)


def kv_cache_bytes(arch: Arch, sequences: int, tokens: int, dtype_bytes: int = 2) -> int:
    """K and V for every layer and kv head: 2 * L * n_kv * d_head * bytes per token."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * dtype_bytes * sequences * tokens


def lora_params(arch: Arch, r: int, targets: str | list[str]) -> int:
    """Adapter parameters of LoRA rank r: r x (in + out) per targeted linear layer.
    `all-linear` is every projection of attention and MLP (peft leaves the LM head out);
    module names count by their last part (q_proj, self_attn.q_proj)."""
    h, kv, i = arch.hidden, arch.kv_heads * arch.head_dim, arch.intermediate
    shapes = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    names = shapes if targets == "all-linear" else \
        {t.rsplit(".", 1)[-1] for t in ([targets] if isinstance(targets, str) else targets)}
    return arch.layers * sum(r * sum(shapes[n]) for n in names if n in shapes)


def gradient_checkpointing(cfg, explicit: bool | None = None) -> bool:
    """Explicit setting, else on for real models and off for the built-in tiny ones."""
    from grpo_core.modeling.tiny import BUILTIN_PREFIX

    return explicit if explicit is not None else not cfg.model.name_or_path.startswith(BUILTIN_PREFIX)


# What a CPU GRPO process holds above its idle self (libraries imported, no model) whatever
# the model: the modules TRL, accelerate and datasets import while building the trainer,
# the tokenizer and dataset, torch's per-thread and oneDNN scratch buffers. A measured
# constant, not derived: bench/memory_plan.py's proxy row (builtin:proxy-qwen2, 0.1M
# parameters, whose model terms total ~10 MiB) peaked 308 MiB above idle (2026-12-01).
CPU_RUNTIME_BYTES = 300 * 2**20


def memory_plan(cfg, gpu_gb: float = 80.0, prompt_tokens: int = PROMPT_TOKENS,
                device: str = "gpu") -> dict:
    """Per-device bytes of cfg's GRPO stage for cfg.model.name_or_path and whether they fit
    `gpu_gb` GB (10^9 bytes, as GPUs are named). Peak = states + max(training transients,
    generation transients): TRL generates, then trains, in turn (vLLM colocate keeps its
    reservation throughout). device "gpu": fp32 master weights with train.precision's
    autocast; "cpu": what the stage does with use_cpu (fp32, no autocast, no vLLM, one
    process), which bench/memory_plan.py measures."""
    if device not in ("gpu", "cpu"):
        raise ValueError(f"device must be 'gpu' or 'cpu', not {device!r}")
    cpu = device == "cpu"
    name = cfg.model.name_or_path
    arch, source = resolve_arch(name)
    g, t = cfg.grpo, cfg.train
    n = 1 if cpu else t.num_processes
    stage = 0 if cpu else zero_stage(t.accelerate_config)
    plan: dict = {"model": name, "arch_source": source, "device": device, "gpu_gb": gpu_gb,
                  "num_processes": n, "accelerate_config": t.accelerate_config,
                  "zero_stage": stage}
    if arch is None:
        return {**plan, "fits": None, "note": source}
    from grpo_core.config import generation_batch

    p = arch.params()
    micro, passes = g.per_device_train_batch_size, g.gradient_accumulation_steps
    gen_seqs = generation_batch(cfg) // n  # per process: TRL generates a whole batch at once
    seq = prompt_tokens + g.max_completion_length
    ckpt = gradient_checkpointing(cfg, g.activation_checkpointing)
    # autocast on a GPU unless train.precision is fp32 ("auto": bf16 or fp16 there);
    # the CPU runs fp32 throughout
    autocast = not cpu and t.precision not in ("fp32", "float32")
    act_bytes = 2 if autocast else 4
    shard = lambda nbytes, from_stage: nbytes // n if stage >= from_stage else nbytes
    peft = cfg.model.peft
    # LoRA: the optimizer sees the adapters alone; the frozen base with its adapters
    # disabled is the reference (TRL keeps no copy: grpo_core/train/lora.py)
    adapters = lora_params(arch, peft.r, peft.target_modules) if peft.enabled else 0
    trained = adapters if peft.enabled else p
    kl = g.beta > 0 or cfg.rounds.kl_schedule.kind != "constant"
    # TRL 1.16 builds the reference from the policy's path with
    # `model_init_kwargs.setdefault("dtype", self.model.dtype)` (trl/trainer/grpo_trainer.py
    # :1001-1003): the policy is our fp32 master copy, so the reference is fp32 too
    ref_dtype_bytes = 4
    # scored positions: completions only with Triton (GPU), every position on CPU
    scored = micro * (g.max_completion_length if not cpu else seq - 1)
    items = {
        "policy_weights": shard(4 * (p + adapters), 3),
        "gradients": shard(4 * trained, 2),
        "optimizer_adam": shard(8 * trained, 1),
        "reference_model": shard(ref_dtype_bytes * p, 3) if kl and not peft.enabled else 0,
        # autocast keeps a 16-bit copy of each linear weight it casts for the forward pass
        # until backward (torch's autocast weight cache, cleared when the region exits)
        "autocast_weight_copies": 2 * linear_params(arch) // (n if stage >= 3 else 1) if autocast else 0,
        "activations_no_ckpt": activation_bytes(arch, micro, seq, False, act_bytes),
        "activations_ckpt": activation_bytes(arch, micro, seq, True, act_bytes),
        "logprob_chunk": logprob_chunk_bytes(arch, scored, triton=not cpu, dtype_bytes=act_bytes,
                                             tile=logprob_tile(cfg, cpu)),
        "kv_cache": kv_cache_bytes(arch, gen_seqs, seq, 2 if not cpu else 4),
    }
    if cpu:
        items["runtime"] = CPU_RUNTIME_BYTES
    states = sum(items[k] for k in ("policy_weights", "gradients", "optimizer_adam",
                                    "reference_model")) + items.get("runtime", 0)
    train = (items["activations_ckpt" if ckpt else "activations_no_ckpt"] + items["logprob_chunk"]
             + items["autocast_weight_copies"])
    vllm_colocate = not cpu and g.use_vllm and g.vllm_mode == "colocate"
    capacity = gpu_gb * GB
    gen = int(g.vllm_gpu_memory_utilization * capacity) if vllm_colocate else items["kv_cache"]
    total = states + (train + gen if vllm_colocate else max(train, gen))
    return {**plan, **asdict(arch), "params": p, "trainable_params": trained,
            "lora": {"r": peft.r, "adapter_params": adapters} if peft.enabled else None,
            "micro_batch": micro, "passes_per_step": passes,
            "generation_batch": gen_seqs, "seq_tokens": seq, "prompt_tokens": prompt_tokens,
            "gradient_checkpointing": ckpt, "autocast": autocast,
            "vllm_colocate_reserved": gen if vllm_colocate else 0,
            "bytes": items, "states_bytes": states, "train_bytes": train, "generation_bytes": gen,
            "total_bytes": total, "total_gib": round(total / GIB, 2),
            "total_gb": round(total / GB, 2), "fits": total <= capacity}


def format_plan(plan: dict) -> str:
    """A few lines for the terminal."""
    if plan.get("fits") is None:
        return f"memory plan: {plan.get('note')}"
    gib = lambda v: f"{v / GIB:.2f} GiB"
    where = "per GPU" if plan.get("device", "gpu") == "gpu" else "on CPU (fp32)"
    lines = [(f"memory plan for {plan['model']} ({plan['params'] / 1e6:.0f}M params, "
              f"{plan['num_processes']} process(es), ZeRO stage {plan['zero_stage']}), {where}:")]
    if plan.get("lora"):
        lines.append(f"  LoRA r={plan['lora']['r']}: {plan['lora']['adapter_params'] / 1e6:.1f}M "
                     "trainable adapter params; reference = base with adapters disabled")
    lines += [f"  {k:<22} {gib(v)}" for k, v in plan["bytes"].items()]
    if plan["vllm_colocate_reserved"]:
        lines.append(f"  {'vllm_colocate_reserved':<22} {gib(plan['vllm_colocate_reserved'])}")
    lines.append(f"  total {plan['total_gib']} GiB ({plan['total_gb']} GB): "
                 + (f"{'fits' if plan['fits'] else 'does NOT fit'} in {plan['gpu_gb']} GB "
                    if plan.get("device", "gpu") == "gpu" else "")
                 + f"(micro-batch {plan['micro_batch']} x {plan['seq_tokens']} tokens, "
                 f"{plan['passes_per_step']} per optimizer step, "
                 f"checkpointing {'on' if plan['gradient_checkpointing'] else 'off'})")
    if not plan["fits"]:
        lines.append("  lower grpo.per_device_train_batch_size (activations scale with it), "
                     "or shard with a ZeRO/FSDP train.accelerate_config")
    return "\n".join(lines)
