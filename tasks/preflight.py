"""One pass of checks before any work, and the plan it produces.

`preflight(cfg)` decides, once per run, what every layer below would otherwise re-check:
the config's benchmarks exist, a fetchable model is fetched, how a stage starts on this
machine (tasks.launch.stage_plan), where MLflow is and that it answers. It returns a `RunPlan`; the flows and stages receive it and
decide none of it again. `holding_store(plan)` takes the store's pipeline lock, once:
`grpo run` takes it before Prefect and the models load, and hands the held plan to the
flow; a flow started by a Prefect worker gets no plan, so it makes one and takes the lock
itself (`planned`).

The installed TRL is checked earlier, at the CLI's start (flows.cli_common): validating a
config reads TRL's installed config class, so that check comes before any config exists.
Each check raises PreflightError with the exit code the CLI uses (2: the config or the
machine cannot run it, naming the field; 1: the tracking server does not answer)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

from grpo_core.config import PipelineConfig
from grpo_core.workspace import Workspace, tracking_uri
from tasks.launch import LaunchPlan, stage_plan
from tasks.tracking import tracking_store


class PreflightError(Exception):
    """A run refused before any work; `exit_code` is what the CLI exits with."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class RunPlan(BaseModel):
    """What preflight decided for one config on this machine."""

    model_config = ConfigDict(frozen=True)

    launch: LaunchPlan  # how SFT and GRPO stages start (in-process, pinned, launch)
    tracking_uri: str  # the MLflow store, probed
    db_path: str  # the workspace store the pipeline lock guards
    lock_timeout: float  # data.store_lock_timeout
    store_held_by: int | None = None  # the pid holding the pipeline lock for this run

    @property
    def store_held(self) -> bool:
        return self.store_held_by == os.getpid()


def launch_of(cfg: PipelineConfig) -> LaunchPlan:
    """How a stage of `cfg` starts on this machine, or PreflightError with the refusal and
    its fix (more processes than GPUs, a vLLM mode this build cannot run)."""
    plan = stage_plan(cfg)
    if plan.mode == "refuse":
        raise PreflightError(plan.message, 2)
    return plan


def reach_tracking(uri: str) -> str:
    """`uri` when the MLflow store answers; PreflightError (exit 1) naming it otherwise."""
    try:
        tracking_store.check_reachable(uri)
    except tracking_store.TrackingUnreachable as exc:
        raise PreflightError(str(exc), 1) from None
    return uri


def check_model(cfg: PipelineConfig) -> None:
    """A fetchable model name not fetched into the workspace: the fetch command to run."""
    from grpo_core.modeling.fetch import unfetched_message

    message = unfetched_message(cfg.model.name_or_path, Workspace.at(cfg.project.workdir).models)
    if message:
        raise PreflightError(message, 2)


def check_benchmarks(cfg: PipelineConfig) -> None:
    """Every benchmark's evaluation split must exist. A user's own benchmark is looked up
    in the workspace store when there is one (read-only; a busy store is left to the stage,
    which finds or misses it later)."""
    from grpo_core.data.benchmarks import BenchmarkError
    from grpo_core.data.benchmarks import check_benchmarks as check
    from grpo_core.data.store import Store, StoreError

    db = Workspace.at(cfg.project.workdir).db_path
    store = None
    if db.exists():
        try:
            store = Store.open(db, read_only=True)
        except StoreError:
            store = None
    try:
        check(cfg, store)
    except BenchmarkError as exc:
        raise PreflightError(f"config error: eval.benchmarks: {exc}", 2) from None
    finally:
        if store is not None:
            store.close()


def preflight(cfg: PipelineConfig, loads_model: bool = True) -> RunPlan:
    """Every check of a run of `cfg`, in the order a user fixes them; its plan.
    `loads_model`: False for a retrain, which starts from the registered champion."""
    if loads_model:
        check_model(cfg)
    check_benchmarks(cfg)
    launch = launch_of(cfg)
    ws = Workspace.at(cfg.project.workdir)
    return RunPlan(launch=launch,
                   tracking_uri=reach_tracking(tracking_uri(cfg, ws)),
                   db_path=str(ws.db_path), lock_timeout=cfg.data.store_lock_timeout)


@contextlib.contextmanager
def hold_store(db_path: str | os.PathLike, timeout: float) -> Iterator[None]:
    """The store's pipeline lock (grpo_core.data.locks: one pipeline per store, released by
    the kernel on any exit; StoreLockedError after `timeout` s), for `grpo filter`'s shards
    and `holding_store`."""
    from grpo_core.data.locks import pipeline_lock

    with pipeline_lock(db_path, timeout):
        yield


@contextlib.contextmanager
def holding_store(plan: RunPlan) -> Iterator[RunPlan]:
    """`plan` with its store's pipeline lock held by this process (grpo_core.data.locks: one
    pipeline per store; StoreLockedError after data.store_lock_timeout). A plan already held
    here is yielded as it is: the lock is taken once per run."""
    if plan.store_held:
        yield plan
        return
    with hold_store(plan.db_path, plan.lock_timeout):
        yield plan.model_copy(update={"store_held_by": os.getpid()})


@contextlib.contextmanager
def planned(cfg: PipelineConfig, plan: RunPlan | None, loads_model: bool = True
            ) -> Iterator[RunPlan]:
    """At a flow's entry: the caller's plan when it holds one (`grpo run`), else this
    config's preflight (a deployment's flow run), with the store held either way."""
    with holding_store(plan if plan is not None else preflight(cfg, loads_model)) as held:
        yield held
