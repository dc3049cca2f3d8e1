"""`grpo sft` and `grpo train`: the training stages on their own, outside the pipeline."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import CONFIG, SET, WORKDIR, fail, load_or_exit, require_supported_trl

MODEL = Annotated[str | None, typer.Option("--model", help="Start from this model [default: config's].")]
OUT = Annotated[Path | None, typer.Option("--out", help="Output folder [default: <workdir>/checkpoints/...].")]


def _setup(config, overrides, workdir, model):
    from grpo_core.data.pool import ingest_sources, training_pool
    from grpo_core.data.store import Store, StoreError
    from grpo_core.modeling.loading import load_tokenizer, resolve_model_path
    from grpo_core.prompts import resolve_template
    from grpo_core.workspace import Workspace

    cfg = load_or_exit(config, overrides, workdir)
    ws = Workspace.at(cfg.project.workdir).ensure()
    path = resolve_model_path(model or cfg.model.name_or_path, ws.models, progress=True)
    try:
        with Store.open(ws.db_path, timeout=30) as store:
            pool = training_pool(cfg, store, ingest_sources(cfg, store))
    except StoreError as exc:
        fail(str(exc), 1)
    template = resolve_template(cfg.model.template, load_tokenizer(path))
    return cfg, ws, path, pool, template


def plan_or_exit(cfg, say: bool = True):
    """How the stage starts on this machine (tasks.launch.launch_plan): in this process only
    on exactly one device; else `accelerate launch`, pinned to the GPUs it uses. A refusal
    exits 2 before any work, with the fix."""
    from tasks.launch import stage_plan

    plan = stage_plan(cfg)
    if plan.mode == "refuse":
        fail(plan.message, 2)
    if say and plan.message:
        typer.echo(plan.message, err=True)
    return plan


def sft(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None, model: MODEL = None,
        out: OUT = None) -> None:
    """SFT cold start on the config's training pool (reasoning traces from solutions)."""
    require_supported_trl()
    from grpo_core.train.sft import SFTResult, run_sft
    from tasks.launch import run_launched

    plan = plan_or_exit(load_or_exit(config, set_, workdir))
    cfg, ws, path, pool, template = _setup(config, set_, workdir, model)
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "sft"
    if plan.mode == "in-process":
        result = run_sft(path, pool, cfg, out, template)
    else:
        res = run_launched("sft", cfg, path, pool, out, template, workspace=str(ws.root),
                           extra_env=plan.env)
        result = SFTResult(res["output_dir"], res["steps"], res["history"])
    typer.echo(f"sft: {result.steps} steps, final loss {result.history[-1]['loss']:.4f}"
               if result.history else f"sft: {result.steps} steps")
    typer.echo(f"model: {result.output_dir}")


def train(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None, model: MODEL = None,
          out: OUT = None, resume: Annotated[bool, typer.Option(
              "--resume", help="Continue from the last checkpoint in --out.")] = False) -> None:
    """One GRPO round on the config's training pool; every completion goes to DuckDB."""
    require_supported_trl()
    from grpo_core.data.records import rollout_sink
    from grpo_core.data.store import Store
    from grpo_core.train.grpo import last_checkpoint, run_grpo_round
    from tasks.stages import launched_round

    plan = plan_or_exit(load_or_exit(config, set_, workdir))
    cfg, ws, path, pool, template = _setup(config, set_, workdir, model)
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "grpo-round-1"
    with Store.open(ws.db_path, timeout=30) as store:
        sink = rollout_sink(store, run_id=str(out), round=1)
        if plan.mode == "in-process":
            result = run_grpo_round(path, pool, cfg, out, template, resume=resume,
                                    rollout_sink=sink)
        else:  # its ranks resume from the last checkpoint: --resume or a fresh --out
            ckpt = last_checkpoint(out)
            if ckpt and not resume:
                fail(f"{out} holds checkpoints: pass --resume, or another --out", 2)
            step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
            result = launched_round(cfg, str(ws.root), str(out), None, store, sink, path, pool,
                                    Path(out), template, step, 1, plan)
    last = result.history[-1] if result.history else {}
    typer.echo(f"grpo: {result.steps} steps; last reward {last.get('reward', float('nan')):.3f}")
    for finding in result.findings:
        typer.echo(f"finding: {finding}")
    typer.echo(f"model: {result.output_dir}")
    if result.stopped_early:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("sft")(sft)
    app.command("train")(train)
