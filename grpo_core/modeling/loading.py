"""Resolve and load a policy: `builtin:tiny-arith`, `builtin:proxy-qwen2` (and -hd32), a fetched name
(`smollm2-135m-instruct`: modeling.fetch), a local folder, or a hub id; `hf_folder`: the
folder of a registered model downloaded from MLflow."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from grpo_core.modeling.fetch import is_fetchable, resolve_fetched
from grpo_core.modeling.proxy import ensure_proxy, proxy_dir, proxy_recipe
from grpo_core.modeling.threads import configure_threads
from grpo_core.modeling.tiny import BUILTIN_PREFIX, ensure_builtin, tiny_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
_HASH_LIMIT = 256 * 2**20  # hash whole files up to this size; above it, sampled chunks


def builtin_dir(name: str, models_cache: str | Path) -> Path | None:
    """Where the built-in model `name` is cached, built or not; None for a folder or hub id."""
    if proxy_recipe(name) is not None and name.startswith(BUILTIN_PREFIX):
        return proxy_dir(models_cache, proxy_recipe(name))
    if name.startswith(BUILTIN_PREFIX):
        return tiny_dir(models_cache)
    return None


def resolve_model_path(name_or_path: str, models_cache: str | Path, progress: bool = False) -> str:
    """A folder (or hub id) transformers can load; builds the built-in model on first use.
    A fetchable name must have been fetched into `models_cache` (NotFetchedError naming
    the fetch command otherwise: fetching downloads, so it is never implicit)."""
    if is_fetchable(name_or_path):
        return str(resolve_fetched(name_or_path, models_cache))
    if name_or_path.startswith(BUILTIN_PREFIX) and proxy_recipe(name_or_path) is not None:
        return str(ensure_proxy(models_cache, proxy_recipe(name_or_path)))
    if name_or_path.startswith(BUILTIN_PREFIX):
        return str(ensure_builtin(name_or_path, models_cache, progress=progress))
    return name_or_path


def model_fingerprint(path: str) -> str:
    """Content key of a checkpoint folder, so caches notice when weights change."""
    p = Path(path)
    if not p.is_dir():
        return hashlib.sha256(path.encode()).hexdigest()[:16]  # hub id: the name is the key
    h = hashlib.sha256()
    # training_args.bin is a pickle of the trainer's arguments (output_dir included), not
    # weights: two folders with the same model must get one key.
    files = sorted(f for f in p.iterdir() if f.name != "training_args.bin"
                   and (f.suffix in WEIGHT_SUFFIXES or f.name == "config.json"))
    for f in files:
        st = f.stat()
        h.update(f.name.encode())
        if st.st_size <= _HASH_LIMIT:
            h.update(f.read_bytes())
        else:
            _hash_sampled(f, st.st_size, h)
    return h.hexdigest()[:16]


def _hash_sampled(path: Path, size: int, h, chunks: int = 64, chunk: int = 1 << 16) -> None:
    """Size plus 64 chunks of 64 KiB spread over a big weights file: content-based (the
    same weights in two folders, or after a copy, get one key; the mtime would differ)
    and fast on multi-GB files. A training step rewrites nearly every byte, so sampled
    chunks see it."""
    h.update(str(size).encode())
    with path.open("rb") as fh:
        for i in range(chunks):
            fh.seek((size - chunk) * i // (chunks - 1))
            h.update(fh.read(chunk))


def use_hub_token(cfg) -> None:
    """Hand model.hub_token to huggingface_hub the way it reads tokens (HF_TOKEN), for
    this process only; an HF_TOKEN already set wins."""
    token = cfg.model.hub_token
    masked = token is not None and set(token.get_secret_value()) <= {"*"}  # a dumped config
    if token is not None and not masked and not os.environ.get("HF_TOKEN"):
        os.environ["HF_TOKEN"] = token.get_secret_value()


def load_tokenizer(path: str, gguf_file: str | None = None,
                   padding_side: str | None = "left"):
    """The tokenizer of a model folder or hub id (read from `gguf_file` in it when given),
    with a pad token (eos when it has none), padded on `padding_side` (left, as the samplers
    pad prompts; None keeps the tokenizer's own). The one tokenizer loader of the pipeline;
    only modeling.fetch.gguf_to_hf reads a GGUF tokenizer itself, to save it unchanged."""
    from transformers import AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(path: str, dtype, gguf_file: str | None = None):
    """The causal LM of a model folder or hub id (read from `gguf_file` in it when given)
    in `dtype` (a torch dtype, or "auto": the dtype it is stored in). The one model loader
    of the pipeline: load_policy (sampling) and load_for_training (fp32 master weights)
    call it; only modeling.fetch.gguf_to_hf reads a GGUF model itself, to convert it."""
    from transformers import AutoModelForCausalLM

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)


def resolve_precision(mode: str) -> str:
    """The one "auto" rule, for training (train.precision) and sampling (model.dtype):
    bf16 on a GPU that supports it, else fp16 on GPU, fp32 on CPU. Other modes pass
    through; the dtype names model.dtype uses (float32, bfloat16, float16) become these."""
    import torch

    mode = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(mode, mode)
    if mode != "auto":
        return mode
    if not torch.cuda.is_available():
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def load_policy(path: str, dtype: str = "auto", gguf_file: str | None = None):
    """(model, tokenizer) in eval mode, tokenizer as load_tokenizer gives it."""
    import torch

    configure_threads()
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16,
                   "fp16": torch.float16}[resolve_precision(dtype)]
    tokenizer = load_tokenizer(path, gguf_file)
    model = load_causal_lm(path, torch_dtype, gguf_file)
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    return model, tokenizer


def stored_dtype(model_path: str):
    """The dtype a checkpoint's weights are stored in (config dtype / torch_dtype)."""
    import torch
    from transformers import AutoConfig

    dtype = getattr(AutoConfig.from_pretrained(model_path), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load_for_training(model_path: str):
    """(policy in float32, the checkpoint's stored dtype). transformers 5 would load a
    bf16-stored checkpoint in bf16, where Adam steps of ~1e-6 on weights of ~0.02 round
    away: the master weights are float32, autocast (train.precision) does the rest."""
    import torch

    return load_causal_lm(model_path, torch.float32), stored_dtype(model_path)


def hf_folder(root: str | os.PathLike) -> Path:
    """The from_pretrained folder of a downloaded registered model: `root` holding
    config.json, or an MLflow transformers model's model/ (read from its MLmodel file) with
    its components' (tokenizer) files copied in."""
    root = Path(root)
    if (root / "config.json").is_file():
        return root
    if not (root / "MLmodel").is_file():
        raise LookupError(f"{root} holds neither config.json nor an MLmodel file")
    import yaml

    flavors = (yaml.safe_load((root / "MLmodel").read_text(encoding="utf-8")) or {}).get("flavors")
    conf = (flavors or {}).get("transformers") or {}
    weights = root / conf.get("model_binary", "model")
    if not (weights / "config.json").is_file():
        raise LookupError(f"{root}: no config.json under {weights.name}/ (a transformers "
                          f"flavour saved with save_pretrained=False holds no weights)")
    for component in conf.get("components", []):
        src = root / "components" / component
        for f in src.iterdir() if src.is_dir() else ():
            if f.is_file() and not (weights / f.name).exists():
                shutil.copy2(f, weights / f.name)
    return weights
