"""One pass of checks, one plan (tasks/preflight.py): each decision has one call site in
the product, a held plan is not taken again, and a refusal names the field with the CLI's
exit code. The call sites are read with `ast` (nothing is imported)."""
from __future__ import annotations

import ast
import multiprocessing
from pathlib import Path

import pytest
from mlflow_server import http_standin

from grpo_core.config import config_from_dict
from grpo_core.data.locks import lock_path
from tasks.preflight import (
    PreflightError,
    holding_store,
    launch_of,
    preflight,
    preflight_all,
    reach_tracking,
)

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("grpo_core", "tasks", "flows", "bench", "infra")
# the decision -> the one module that may call it
ONE_CALL_SITE = {"stage_plan": "tasks/preflight.py", "pipeline_lock": "tasks/preflight.py",
                 "check_reachable": "tasks/preflight.py",
                 # the store held: a run's plan (holding_store, once per run) and `grpo
                 # filter`'s shards, the one command that writes without a plan
                 "hold_store": ("tasks/preflight.py", "flows/cli_stages.py"),
                 "holding_store": ("tasks/preflight.py", "flows/cli_run.py"),
                 # the launch mode: the plan's (stage_plan); `grpo filter` / `grpo eval` ask
                 # once each, having no plan; everything else reads LaunchPlan.own_process
                 "own_process": ("tasks/launch.py", "flows/cli_stages.py", "flows/cli_stages.py"),
                 # Prefect's settings: once per process entry (`grpo run`, the stage
                 # commands, a deployment's flow-run process, a bench script), before
                 # prefect is imported
                 "configure_prefect": ("flows/cli_run.py", "flows/cli_stages.py",
                                       "flows/deployments.py", "bench/filter_shards.py")}


def _calls(name: str) -> list[str]:
    """'path:line' of every call of `name` (plain or attribute) in the product's code."""
    found = []
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                    if called == name:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@pytest.mark.parametrize("name", sorted(ONE_CALL_SITE))
def test_each_decision_has_one_call_site(name):
    """Each decision is made at its one call site (per process entry where it names
    several), every other place reads the result."""
    sites = ONE_CALL_SITE[name]
    sites = (sites,) if isinstance(sites, str) else sites
    calls = _calls(name)
    assert sorted(c.split(":")[0] for c in calls) == sorted(sites), calls


def test_call_site_check_sees_a_second_call(tmp_path, monkeypatch):
    extra = ROOT / "flows" / "_probe_second_call.py"
    extra.write_text("def f(cfg):\n    return own_process(cfg)\n")
    try:
        with pytest.raises(AssertionError):
            test_each_decision_has_one_call_site("own_process")
    finally:
        extra.unlink()


def _cfg(tmp_path, *overrides):
    return config_from_dict({"project": {"workdir": str(tmp_path / "wd")}}, list(overrides))


def test_plan_holds_the_store_once_and_only_in_this_process(tmp_path):
    plan = preflight(_cfg(tmp_path))
    assert plan.launch.mode == "in-process" and plan.tracking_uri.startswith("sqlite:///")
    assert not plan.store_held and not lock_path(plan.db_path).exists()
    with holding_store(plan) as held:
        assert held.store_held and lock_path(plan.db_path).exists()
        with holding_store(held) as again:  # given a held plan: yielded as it is
            assert again is held
        # another process is not this one: the plan it is handed does not hold the store
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            assert pool.apply(_held_there, (held.model_dump_json(),)) is False
    assert held.store_held  # the field says who took it; the lock itself is released
    with holding_store(plan) as retaken:  # released: taken again at once
        assert retaken.store_held


def _held_there(plan_json: str) -> bool:
    from tasks.preflight import RunPlan

    return RunPlan.model_validate_json(plan_json).store_held


def test_refusals_name_the_field_with_the_clis_exit_code(tmp_path):
    with pytest.raises(PreflightError, match="eval.benchmarks") as err:
        preflight(_cfg(tmp_path, "eval.benchmarks=[no-such-bench]"))
    assert err.value.exit_code == 2
    with pytest.raises(PreflightError, match="grpo.vllm_mode=server") as err:  # no GPU here
        launch_of(_cfg(tmp_path, "grpo.use_vllm=true", "grpo.vllm_mode=server",
                       "train.vllm_server_gpus=1"))
    assert err.value.exit_code == 2
    with pytest.raises(PreflightError, match="127.0.0.1:9") as err:  # nothing listens on 9
        reach_tracking("http://127.0.0.1:9")
    assert err.value.exit_code == 1


def test_configs_run_together_probe_their_mlflow_server_once(tmp_path):
    """A comparison's configs share one MLflow server: preflight_all asks it once, as
    `grpo run` and a deployed comparison plan them (a stand-in answering 200 and counting
    the requests: no MLflow server is needed to count)."""
    asked = []
    with http_standin(lambda request: asked.append(request.path) or 200) as uri:
        configs = [_cfg(tmp_path, f"project.recipe={r}", f"tracking.tracking_uri={uri}")
                   for r in ("r1_zero", "sft_grpo")]
        plans = preflight_all(configs)
        assert [p.tracking_uri for p in plans] == [uri, uri] and len(asked) == 1
        preflight(configs[0])  # a run of its own asks again
        assert len(asked) == 2
