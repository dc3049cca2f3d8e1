"""Shared fixtures. Add new ones below in their own section; keep each fixture small.

- `shared_data`: the reference data folder (../shared/data relative to the project root,
  or $GRPO_SHARED_DATA); tests that use it are skipped, with the reason, when it is absent.
- `tmp_workdir`: a fresh workspace folder, exported as $GRPO_WORKDIR for the test.
- `template_db`: a migrated, empty MLflow SQLite store, made once per session (copy it).
- `tracked_config`: a PipelineConfig (recipe r1_zero) whose workdir holds a copy of it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Before any test imports prefect (it reads its settings once, at import): the temporary
# local server gets time to start on a loaded 2-core machine (Prefect's default, 20 s,
# failed a sharded-filter test there), then the rest of Prefect's settings as every process
# entry of the project sets them (flows.configure_prefect: the test session is one).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
from flows import configure_prefect  # noqa: E402 - the settings above first

configure_prefect()


def shared_data_dir() -> Path:
    """Where the reference data should be (it may not exist)."""
    raw = os.environ.get("GRPO_SHARED_DATA")
    return Path(raw) if raw else Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"reference data not found at {path} (set GRPO_SHARED_DATA to its folder)")
    return path


@pytest.fixture
def tmp_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    workdir = tmp_path / "workdir"
    monkeypatch.setenv("GRPO_WORKDIR", str(workdir))
    return workdir


@pytest.fixture(scope="session")
def template_db(tmp_path_factory) -> Path:
    """An empty MLflow SQLite store with its migrations run once: copy it per test."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # runs migrations
    return path


@pytest.fixture
def tracked_config(tmp_path, template_db, monkeypatch):
    """(config, workdir): a config whose workdir holds a migrated, empty SQLite store;
    MLflow's global URI unset; cwd a scratch folder (a stray ./mlruns lands there)."""
    import shutil

    from grpo_core.config import PipelineConfig

    wd = tmp_path / "wd"
    wd.mkdir()
    shutil.copy(template_db, wd / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = PipelineConfig()
    cfg.project.workdir, cfg.project.name, cfg.project.recipe = str(wd), "tracked", "r1_zero"
    return cfg, wd


# TRL's colocate mode writes the torch.distributed variables for vLLM's external launcher.
_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def restore_dist_env():
    """Put the torch.distributed variables back after a test that ran TRL's colocate mode."""
    saved = {k: os.environ.get(k) for k in _DIST_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def vllm_model_path(tmp_path_factory) -> str:
    """builtin:proxy-qwen2-hd32: the smallest heads vLLM's CPU attention takes (vLLM tests)."""
    from grpo_core.modeling.loading import resolve_model_path

    return resolve_model_path("builtin:proxy-qwen2-hd32", tmp_path_factory.mktemp("models"))


HEAVY_LIST = Path(__file__).with_name("heavy.txt")  # tests/update_heavy.py writes it


def heavy_ids() -> set[str]:
    """The default suite's tests that take seconds (tests/heavy.txt: node ids without their
    parameters; a listed id marks every parametrization of it)."""
    lines = HEAVY_LIST.read_text().splitlines() if HEAVY_LIST.exists() else []
    return {line.split("#")[0].strip() for line in lines} - {""}


def pytest_collection_modifyitems(config, items):
    """Slow-marked tests (minutes of training, run on purpose) have no per-test timeout;
    the tests tests/heavy.txt lists get the `heavy` marker (`make test-fast` leaves them
    out: the quick tier)."""
    heavy = heavy_ids()
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.timeout(0))
        if item.nodeid.split("[")[0] in heavy:
            item.add_marker(pytest.mark.heavy)
