"""`grpo run`, `grpo compare`, `grpo report`, `grpo doctor`: the main job and its views."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import (
    CONFIG,
    SET,
    WORKDIR,
    fail,
    load_or_exit,
    quiet_libraries,
    require_supported_trl,
)


def run(config: CONFIG = None, set_: SET = None, workdir: WORKDIR = None,
        quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Keep library warnings and third-party progress bars.")] = False,
        smoke: Annotated[bool, typer.Option(
            "--smoke", help="Run CONFIG's whole DAG on a CPU in minutes: same stages and "
            "rules, builtin:proxy-qwen2, 2 steps per stage, 4 problems per benchmark, in "
            "<workdir>/smoke; writes <workdir>/reports/smoke.json with a GPU memory plan.")] = False,
        model: Annotated[str | None, typer.Option(
            "--model", help="With --smoke: the model to run instead of builtin:proxy-qwen2.")] = None,
        gpu_gb: Annotated[float, typer.Option(
            "--gpu-gb", min=1, help="With --smoke: GPU memory in GB (10^9 bytes, as GPUs are "
            "named: 80 for an H100 80GB) the plan must fit.")] = 80.0) -> None:
    """Run a config through the pipeline; with no CONFIG, compare R1-Zero and SFT+GRPO on
    the built-in model and synthetic task (offline, minutes on a CPU)."""
    require_supported_trl()
    if not verbose:
        quiet_libraries()
    from grpo_core.config import ConfigError
    from grpo_core.workspace import Workspace
    # Live bars only on a terminal: a log file gets the stage lines, not bar redraws.
    quiet = quiet or not sys.stderr.isatty()

    # Validate everything before any work (no Prefect/MLflow import, nothing written):
    # one line naming the field, exit 2.
    if config is None:
        from flows.recipes import default_recipes

        try:
            configs = default_recipes(set_)
        except ConfigError as exc:
            fail(str(exc), 2)
        if workdir is not None:
            for c in configs:
                c.project.workdir = str(workdir)
    else:
        from flows.recipes import expand_recipes

        configs = expand_recipes(load_or_exit(config, set_, workdir))
    compare_them = len(configs) > 1  # the default pair, or a config's project.recipes
    if smoke or model is not None:
        real = configs[0]
        configs = [_smoke_config_or_exit(config, real, model, smoke)]
    from tasks.preflight import PreflightError, holding_store, preflight_all

    try:  # every check before any work: exit 2 naming the field, 1 for a silent MLflow
        plans = preflight_all(configs)  # each MLflow store probed once
    except PreflightError as exc:
        fail(str(exc), exc.exit_code)
    uri = plans[0].tracking_uri
    ws = Workspace.at(configs[0].project.workdir)
    from flows import configure_prefect

    configure_prefect(ws.root)
    from grpo_core.data.stage_split import PoolExhausted
    from grpo_core.data.store import StoreLockedError

    t0 = time.time()
    try:
        # Take the store before Prefect and the models load: a second `grpo run` on this
        # workspace waits here, then stops in seconds. The flows get the held plans and take
        # nothing again (a flow started by a Prefect worker makes its own plan).
        with holding_store(plans[0]) as held:
            plans = [p.model_copy(update={"store_held_by": held.store_held_by}) for p in plans]
            if compare_them and not smoke:
                from flows.compare import compare_recipes

                out = compare_recipes(configs, progress=not quiet, plans=plans)
                typer.echo(out["markdown"])
                if out.get("verdict"):
                    typer.echo(f"\nverdict: {out['verdict']}")
                typer.echo(f"\nreport: {out['report_dir']}/comparison.md (.csv, .png)")
                links = {"comparison run": out["links"]["run"], **_table_link(out["links"])}
            elif smoke:
                from flows.smoke import format_report, run_smoke

                report, path = run_smoke(real, configs[0], Workspace.at(real.project.workdir).root,
                                         gpu_gb, progress=not quiet, plan=plans[0])
                typer.echo(format_report(report))
                typer.echo(f"report: {path}")
            else:
                from flows.pipeline import grpo_pipeline

                out = grpo_pipeline(configs[0], progress=not quiet, plan=plans[0])
                for bench, res in out.final.items():
                    m = res.metric(configs[0].eval.primary_metric)
                    typer.echo(f"{bench}: {configs[0].eval.primary_metric} {m.get('mean')} "
                               f"[{m.get('lo')}, {m.get('hi')}]")
                from grpo_core.findings import count_findings

                typer.echo(count_findings(out.findings))
                for f in out.findings:
                    typer.echo(f"finding: {f}")
                typer.echo(f"model: {out.model_dir}")
                report = out.registered
                links = {"parent run": report.get("links", {}).get("run"),
                         "model version": report.get("links", {}).get("model_version"),
                         **_table_link(report.get("links") or {})}
    except KeyboardInterrupt:
        fail("interrupted; run the same command again to resume", 130)
    except StoreLockedError as exc:
        fail(str(exc), 1)
    except PoolExhausted as exc:  # the data cannot feed the rounds: before any training
        fail(str(exc), exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - any stage failure: say which, exit 1
        fail(f"pipeline failed: {type(exc).__name__}: {exc}", 1)
    typer.echo(f"done in {time.time() - t0:.0f} s.")
    if not smoke:
        _echo_links(uri, links)


def _table_link(links: dict) -> dict:
    return {"runs table": links["runs_table"]} if links.get("runs_table") else {}


def _echo_links(uri: str, links: dict) -> None:
    """Where to look: for a local store, the command that serves its UI first."""
    if not uri.startswith(("http://", "https://")):
        typer.echo(f"Serve the MLflow UI with:\n  mlflow ui --backend-store-uri {uri}\nthen open:")
    for what, url in links.items():
        if url:
            typer.echo(f"  {what}: {url}")


def _smoke_config_or_exit(config, real, model: str | None, smoke: bool):
    """The --smoke config of `real` (flows/smoke.py), or exit 2 naming the field."""
    from grpo_core.config import ConfigError

    if not smoke:
        fail("--model: only with --smoke (set model.name_or_path to change the model)", 2)
    if config is None:
        fail("--smoke: give a CONFIG to smoke-test", 2)
    from flows.smoke import smoke_overrides

    try:
        return smoke_overrides(real, model=model)
    except ConfigError as exc:
        fail(f"--smoke: {exc}", 2)


def compare(experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment.")] = None,
            workdir: WORKDIR = None) -> None:
    """Print the recipe comparison table from existing MLflow runs."""
    from flows.compare import to_markdown
    from grpo_core.config import PipelineConfig
    from grpo_core.workspace import Workspace, tracking_uri
    from tasks import tracking

    cfg = PipelineConfig()
    if workdir is not None:
        cfg.project.workdir = str(workdir)
    ws = Workspace.at(cfg.project.workdir)
    uri = tracking_uri(cfg, ws)
    rows = tracking.compare_table(uri, experiment or "recipes")
    if not rows:
        fail(f"no finished pipeline runs in experiment {experiment or 'recipes'!r}", 1)
    said = tracking.comparison_verdict(uri, experiment or "recipes")
    if said:
        typer.echo(f"verdict: {said}\n")
    typer.echo(to_markdown(rows))


def report(workdir: WORKDIR = None) -> None:
    """Print the last comparison report of the workspace."""
    from grpo_core.workspace import Workspace

    path = Workspace.at(workdir).root / "reports" / "comparison.md"
    if not path.is_file():
        fail(f"no report at {path}; run `grpo run` first", 1)
    typer.echo(path.read_text())


def doctor(workdir: WORKDIR = None) -> None:
    """Check installed versions against the lock (locks/), TRL's and vLLM's ranges, the NVIDIA
    driver against torch's CUDA, torch/CUDA/vLLM, MLflow and Prefect reachability, workspace,
    data dir."""
    from grpo_core.config import PipelineConfig
    from grpo_core.generation.rollout import vllm_available
    from grpo_core.workspace import Workspace, resolve_data_dir, tracking_uri

    ok = True

    def line(good: bool, what: str) -> None:
        nonlocal ok
        ok &= good
        typer.echo(f"[{'ok' if good else 'FAIL'}] {what}")

    import torch

    line(True, f"torch {torch.__version__}, CUDA {'available: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'not available (CPU)'}")
    from grpo_core.generation.vllm_cpu import vllm_build

    build = vllm_build()
    typer.echo("[info] vLLM " + ("not installed (hf backend; `make setup-vllm` on CPU)" if build is None
                                 else f"{build.upper()} build, "
                                 + ("available" if vllm_available() else "no GPU (hf backend)")))
    from grpo_core.versions import doctor_lines

    for status, text in doctor_lines():
        if status == "WARN":
            typer.echo(f"[WARN] {text}")
        else:
            line(status == "ok", text)
    cfg = PipelineConfig()
    ws = Workspace.at(workdir)
    try:
        ws.ensure()
        probe = ws.root / ".doctor"
        probe.write_text("ok")
        probe.unlink()
        line(True, f"workspace writable: {ws.root}")
    except OSError as exc:
        line(False, f"workspace {ws.root}: {exc}")
    from tasks.preflight import PreflightError, reach_tracking

    uri = tracking_uri(cfg, ws)
    try:
        reach_tracking(uri)
        line(True, f"MLflow tracking URI reachable: {uri}")
    except PreflightError as exc:
        line(False, str(exc))
    api = os.environ.get("PREFECT_API_URL")
    if api:
        import urllib.request

        try:
            urllib.request.urlopen(api.rstrip("/") + "/health", timeout=5)
            line(True, f"Prefect API reachable: {api}")
        except OSError as exc:
            line(False, f"Prefect API {api}: {exc}")
    else:
        typer.echo("[info] PREFECT_API_URL unset: flows start a temporary local server")
    data = resolve_data_dir(None)
    if data is None:
        shared = Path(__file__).resolve().parents[2] / "shared" / "data"
        typer.echo(f"[info] GRPO_DATA_DIR unset; presets load from the hub"
                   f"{f' (local copies exist at {shared}: export GRPO_DATA_DIR={shared})' if shared.is_dir() else ''}")
    else:
        line(data.is_dir(), f"data dir {'found' if data.is_dir() else 'missing'}: {data}")
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("compare")(compare)
    app.command("report")(report)
    app.command("doctor")(doctor)
