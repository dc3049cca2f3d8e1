"""A training stage in processes of its own (tasks/launch.py), as the pipeline, `grpo sft`
and `grpo train` start it under a launch plan that is not in-process: the typed result
rank 0 saved (grpo_core.train.saved), with what its step logger noted among the findings."""
from __future__ import annotations

from pathlib import Path

from grpo_core.config import PipelineConfig
from tasks import tracking
from tasks.launch import LaunchPlan, read_rollouts_file, rollouts_file, run_launched
from tasks.vllm_server import vllm_server


def say_plan(plan: LaunchPlan) -> None:
    """A pinned stage says on which GPUs it runs (the Prefect run's log, or stderr)."""
    if plan.message:
        import logging

        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        try:
            get_run_logger().info(plan.message)
        except MissingContextError:
            logging.getLogger("grpo").warning(plan.message)


def launched_sft(cfg: PipelineConfig, workspace: str, mlflow_run: str | None, model_path: str,
                 problems, out: Path, template: str, plan: LaunchPlan):
    """SFT in its own processes: (SFTResult, the findings its step logger noted)."""
    say_plan(plan)
    result, rank0 = run_launched("sft", cfg, model_path, problems, out, template, mlflow_run,
                                 tracking.current_uri() if mlflow_run else None, workspace,
                                 extra_env=plan.env)
    return result, rank0.notes


def launched_round(cfg: PipelineConfig, workspace: str, run_id: str, mlflow_run: str | None,
                   store, sink, model_path: str, problems, out: Path, template: str,
                   resume_step: int, round_no: int, plan: LaunchPlan):
    """The round in its own processes (tasks.launch, under `plan`'s CUDA_VISIBLE_DEVICES,
    beside the round's vLLM server if it launches one); then its rollouts, all of them from
    the rank-0 file, into DuckDB under `run_id` (re-written whole: idempotent on a re-run).
    Returns the RoundResult rank 0 saved."""
    from grpo_core.data.records import drop_rollouts_after

    with vllm_server(cfg, model_path, Path(out) / "vllm-server.log") as gpu_env:
        result, rank0 = run_launched("grpo", cfg, model_path, problems, out, template,
                                     mlflow_run, tracking.current_uri() if mlflow_run else None,
                                     workspace, resume_step, {**gpu_env, **plan.env}, round_no)
    drop_rollouts_after(store, run_id, 0)
    for step, rows in sorted(read_rollouts_file(rollouts_file(out)).items()):
        sink(step, rows)
    sink.flush()
    result.findings += rank0.notes
    return result
