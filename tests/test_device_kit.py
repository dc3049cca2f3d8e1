"""Device kit (issue 12 item 10): the wheels the lent GPU machine lacks fit the 64 MiB a call
carries, and the GPU smoke's dry run passes on CPU. The download needs PyPI (about 25 s)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "infra" / "device" / "requirements.txt"
LIMIT = 64 * 2**20


def _pins() -> dict[str, str]:
    pins = {}
    for line in REQ.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            pins[name] = ver
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def test_requirements_are_pinned_to_the_tested_versions():
    pins = _pins()
    assert {"trl", "datasets", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime",
            "duckdb", "pydantic", "xxhash"} <= set(pins)
    assert not {"mlflow", "prefect", "vllm", "torch"} & set(pins)
    for name, ver in pins.items():
        assert ver, f"{name} is not pinned"
        try:
            assert version(name) == ver, f"{name}: kit pins {ver}, this venv runs {version(name)}"
        except PackageNotFoundError:
            pytest.fail(f"{name} pinned in the kit but not installed here")


def test_fetched_wheels_fit_the_carry_limit(tmp_path):
    out = tmp_path / "whl"
    r = subprocess.run(["bash", str(ROOT / "infra" / "device" / "fetch_wheels.sh"), str(out)],
                       check=False, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "GRPO_WHEELS_MAX_MIB": "64"})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    wheels = list(out.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"device kit: {len(wheels)} wheels, {size / 2**20:.1f} MiB")
    assert 0 < size < LIMIT
    have = {_norm(w.name.split("-")[0]) for w in wheels}
    assert have == {_norm(n) for n in _pins()}
    assert all(re.search(r"-(py3|cp312|py312)-", w.name) for w in wheels), [w.name for w in wheels]


def test_gpu_smoke_dry_run_passes_on_cpu():
    """Through infra/gpu_smoke.sh (what the GPU machine runs), the same script and configs:
    the pipeline part's config both ways (vLLM on and off) through `grpo config show`."""
    env = {**os.environ, "GRPO_SMOKE_PYTHON": sys.executable, "GRPO_SMOKE_INSTALL": "0"}
    r = subprocess.run(["bash", str(ROOT / "infra" / "gpu_smoke.sh"), "--dry-run",
                        "--parts", "pipeline,hf,grpo_hf"], check=False, capture_output=True,
                       text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "dry run: ok" in r.stdout
    assert "grpo_hf" in r.stdout and "FAILED" not in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("pipeline   ok"))
    assert "grpo config show ok" in line and "rounds=2" in line and "stage_process=auto" in line
    assert "the hf backend" in line  # no vLLM here: said


def test_gpu_smoke_dry_run_fails_on_a_config_grpo_refuses(monkeypatch, tmp_path):
    """The dry run's pipeline check is `grpo config show`'s verdict: a tree it refuses fails."""
    _smoke_module()  # puts infra/device/ on the path, as the script itself does
    import gpu_pipeline
    tree = gpu_pipeline.config_tree(tmp_path, False)
    tree["train"] = {"stage_process": "sometimes"}
    path = gpu_pipeline.write_config(tree, tmp_path / "bad.yaml")
    ok, said = gpu_pipeline.check_with_cli(path)
    assert not ok and "train.stage_process" in said
    ok, _ = gpu_pipeline.check_with_cli(
        gpu_pipeline.write_config(gpu_pipeline.config_tree(tmp_path, True), tmp_path / "ok.yaml"))
    assert ok


def _smoke_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "infra" / "device" / "gpu_smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_weight_probe_sees_a_1e6_step_in_fp32_and_tokens_per_s():
    import types

    import torch

    _smoke_module()  # puts infra/device/ on the path, as the script itself does
    import gpu_smoke_measure as smoke

    model = torch.nn.Linear(4, 4)
    args = types.SimpleNamespace(bf16=True, fp16=False, learning_rate=1e-6)
    probe = smoke.weight_probe()
    probe.on_train_begin(args, None, None, model=model)
    with torch.no_grad():
        model.weight += 1e-6  # one Adam-sized step on fp32 master weights
    probe.on_train_end(args, None, None, model=model)
    w = probe.out
    assert w["master_dtype"] == "float32" and w["autocast"] == "bf16"
    assert w["param_change_norm"] > 0 and w["changed_frac"] > 0
    g = types.SimpleNamespace(per_device_train_batch_size=64, gradient_accumulation_steps=1)
    hist = [{"completions/mean_length": 10.0, "num_tokens": 1000},
            {"completions/mean_length": 20.0, "num_tokens": 3000}]
    assert smoke.grpo_tokens_per_s(hist, g, 2.0) == {"completion_tokens_per_s": 960.0,
                                                     "tokens_per_s": 1500.0}
