"""The `grpo` command line. Exit codes: 0 ok, 1 a stage failed, 2 usage or config error.

Each command group lives in its own module (flows/cli_<group>.py) and is mounted here.
"""
from __future__ import annotations

import importlib

import typer

from flows.cli_common import CONFIG, SET, command_group, load_or_exit

app = command_group("GRPO with verifiable rewards: data, filtering, SFT, GRPO rounds, evaluation.",
                    pretty_exceptions_enable=False)
config_app = command_group("Inspect configs.")
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: CONFIG = None, set_: SET = None) -> None:
    """Print the resolved config (defaults filled in, overrides applied) as YAML."""
    cfg = load_or_exit(config, set_)
    typer.echo(f"# config hash {cfg.hash()}")
    typer.echo(cfg.to_yaml().rstrip())


def _mount() -> None:
    from flows import cli_data

    app.add_typer(cli_data.app, name="data", help="Ingest and inspect problem sets.")
    for name in ("flows.cli_stages", "flows.cli_train", "flows.cli_run", "flows.cli_model",
                 "flows.cli_diagnose"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(app)


_mount()  # the `grpo` script calls `app` itself (pyproject.toml): one frame fewer to a stage

if __name__ == "__main__":
    app()
