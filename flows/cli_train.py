"""`grpo sft` and `grpo train`: the training stages on their own, outside the pipeline."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows import cli_common
from flows.cli_common import CONFIG, SET, WORKDIR, fail, load_or_exit, require_supported_trl

MODEL = Annotated[str | None, typer.Option(
    "--model", help="Start from this model: a name (builtin:tiny-arith, smollm2-135m-instruct once "
    "fetched), a folder or a hub id [default: config's].")]
VERBOSE = Annotated[bool, typer.Option(
    "--verbose", help="Keep library warnings and third-party progress bars.")]
OUT = Annotated[Path | None, typer.Option("--out", help="Output folder [default: <workdir>/checkpoints/...].")]


def _setup(config, overrides, workdir, model, stage: str):
    """`stage` ("sft" or "grpo"): the pool's rows it reads are what that stage can use
    (tasks/stage_data.py: the same bounds as in the pipeline)."""
    from grpo_core.data.pool import (
        build_pool,
        ingest_sources,
        part_size,
        query_problems,
        training_sets,
    )
    from grpo_core.data.stage_split import parts
    from grpo_core.data.store import Store, StoreError
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace
    from tasks.stage_data import rl_trainable, sft_part, stage_reads

    cfg = load_or_exit(config, overrides, workdir)
    cli_common.require_fetched_or_exit(model or cfg.model.name_or_path, cfg.project.workdir)
    ws = Workspace.at(cfg.project.workdir).ensure()
    path = resolve_model_path(model or cfg.model.name_or_path, ws.models, progress=True)
    try:
        with Store.open(ws.db_path, timeout=30) as store:
            ref = build_pool(cfg, store, training_sets(cfg, ingest_sources(cfg, store)))
            if stage == "sft":  # the pipeline's parts: SFT's, or the RL part's rows
                part = sft_part(cfg, ref)  # (but the probe's held-back tail)
            else:
                part = rl_trainable(cfg, ref, part_size(store, ref.pool, parts(cfg)[1],
                                                        cfg.data.sft_share))
            pool = query_problems(store, part, *stage_reads(cfg, stage))
    except StoreError as exc:
        fail(str(exc), 1)
    # model.template as configured: the trainer resolves "auto" with the tokenizer it loads
    return cfg, ws, path, pool, cfg.model.template


def plan_or_exit(cfg):
    """How the stage starts on this machine (tasks.launch.launch_plan): in this process only
    on exactly one device; else `accelerate launch`, pinned to the GPUs it uses. A refusal
    exits 2 before any work, with the fix."""
    from tasks.preflight import PreflightError, launch_of

    try:
        plan = launch_of(cfg)
    except PreflightError as exc:
        fail(str(exc), exc.exit_code)
    if plan.message:
        typer.echo(plan.message, err=True)
    return plan


def _start(verbose: bool) -> None:
    """Before any library import: TRL in range, library noise off unless --verbose (the
    step lines on stderr say what happens)."""
    require_supported_trl()
    if not verbose:
        cli_common.quiet_libraries()


def sft(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None, model: MODEL = None,
        out: OUT = None, verbose: VERBOSE = False) -> None:
    """SFT cold start on the config's training pool (reasoning traces from solutions).
    One line per step on stderr (s/step, tokens/s, loss)."""
    _start(verbose)
    from grpo_core.train.graceful_stop import StopOnSignal
    from grpo_core.train.sft import run_sft
    from grpo_core.train.step_progress import StepProgress
    from tasks.launch import run_launched

    plan = plan_or_exit(load_or_exit(config, set_, workdir))
    cfg, ws, path, pool, template = _setup(config, set_, workdir, model, "sft")
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "sft"
    stop = StopOnSignal()  # in this process only: launched ranks get the default signals
    if plan.mode == "in-process":
        with stop.installed():
            result = run_sft(path, pool, cfg, out, template,
                             extra_callbacks=[StepProgress("sft"), stop])
    else:
        result, _ = run_launched("sft", cfg, path, pool, out, template, workspace=str(ws.root),
                                 extra_env=plan.env)
    typer.echo(f"sft: {result.steps} steps, final loss {result.history[-1]['loss']:.4f}"
               if result.history else f"sft: {result.steps} steps")
    typer.echo(f"model: {result.output_dir}")
    _exit_if_stopped(stop, result.steps, "")


def _exit_if_stopped(stop, steps: int, then: str) -> None:
    """After a SIGINT/SIGTERM stop (a checkpoint and the model saved): say so, exit 128+signal."""
    if stop.signum:
        typer.echo(f"stopped by {stop.signal_name} after step {steps}: checkpoint and model "
                   f"saved{then}", err=True)
        raise typer.Exit(stop.exit_code)


def train(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None, model: MODEL = None,
          out: OUT = None, resume: Annotated[bool, typer.Option(
              "--resume", help="Continue from the last checkpoint in --out.")] = False,
          verbose: VERBOSE = False) -> None:
    """One GRPO round on the config's training pool; every completion goes to DuckDB.
    One line per step on stderr (s/step, tokens/s, loss, reward)."""
    _start(verbose)
    from grpo_core.data.records import rollout_sink
    from grpo_core.data.store import Store
    from grpo_core.train.graceful_stop import StopOnSignal
    from grpo_core.train.grpo import checkpoint_step, last_checkpoint, run_grpo_round
    from grpo_core.train.step_progress import StepProgress
    from tasks.stage_run import launched_round

    plan = plan_or_exit(load_or_exit(config, set_, workdir))
    cfg, ws, path, pool, template = _setup(config, set_, workdir, model, "grpo")
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "grpo-round-1"
    with Store.open(ws.db_path, timeout=30) as store:
        sink = rollout_sink(store, run_id=str(out), round=1)
        stop = StopOnSignal()  # in this process only: launched ranks get the default signals
        if plan.mode == "in-process":
            with stop.installed():
                result = run_grpo_round(path, pool, cfg, out, template, resume=resume,
                                        rollout_sink=sink,
                                        extra_callbacks=[StepProgress("grpo"), stop])
        else:  # its ranks resume from the last checkpoint: --resume or a fresh --out
            ckpt = last_checkpoint(out)
            if ckpt and not resume:
                fail(f"{out} holds checkpoints: pass --resume, or another --out", 2)
            step = checkpoint_step(ckpt)
            result = launched_round(cfg, str(ws.root), str(out), None, store, sink, path, pool,
                                    Path(out), template, step, 1, plan)
    last = result.history[-1] if result.history else {}
    typer.echo(f"grpo: {result.steps} steps; last reward {last.get('reward', float('nan')):.3f}")
    for finding in result.findings:
        typer.echo(f"finding: {finding}")
    typer.echo(f"model: {result.output_dir}")
    _exit_if_stopped(stop, result.steps, " (same command with --resume continues)")
    if result.stopped_early:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("sft")(sft)
    app.command("train")(train)
