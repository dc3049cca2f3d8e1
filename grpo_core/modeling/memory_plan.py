"""GPU memory plan of a config's GRPO stage for its real model: what one GPU holds.

    plan = memory_plan(cfg, gpu_gb=80)     # dict of bytes per item, the total, fits

The seed's memory argument made concrete: GRPO keeps a policy and a frozen reference
(no critic, no value model). Per GPU, with P parameters and N = train.num_processes:

| item | bytes | sharded by |
|---|---|---|
| policy weights (fp32 master, train.precision) | 4 P | ZeRO-3 / FSDP |
| gradients (fp32, on the master weights) | 4 P | ZeRO-2, ZeRO-3 / FSDP |
| Adam state (exp_avg + exp_avg_sq, fp32) | 8 P | ZeRO-1, -2, -3 / FSDP |
| reference model (sampling dtype, bf16; none when grpo.beta == 0) | 2 P | ZeRO-3 / FSDP |
| with model.peft (LoRA, A adapter parameters): weights 4 P + 4 A, gradients 4 A, Adam 8 A, reference 0 (the base with adapters disabled) | | |
| activations of one micro-batch | see `activation_bytes` | - |
| logits of one micro-batch (fp32 log-softmax over the vocabulary) | 4 b s_c V | - |
| KV cache of one generation batch (bf16) | 2 L n_kv d_head 2 x tokens | - |

Architecture numbers come from a small table of known models (hub ids cannot be fetched
here) or a local folder's config.json. Pure arithmetic: no torch, no transformers.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = 2**30
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


def activation_bytes(arch: Arch, batch: int, seq: int, checkpointing: bool) -> int:
    """Activations kept for backward in one micro-batch of `batch` sequences of `seq`
    tokens, 16-bit (autocast).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models" (arXiv:2205.05198), eq. 1 with no tensor parallelism: per layer
    s*b*h*(34 + 5*a*s/h) bytes, where 5*a*s^2*b is the attention score/softmax/dropout
    part (an upper bound: SDPA/flash attention does not store it). With full activation
    recomputation (their section 4.1) each layer keeps only its 16-bit input, 2*s*b*h
    bytes, and one layer's activations are live again during its recomputation."""
    s, b, h, a = seq, batch, arch.hidden, arch.heads
    per_layer = s * b * h * 34 + 5 * a * s * s * b
    if checkpointing:
        return 2 * s * b * h * arch.layers + per_layer
    return per_layer * arch.layers


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


def memory_plan(cfg, gpu_gb: float = 80.0, prompt_tokens: int = PROMPT_TOKENS) -> dict:
    """Per-GPU bytes of cfg's GRPO stage for cfg.model.name_or_path, and whether they fit
    `gpu_gb` GiB. Peak = states + max(training transients, generation transients): TRL
    generates, then trains, in turn (vLLM colocate keeps its reservation throughout)."""
    name = cfg.model.name_or_path
    arch, source = resolve_arch(name)
    g, t = cfg.grpo, cfg.train
    n = t.num_processes
    stage = zero_stage(t.accelerate_config)
    plan: dict = {"model": name, "arch_source": source, "gpu_gb": gpu_gb,
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
    shard = lambda nbytes, from_stage: nbytes // n if stage >= from_stage else nbytes
    peft = cfg.model.peft
    # LoRA: the optimizer sees the adapters alone; the frozen base with its adapters
    # disabled is the reference (TRL keeps no copy: grpo_core/train/lora.py)
    adapters = lora_params(arch, peft.r, peft.target_modules) if peft.enabled else 0
    trained = adapters if peft.enabled else p
    kl = g.beta > 0 or cfg.rounds.kl_schedule.kind != "constant"
    items = {
        "policy_weights": shard(4 * (p + adapters), 3),
        "gradients": shard(4 * trained, 2),
        "optimizer_adam": shard(8 * trained, 1),
        "reference_model": shard(2 * p, 3) if kl and not peft.enabled else 0,
        "activations_no_ckpt": activation_bytes(arch, micro, seq, False),
        "activations_ckpt": activation_bytes(arch, micro, seq, True),
        "logits": 4 * micro * g.max_completion_length * arch.vocab,
        "kv_cache": kv_cache_bytes(arch, gen_seqs, seq),
    }
    states = sum(items[k] for k in ("policy_weights", "gradients", "optimizer_adam",
                                    "reference_model"))
    train = items["activations_ckpt" if ckpt else "activations_no_ckpt"] + items["logits"]
    vllm_colocate = g.use_vllm and g.vllm_mode == "colocate"
    gen = int(g.vllm_gpu_memory_utilization * gpu_gb * GIB) if vllm_colocate else items["kv_cache"]
    total = states + (train + gen if vllm_colocate else max(train, gen))
    return {**plan, **asdict(arch), "params": p, "trainable_params": trained,
            "lora": {"r": peft.r, "adapter_params": adapters} if peft.enabled else None,
            "micro_batch": micro, "passes_per_step": passes,
            "generation_batch": gen_seqs, "seq_tokens": seq, "prompt_tokens": prompt_tokens,
            "gradient_checkpointing": ckpt, "vllm_colocate_reserved": gen if vllm_colocate else 0,
            "bytes": items, "states_bytes": states, "total_bytes": total,
            "total_gib": round(total / GIB, 2), "fits": total <= gpu_gb * GIB}


def format_plan(plan: dict) -> str:
    """A few lines for the terminal."""
    if plan.get("fits") is None:
        return f"memory plan: {plan.get('note')}"
    gib = lambda v: f"{v / GIB:.2f} GiB"
    lines = [(f"memory plan for {plan['model']} ({plan['params'] / 1e6:.0f}M params, "
              f"{plan['num_processes']} process(es), ZeRO stage {plan['zero_stage']}), per GPU:")]
    if plan.get("lora"):
        lines.append(f"  LoRA r={plan['lora']['r']}: {plan['lora']['adapter_params'] / 1e6:.1f}M "
                     "trainable adapter params; reference = base with adapters disabled")
    lines += [f"  {k:<22} {gib(v)}" for k, v in plan["bytes"].items()]
    if plan["vllm_colocate_reserved"]:
        lines.append(f"  {'vllm_colocate_reserved':<22} {gib(plan['vllm_colocate_reserved'])}")
    lines.append(f"  total {plan['total_gib']} GiB: "
                 f"{'fits' if plan['fits'] else 'does NOT fit'} in {plan['gpu_gb']} GiB "
                 f"(micro-batch {plan['micro_batch']} x {plan['seq_tokens']} tokens, "
                 f"{plan['passes_per_step']} per optimizer step, "
                 f"checkpointing {'on' if plan['gradient_checkpointing'] else 'off'})")
    if not plan["fits"]:
        lines.append("  lower grpo.per_device_train_batch_size (activations and logits scale with it), "
                     "or shard with a ZeRO/FSDP train.accelerate_config")
    return "\n".join(lines)
