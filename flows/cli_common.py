"""Shared CLI plumbing: config loading with exit code 2 on any config error."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from grpo_core.config import ConfigError, PipelineConfig, load_config

CONFIG = Annotated[Path | None, typer.Argument(help="Config YAML [default: the embedded quickstart].")]
SET = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a field: --set grpo.beta=0.02 (repeatable).")]
WORKDIR = Annotated[Path | None, typer.Option(
    "--workdir", help="Workspace folder [default: $GRPO_WORKDIR or ./.grpo].")]


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_or_exit(path: Path | None, overrides: list[str] | None,
                 workdir: Path | None = None) -> PipelineConfig:
    """The validated config, or one line naming the field and exit 2 (before any work)."""
    try:
        cfg = load_config(path, overrides or [])
        if workdir is not None:
            cfg.project.workdir = str(workdir)
        return cfg
    except ConfigError as exc:
        fail(str(exc), 2)
