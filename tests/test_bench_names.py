"""The benches take model names as `grpo run` does (bench/harness.py resolved_model): a
fetched name resolves to its folder in the workspace, and one not fetched yet stops the
bench with one line naming `grpo model fetch`, exit 2, before any load could wait on the
hub (the internet cannot exist here: nothing is fetched in these tests)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m-instruct"  # configs/models/smollm2-135m-cpu.yaml's model, by name


@pytest.mark.parametrize("argv", [
    ["bench/real_model.py"],  # the config's own model name
    ["bench/generation.py", "--model", NAME],
], ids=["real_model", "generation"])
def test_an_unfetched_name_stops_the_bench_in_one_line(argv, tmp_path):
    env = {**os.environ, "GRPO_WORKDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    said = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(said) == 1 and f"grpo model fetch {NAME}" in said[0], said
    assert str(tmp_path / "models") in said[0]  # the workspace it looked in


def test_a_fetched_name_resolves_to_its_folder(tmp_path, monkeypatch):
    """A folder laid out as `grpo model fetch` leaves it is what the bench loads."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from harness import resolved_model
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from grpo_core.modeling import fetch

    folder = tmp_path / "models" / NAME
    monkeypatch.setattr(fetch, "is_fetched", lambda path: Path(path) == folder.resolve())
    assert resolved_model(NAME, str(tmp_path)) == str(folder.resolve())
    assert resolved_model("some/hub-id", str(tmp_path)) == "some/hub-id"  # as it is
