"""`grpo diagnose`: the diagnosis rules (grpo_core/train/diagnosis.py) over a GRPO round's
per-step metrics, from a JSON-lines file or an MLflow run. Exit 0 whatever it finds; 1
when the input cannot be read; 2 for usage and config errors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import CONFIG, SET, WORKDIR, fail, load_or_exit


def diagnose(
    config: CONFIG = None,
    history: Annotated[Path | None, typer.Option(
        "--history", help="JSON lines, one dict of TRL's per-step metrics a line.")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="MLflow run id of a GRPO round (its per-step metric histories).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print a JSON list of {code, severity, steps, evidence, action}.")] = False,
    set_: SET = None,
    workdir: WORKDIR = None,
) -> None:
    """Run the diagnosis rules over one round's per-step metrics and print the findings,
    one a line starting with its code. Thresholds: the config's diagnosis section."""
    from grpo_core.train.diagnosis import diagnose as run_rules
    from grpo_core.train.diagnosis import is_step_log, parse_history

    if (history is None) == (run is None):
        fail("give one of --history FILE or --run RUN_ID", 2)
    cfg = load_or_exit(config, set_, workdir)
    if history is not None:
        try:
            with history.open(encoding="utf-8") as f:
                rows = parse_history(f)
        except OSError as exc:
            fail(f"cannot read {history}: {exc.strerror or exc}", 1)
        except (ValueError, UnicodeDecodeError) as exc:
            fail(f"{history}: {exc}", 1)
    else:
        rows = [r for r in _run_history(cfg, run) if is_step_log(r)]
    found = run_rules(rows, cfg)
    if as_json:
        typer.echo(json.dumps([f.as_dict() for f in found], indent=2, default=str))
    elif not found:
        typer.echo(f"no findings over {len(rows)} steps")
    else:
        for f in found:
            typer.echo(f.line())


def _run_history(cfg, run_id: str) -> list[dict]:
    from mlflow.exceptions import MlflowException

    from grpo_core.workspace import Workspace, tracking_uri
    from tasks import tracking

    uri = tracking_uri(cfg, Workspace.at(cfg.project.workdir))
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        fail(f"no MLflow store at {uri} (--workdir?)", 1)
    from tasks.preflight import PreflightError, reach_tracking

    try:
        tracking.connect(reach_tracking(uri))
        return tracking.metric_history(run_id)
    except PreflightError as exc:
        fail(str(exc), exc.exit_code)
    except MlflowException as exc:
        fail(f"run {run_id} at {uri}: {exc.message}", 1)


def register(app: typer.Typer) -> None:
    app.command("diagnose")(diagnose)
