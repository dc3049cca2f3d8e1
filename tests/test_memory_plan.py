"""The memory plan's numbers against a hand calculation (grpo_core/modeling/memory_plan.py)."""
import pytest

from grpo_core.config import load_config
from grpo_core.modeling.memory_plan import (
    GB,
    KNOWN,
    activation_bytes,
    known_key,
    linear_params,
    memory_plan,
    resolve_arch,
    zero_stage,
)
from grpo_core.modeling.proxy import ProxyRecipe

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]

# Hand counts from the config.json numbers (tied embeddings, q/k/v biases, GQA):
# 0.5B: 151936*896 + 24*(896*896+896 + 2*(896*128+128) + 896*896 + 3*896*4864 + 2*896) + 896
# 1.5B: 151936*1536 + 28*(1536^2+1536 + 2*(1536*256+256) + 1536^2 + 3*1536*8960 + 2*1536) + 1536
HAND = {"Qwen/Qwen2.5-0.5B-Instruct": 494_032_768, "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304}


@pytest.mark.parametrize("name", list(HAND))
def test_param_counts_match_the_published_sizes(name):
    arch, source = resolve_arch(name)
    assert source.startswith("table")
    assert arch.params() == HAND[name]
    assert abs(arch.params() - (494e6 if "0.5B" in name else 1.54e9)) / arch.params() < 0.01


def test_smollm2_and_7b_counts():
    assert KNOWN["smollm2-135m"].params() == 134_515_008  # the GGUF load counts 134.5M
    assert abs(KNOWN["qwen2.5-7b"].params() - 7.62e9) < 0.01e9
    assert known_key("Qwen/Qwen2.5-Math-1.5B") == "qwen2.5-math-1.5b"


@pytest.mark.parametrize("preset,name", [("qwen2.5-0.5b-instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
                                         ("qwen2.5-1.5b-instruct", "Qwen/Qwen2.5-1.5B-Instruct")])
def test_plan_states_by_hand(preset, name):
    p = HAND[name]
    cfg = load_config(ROOT / f"configs/models/{preset}.yaml")
    plan = memory_plan(cfg, gpu_gb=80)
    b = plan["bytes"]
    assert plan["params"] == p
    assert b["policy_weights"] == 4 * p  # fp32 master weights
    assert b["gradients"] == 4 * p  # fp32 gradients
    assert b["optimizer_adam"] == 2 * 4 * p  # exp_avg + exp_avg_sq in fp32
    # TRL 1.16 builds the reference in the policy's dtype (grpo_trainer.py:1001), and the
    # policy is our fp32 master copy: 4 bytes, not the 2 of bf16 the plan used to say
    assert b["reference_model"] == 4 * p
    assert plan["states_bytes"] == 20 * p
    # micro-batch: grpo.per_device_train_batch_size 8 completions of 256 + 1024 tokens, 32
    # passes per optimizer step (GA 32: 256 completions = 32 prompts x G 8)
    assert plan["micro_batch"] == 8 and plan["seq_tokens"] == 1280
    assert plan["passes_per_step"] == 32 and plan["generation_batch"] == 256
    arch = resolve_arch(name)[0]
    s, bsz, h, L, i = 1280, 8, arch.hidden, arch.layers, arch.intermediate
    kv = 2 * (h // arch.heads)  # 2 kv heads
    # per token and layer 7h + 2kv + 4i values saved for backward, 3h at the top (final
    # norm, the fused head's input), 16-bit under autocast
    layer = 7 * h + 2 * kv + 4 * i
    assert b["activations_no_ckpt"] == (L * layer + 3 * h) * s * bsz * 2
    assert b["activations_ckpt"] == (L * h + layer + 3 * h) * s * bsz * 2
    assert b["activations_ckpt"] < b["activations_no_ckpt"]
    # bf16 copies of the decoder's linear weights (autocast), kept for backward
    assert b["autocast_weight_copies"] == 2 * linear_params(arch) and plan["autocast"] is True
    assert linear_params(arch) == p - 151936 * h - (2 * L + 1) * h  # all but embedding and norms
    # KV cache: K and V, L layers, 2 kv heads x 64/128 dims, bf16, a whole optimizer step
    # (8 x GA 32 = 256 sequences) of 1280 tokens
    assert b["kv_cache"] == 2 * L * 2 * (h // arch.heads) * 2 * 256 * 1280
    # TRL's fused LM head: no 8 x 1024 x 151936 logits (4.6 GiB in fp32), one bf16 tile of
    # 4096 completion tokens x 32768 vocabulary entries and the fp32 gradient of the
    # 8 x 1024 hidden states
    assert "logits" not in b
    assert b["logprob_chunk"] == 4096 * 32768 * 2 + 4 * 8 * 1024 * h
    # colocated vLLM keeps 0.3 of the GPU; the preset checkpoints activations
    assert plan["gradient_checkpointing"] is True
    reserved = int(0.3 * 80 * GB)  # --gpu-gb 80 is 80 GB (an "80GB" GPU), not 80 GiB
    assert plan["total_bytes"] == (20 * p + b["activations_ckpt"] + b["logprob_chunk"]
                                   + b["autocast_weight_copies"] + reserved)
    assert plan["fits"] == (plan["total_bytes"] <= 80 * GB)
    assert plan["fits"] is True  # as shipped, on an 80 GB GPU
    assert memory_plan(cfg, gpu_gb=1000)["fits"] is True
    # passes of 512 completions (64 prompts x G 8) would not fit: activations alone >60 GB
    whole = load_config(ROOT / f"configs/models/{preset}.yaml",
                        ["grpo.per_device_train_batch_size=512", "grpo.gradient_accumulation_steps=1"])
    assert memory_plan(whole, gpu_gb=80)["micro_batch"] == 512
    assert memory_plan(whole, gpu_gb=80)["fits"] is False


def test_zero_sharding_per_gpu():
    p = HAND["Qwen/Qwen2.5-1.5B-Instruct"]
    base = ROOT / "configs/models/qwen2.5-1.5b-instruct.yaml"
    z2 = memory_plan(load_config(base, ["train.num_processes=8",
                                        "train.accelerate_config=infra/accelerate/zero2.yaml"]))
    assert z2["zero_stage"] == 2
    assert (z2["bytes"]["policy_weights"], z2["bytes"]["gradients"],
            z2["bytes"]["optimizer_adam"], z2["bytes"]["reference_model"]) == (
        4 * p, 4 * p // 8, 8 * p // 8, 4 * p)
    z3 = memory_plan(load_config(base, ["train.num_processes=8",
                                        "train.accelerate_config=infra/accelerate/zero3.yaml"]))
    assert (z3["bytes"]["policy_weights"], z3["bytes"]["reference_model"]) == (4 * p // 8, 4 * p // 8)
    assert z3["micro_batch"] == 8  # 64 completions over 8 processes
    assert zero_stage("infra/accelerate/multi_gpu.yaml") == 0
    assert zero_stage("infra/accelerate/fsdp.yaml") == 3
    assert zero_stage(None) == 0


def test_no_reference_model_without_kl():
    cfg = load_config(ROOT / "configs/models/qwen2.5-math-1.5b.yaml", ["grpo.beta=0.0"])
    assert memory_plan(cfg)["bytes"]["reference_model"] == 0


def test_local_config_json_and_unknown(tmp_path):
    import json

    r = ProxyRecipe()
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": r.hidden_size, "num_hidden_layers": r.num_layers,
        "num_attention_heads": r.num_heads, "num_key_value_heads": r.num_kv_heads,
        "intermediate_size": r.intermediate_size, "vocab_size": 500, "tie_word_embeddings": True}))
    cfg = load_config(None, [f"model.name_or_path={tmp_path}"])
    plan = memory_plan(cfg)
    assert plan["arch_source"].endswith("config.json") and plan["fits"] is True
    assert activation_bytes(resolve_arch(str(tmp_path))[0], 1, 10, False) > 0
    unknown = memory_plan(load_config(None, ["model.name_or_path=someone/unknown-model"]))
    assert unknown["fits"] is None and "unknown architecture" in unknown["note"]


def test_count_equals_a_real_models(tmp_path):
    """The parameter formula against torch's count of the proxy (a real Qwen2 class)."""
    from transformers import AutoModelForCausalLM

    from grpo_core.modeling.proxy import ensure_proxy

    path = ensure_proxy(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert resolve_arch(str(path))[0].params() == sum(p.numel() for p in model.parameters())


def test_builtin_models_have_a_plan():
    plan = memory_plan(load_config(ROOT / "configs/quickstart.yaml"))
    assert plan["arch_source"].startswith("build recipe") and plan["fits"] is True
    assert plan["params"] < 1_000_000


def test_lora_plan_holds_the_adapters_alone():
    """model.peft: weights 4 P + 4 A, gradients 4 A, Adam 8 A, no reference copy (the base
    with adapters disabled). The LoRA preset fits 24 GiB where the full one does not."""
    p = HAND["Qwen/Qwen2.5-1.5B-Instruct"]
    # r 64 on all 7 projections of 28 layers: q, o 1536+1536; k, v 1536+256; gate, up,
    # down 1536+8960
    a = 28 * 64 * (2 * 3072 + 2 * 1792 + 3 * 10496)
    assert a == 73_859_072
    cfg = load_config(ROOT / "configs/models/qwen2.5-1.5b-instruct-lora.yaml")
    plan = memory_plan(cfg, gpu_gb=24)
    b = plan["bytes"]
    assert plan["lora"] == {"r": 64, "adapter_params": a} and plan["trainable_params"] == a
    assert (b["policy_weights"], b["gradients"], b["optimizer_adam"], b["reference_model"]) == (
        4 * (p + a), 4 * a, 8 * a, 0)
    assert plan["fits"] is True
    full = load_config(ROOT / "configs/models/qwen2.5-1.5b-instruct.yaml",
                       ["grpo.per_device_train_batch_size=4", "grpo.gradient_accumulation_steps=64",
                        "grpo.vllm_gpu_memory_utilization=0.25"])
    assert memory_plan(full, gpu_gb=24)["fits"] is False  # 20 P of states alone: 30.9 GB
    some = load_config(ROOT / "configs/models/qwen2.5-1.5b-instruct-lora.yaml",
                       ["model.peft.target_modules=[q_proj, self_attn.v_proj]", "model.peft.r=8"])
    assert memory_plan(some)["lora"]["adapter_params"] == 28 * 8 * (3072 + 1792)


def test_lora_count_equals_peft(tmp_path):
    """The adapter formula against peft's count on the proxy (a real Qwen2 class)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_core.modeling.memory_plan import lora_params
    from grpo_core.modeling.proxy import ensure_proxy

    path = ensure_proxy(tmp_path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path),
                           LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert lora_params(resolve_arch(str(path))[0], 4, "all-linear") == trainable


def test_gpu_gb_is_gb_not_gib():
    """`--gpu-gb 80` means an "80GB" GPU: 80 x 10^9 bytes (74.5 GiB). A plan between the
    two must not fit in 80 GB."""
    cfg = load_config(ROOT / "configs/models/qwen2.5-1.5b-instruct.yaml", ["grpo.use_vllm=false"])
    total = memory_plan(cfg, gpu_gb=80)["total_bytes"]
    assert GB == 10**9
    just_over = total / GB * (1 - 1e-6)  # a capacity a hair below the plan, in GB
    assert memory_plan(cfg, gpu_gb=just_over)["fits"] is False
    assert memory_plan(cfg, gpu_gb=total / GB)["fits"] is True
    # 80 GB < 80 GiB: the colocated vLLM reservation is 0.3 x 80e9 bytes
    colocated = load_config(ROOT / "configs/models/qwen2.5-1.5b-instruct.yaml")
    assert memory_plan(colocated, gpu_gb=80)["vllm_colocate_reserved"] == int(0.3 * 80e9)
    from grpo_core.modeling.memory_plan import format_plan

    assert "in 80 GB" in format_plan(memory_plan(colocated, gpu_gb=80))


def test_reference_in_policy_dtype_matches_trl(tmp_path):
    """TRL 1.16 builds the reference from the policy's path in `self.model.dtype`
    (grpo_trainer.py:1001): an fp32 policy gets an fp32 reference, 4 bytes a parameter, on
    CPU and GPU alike. Checked against the installed source, not only the comment."""
    import inspect

    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer.__init__)
    assert 'model_init_kwargs.setdefault("dtype", self.model.dtype)' in src
    cfg = load_config(ROOT / "configs/models/qwen2.5-0.5b-instruct.yaml")
    for device in ("gpu", "cpu"):
        plan = memory_plan(cfg, device=device)
        assert plan["bytes"]["reference_model"] == 4 * plan["params"]


def test_cpu_plan_is_fp32_without_autocast():
    """device="cpu": what use_cpu runs: one process, fp32 activations and KV cache, no
    autocast copies, no vLLM, every position through the fused head's torch tiles."""
    cfg = load_config(ROOT / "configs/models/qwen2.5-0.5b-instruct.yaml",
                      ["train.num_processes=8", "train.accelerate_config=infra/accelerate/zero3.yaml"])
    gpu, cpu = memory_plan(cfg, gpu_gb=80), memory_plan(cfg, device="cpu")
    assert cpu["num_processes"] == 1 and cpu["zero_stage"] == 0 and cpu["autocast"] is False
    assert cpu["bytes"]["autocast_weight_copies"] == 0 and cpu["vllm_colocate_reserved"] == 0
    assert cpu["bytes"]["activations_ckpt"] == 2 * memory_plan(
        load_config(ROOT / "configs/models/qwen2.5-0.5b-instruct.yaml"))["bytes"]["activations_ckpt"]
    assert cpu["bytes"]["policy_weights"] == 4 * cpu["params"] == 8 * gpu["bytes"]["policy_weights"]
    with pytest.raises(ValueError):
        memory_plan(cfg, device="tpu")
