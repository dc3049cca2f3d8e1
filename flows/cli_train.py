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
            ingest_sources(cfg, store)
            pool = training_pool(cfg, store)
    except StoreError as exc:
        fail(str(exc), 1)
    template = resolve_template(cfg.model.template, load_tokenizer(path))
    return cfg, ws, path, pool, template


def sft(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None, model: MODEL = None,
        out: OUT = None) -> None:
    """SFT cold start on the config's training pool (reasoning traces from solutions)."""
    require_supported_trl()
    from grpo_core.train.sft import run_sft

    cfg, ws, path, pool, template = _setup(config, set_, workdir, model)
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "sft"
    result = run_sft(path, pool, cfg, out, template)
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
    from grpo_core.train.grpo import run_grpo_round

    cfg, ws, path, pool, template = _setup(config, set_, workdir, model)
    out = out or ws.checkpoints / f"{cfg.project.name}-{cfg.hash()}" / "grpo-round-1"
    with Store.open(ws.db_path, timeout=30) as store:
        result = run_grpo_round(path, pool, cfg, out, template, resume=resume,
                                rollout_sink=rollout_sink(store, run_id=str(out), round=1))
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
