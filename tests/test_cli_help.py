"""Every `grpo` command's --help shows the defaults its options document: rich markup used to
read `[default: ...]` as a style tag and swallow it ("Workspace folder .")."""
from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def _commands(group, path: tuple[str, ...] = ()):
    """(command path, command) for every command and group (typer vendors its own click)."""
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _flat(text: str) -> str:
    return " ".join(text.split())  # help output wraps lines anywhere


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "sft", "run", "eval", "filter", "model fetch", "data ingest"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_every_documented_default(path, cmd):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    shown = _flat(result.output)
    for param in cmd.params:
        text = getattr(param, "help", None) or ""
        start = text.find("[default:")
        if start >= 0:
            default = _flat(text[start:text.index("]", start) + 1])
            assert default in shown, f"{' '.join(path)} {param.name}: {default!r} not in --help"


def test_train_help_reads_the_workdir_default_back():
    result = runner.invoke(app, ["train", "--help"])
    assert "Workspace folder [default: $GRPO_WORKDIR or ./.grpo]." in _flat(result.output)
