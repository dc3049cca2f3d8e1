"""The `grpo` command line. Exit codes: 0 ok, 1 a stage failed, 2 usage or config error.

Each command group lives in its own module (flows/cli_<group>.py) and is mounted here.
"""
from __future__ import annotations

import typer

app = typer.Typer(
    help="GRPO with verifiable rewards: data, filtering, SFT, GRPO rounds, evaluation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _mount() -> None:
    from flows import cli_data

    app.add_typer(cli_data.app, name="data", help="Ingest and inspect problem sets.")


_mount()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
