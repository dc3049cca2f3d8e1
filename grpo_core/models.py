"""Resolve and load a policy: `builtin:tiny-arith`, a local folder, or a hub id."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from grpo_core.tiny_model import BUILTIN_PREFIX, ensure_builtin

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
_HASH_LIMIT = 256 * 2**20  # hash contents up to this size; above it, names+sizes+mtimes


def resolve_model_path(name_or_path: str, models_cache: str | Path, progress: bool = False) -> str:
    """A folder (or hub id) transformers can load; builds the built-in model on first use."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        return str(ensure_builtin(name_or_path, models_cache, progress=progress))
    return name_or_path


def model_fingerprint(path: str) -> str:
    """Content key of a checkpoint folder, so caches notice when weights change."""
    p = Path(path)
    if not p.is_dir():
        return hashlib.sha256(path.encode()).hexdigest()[:16]  # hub id: the name is the key
    h = hashlib.sha256()
    files = sorted(f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES or f.name == "config.json")
    for f in files:
        st = f.stat()
        h.update(f.name.encode())
        if st.st_size <= _HASH_LIMIT:
            h.update(f.read_bytes())
        else:
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def configure_threads() -> None:
    """Torch intra-op threads from $GRPO_TORCH_THREADS. Tiny models run faster on one
    thread when anything else competes for the cores (OpenMP spin-waits)."""
    n = os.environ.get("GRPO_TORCH_THREADS")
    if n:
        import torch

        torch.set_num_threads(max(1, int(n)))


def load_policy(path: str, dtype: str = "auto", gguf_file: str | None = None):
    """(model, tokenizer) in eval mode, tokenizer left-padded with a pad token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    configure_threads()
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **kw)
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer
