"""Shared CLI plumbing: config loading with exit code 2 on any config error."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from grpo_core.config import ConfigError, PipelineConfig, load_config

CONFIG = Annotated[Path | None, typer.Argument(help="Config YAML [default: the embedded quickstart].")]
SET = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a field: --set grpo.beta=0.02 (repeatable).")]
WORKDIR = Annotated[Path | None, typer.Option(
    "--workdir", help="Workspace folder [default: $GRPO_WORKDIR or ./.grpo].")]
LEVELS = Annotated[str | None, typer.Option(
    "--levels", help="synthetic:arith only: difficulty levels 1-5, comma-separated, e.g. 1,2,3 "
    "[default: all; `grpo filter`: the config's data.train levels of that source].")]


def command_group(help: str, **kw) -> typer.Typer:
    """A `grpo` command group. Rich markup off: it reads `[default: ...]` in a help text as a
    style tag and swallows it ("Workspace folder ."); plain help prints it as written."""
    kw = {"no_args_is_help": True, "add_completion": False, **kw}
    return typer.Typer(help=help, rich_markup_mode=None, **kw)


# Third-party noise a `grpo run` log should not carry (unless --verbose): set in the
# environment, so processes launched for training (accelerate) inherit it too.
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bars read it
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # TRL's dataset map bars
    "TQDM_DISABLE": "1",  # any other tqdm bar (the pipeline's own bars are rich)
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # "Downloading artifacts"
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # "Creating initial MLflow database tables..."
}
QUIET_WARNINGS = "ignore::FutureWarning,ignore::UserWarning"


def quiet_libraries() -> None:
    """Library warnings and third-party progress bars off, in this process and its children.
    Called before the libraries are imported (their verbosity is read at import)."""
    import warnings

    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    prior = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = f"{prior},{QUIET_WARNINGS}" if prior else QUIET_WARNINGS
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    if "transformers" in sys.modules:  # imported already: its env settings were read
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def parse_levels(text: str | None, sources: list[str]) -> list[int] | None:
    """--levels as a list (None when not given); one line and exit 2 when it is not levels
    1-5 or no source it applies to (synthetic:arith) is named."""
    if text is None:
        return None
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(not 1 <= lv <= 5 for lv in levels):
        fail(f"config error: levels: --levels takes synthetic levels 1-5, comma-separated "
             f"(e.g. 1,2,3), got {text!r}", 2)
    if not any(s.startswith("synthetic:") for s in sources):
        fail(f"config error: levels: --levels applies to synthetic:arith only, not to "
             f"{', '.join(sources)}", 2)
    return levels


def require_supported_trl() -> None:
    """Start of a training command: a TRL outside the project's range (pyproject.toml; the
    locks pin the tested one) stops here, exit 2, one line naming the installed version and
    the supported range, before any work. Read from metadata: TRL is not imported."""
    from grpo_core.versions import trl_problem

    problem = trl_problem()
    if problem:
        fail(problem, 2)


def require_fetched_or_exit(name: str, workdir: str | os.PathLike | None) -> None:
    """A fetchable model name (grpo_core.modeling.fetch) not yet fetched into the
    workspace stops here, exit 2, one line naming the fetch command, before any work."""
    from grpo_core.modeling.fetch import unfetched_message
    from grpo_core.workspace import Workspace

    message = unfetched_message(name, Workspace.at(workdir).models)
    if message:
        fail(message, 2)


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
