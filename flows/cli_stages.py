"""`grpo filter` and `grpo eval`: the difficulty filter and evaluation from the shell.

Mounted on the main app by `register(app)`. Exit codes: 0 ok; 1 the stage failed (store
locked, model unloadable); 2 usage or config error (one line on stderr).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from flows.cli_common import LEVELS, parse_levels, require_fetched_or_exit

console = Console(highlight=False, soft_wrap=True)

MODEL = Annotated[str | None, typer.Option(
    "--model", help="builtin:tiny-arith, builtin:proxy-qwen2, a fetched name (grpo model fetch "
    "smollm2-135m-instruct), a local folder or a hub id [default: model.name_or_path "
    "of the config, builtin:tiny-arith].")]
CONFIG = Annotated[Path | None, typer.Option("--config", help="Pipeline config YAML.")]
SET = Annotated[list[str] | None, typer.Option(
    "--set", help="Config override key.path=value (repeatable), e.g. --set filter.top_p=0.9.")]
WORKDIR = Annotated[Path | None, typer.Option(
    "--workdir", help="Workspace folder [default: $GRPO_WORKDIR or ./.grpo].")]
DATA_DIR = Annotated[Path | None, typer.Option(
    "--data-dir", help="Local copies of the presets laid out like shared/data "
    "[default: $GRPO_DATA_DIR, else the hub].")]
TEMPLATE = Annotated[str | None, typer.Option(
    "--template", help="Prompt template: auto, r1_zero or chat [default: model.template].")]
JSON_OUT = Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _config(config: Path | None, overrides: list[str] | None, **fields):
    """Load + override + validate; one line and exit 2 on any config error. `fields` are
    the command's own options (dotted keys), set as values, not parsed as YAML."""
    from grpo_core.config import ConfigError, config_from_dict, load_config

    try:
        cfg = load_config(config, list(overrides or []))
        tree = cfg.model_dump(mode="json")
        for dotted, value in fields.items():
            if value is not None:
                *parents, leaf = dotted.split(".")
                node = tree
                for part in parents:
                    node = node[part]
                node[leaf] = value
        cfg = config_from_dict(tree)
    except ConfigError as exc:
        _fail(str(exc), 2)
    require_fetched_or_exit(cfg.model.name_or_path, cfg.project.workdir)
    from flows import configure_prefect

    configure_prefect(cfg.project.workdir)  # this command's entry: before any prefect import
    return cfg


def _parse_band(band: str | None) -> list[float] | None:
    if band is None:
        return None
    try:
        lo, hi = (float(x) for x in band.split(","))
    except ValueError:
        _fail(f"config error: filter.band: --band must look like 0.3,0.7, got {band!r}", 2)
    return [lo, hi]


def _open_store(cfg, timeout: float = 5.0):
    from grpo_core.data.store import Store, StoreError
    from grpo_core.workspace import Workspace

    try:
        return Store.open(Workspace.at(cfg.project.workdir).db_path, timeout=timeout)
    except StoreError as exc:
        _fail(str(exc), 1)


def _shard_flows(cfg):
    """flows.shards (Prefect's home in this command's workspace: `_config` set it)."""
    import flows.shards

    return flows.shards


def _progress(as_json: bool) -> bool:
    return not as_json and sys.stderr.isatty()


def _building_note(model: str) -> None:
    if model.startswith("builtin:"):
        typer.echo(f"using {model} (built into the workspace once, ~2 min on 2 cores)",
                   err=True)


def filter_cmd(
    model: MODEL = None,
    source: Annotated[list[str] | None, typer.Option(
        "--source", help="Problem source(s) to filter: ingested name, preset, file or "
        "synthetic:arith [default: data.train of the config].")] = None,
    k: Annotated[int | None, typer.Option("--k", help="Samples per prompt [default 8].")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", help="Filter at most N problems per source.")] = None,
    band: Annotated[str | None, typer.Option(
        "--band", help="Keep pass rates in LO,HI [default 0.3,0.7].")] = None,
    workdir: WORKDIR = None,
    data_dir: DATA_DIR = None,
    template: TEMPLATE = None,
    config: CONFIG = None,
    overrides: SET = None,
    as_json: JSON_OUT = False,
    plot: Annotated[Path | None, typer.Option(
        "--plot", help="Also write the pass-rate histogram as a PNG here.")] = None,
    levels: LEVELS = None,
) -> None:
    """Estimate each prompt's pass rate under the model and keep the in-band ones."""
    from flows.prefill import prefill_sharded
    from grpo_core.data.readers import SourceUnreadable
    from grpo_core.data.records import stage_problems
    from grpo_core.data.source import SourceError
    from grpo_core.data.store import StoreLockedError
    from grpo_core.eval.difficulty import run_filter
    from grpo_core.workspace import Workspace
    from tasks.launch import own_process
    from tasks.plots import passrate_figure, save_png
    from tasks.preflight import hold_store

    cfg = _config(config, overrides, **{
        "model.name_or_path": model, "filter.k": k, "filter.band": _parse_band(band),
        "project.workdir": str(workdir) if workdir else None,
        "data.data_dir": str(data_dir) if data_dir else None, "model.template": template})
    sources = ([(s, None, next((d.levels for d in cfg.data.train if d.source == s), None))
                for s in source] if source else
               [(d.source, d.split, d.levels) for d in cfg.data.train])
    chosen = parse_levels(levels, [s for s, _, _ in sources])
    if chosen is not None:  # --levels: every synthetic source filtered
        sources = [(s, split, chosen if s.startswith("synthetic:") else lv)
                   for s, split, lv in sources]
    progress = _progress(as_json)
    with _open_store(cfg) as store:
        problems: list = []
        try:
            for name, split, levels in sources:
                n = limit or next((d.limit for d in cfg.data.train if d.source == name), None)
                problems += stage_problems(name, split or "train", store=store,
                                           data_dir=cfg.data.data_dir, limit=n,
                                           seed=cfg.project.seed, levels=levels)
        except SourceError as exc:
            _fail(str(exc), 2)
        except SourceUnreadable as exc:
            _fail(str(exc), 1)
        if not problems:
            _fail(f"no problems in {', '.join(s for s, _, _ in sources)}", 1)
    _building_note(cfg.model.name_or_path)
    try:
        # filter.shards > 1: workers sample what is missing while the store is closed
        ws = Workspace.at(cfg.project.workdir)
        with hold_store(ws.db_path, cfg.data.store_lock_timeout):  # the shards' folders
            fresh = prefill_sharded(cfg, cfg.model.name_or_path, lambda: problems,
                                    lambda: _open_store(cfg), ws.root, progress=progress,
                                    own_process=own_process(cfg))
        with _open_store(cfg) as store:
            report = run_filter(cfg.model.name_or_path, problems, cfg, store=store,
                                progress=progress, fresh=fresh)
    except StoreLockedError as exc:  # a pipeline running on this workspace holds it
        _fail(str(exc), 1)
    except OSError as exc:
        _fail(f"cannot load model {cfg.model.name_or_path}: "
              f"{str(exc).strip().splitlines()[0]}", 1)
    if plot:
        save_png(passrate_figure([r["pass_rate"] for r in report.estimates], report.band,
                                 bins=report.k), plot)
    if as_json:
        typer.echo(json.dumps(report.summary(), indent=2))
        return
    c = report.counts
    console.print(f"filtered {report.considered} problems with k={report.k} in "
                  f"{report.seconds:.1f}s ({report.estimated} estimated, {report.reused} "
                  "reused from the store)")
    console.print(f"  too easy: {c['too_easy']}   in band {list(report.band)}: "
                  f"{c['in_band']}   too hard: {c['too_hard']}")
    if report.unverifiable:
        console.print(f"  left out: {report.unverifiable} problems whose gold does not parse")
    console.print("pass rate histogram:")
    console.print(report.text_histogram())
    if plot:
        console.print(f"histogram plot: {plot}")


def _ci(m: dict | None) -> tuple[str, str, str]:
    if not m:
        return "-", "-", "-"
    return f"{m['mean']:.3f}", f"[{m['lo']:.3f}, {m['hi']:.3f}]", str(m["n"])


def _print_eval(result) -> None:
    from grpo_core.eval.metric_names import GREEDY, metric_name, parse_metric

    m = result.metrics
    table = Table(title=f"{result.benchmark}: {result.model} (protocol {result.protocol_hash})")
    for col, just in (("metric", "left"), ("value", "right"), ("95% CI", "right"),
                      ("n", "right")):
        table.add_column(col, justify=just)
    parsed = {n: p for n in m if (p := parse_metric(n)) is not None}
    # strict extraction first, then flexible; greedy accuracy first in each, kind@k as scored
    names = sorted(parsed, key=lambda n: (parsed[n].extraction != "strict",
                                          parsed[n].kind != GREEDY)) + ["format_adherence"]
    for name in names:
        if m.get(name):
            table.add_row(name, *_ci(m[name]))
    for kind, rate in (m.get("truncation_rate") or {}).items():
        if rate is not None and kind != "all":
            table.add_row(f"truncation_rate ({kind})", f"{rate:.3f}", "", "")
    console.print(table)
    head = metric_name("avg", m["k"]) if m.get("k") else None
    for label in ("by_level", "by_subject"):
        groups = m.get(label)
        if not groups or len(groups) < 2:
            continue
        t = Table(title=label.replace("_", " "))
        t.add_column(label.removeprefix("by_"))
        t.add_column("n", justify="right")
        t.add_column("greedy", justify="right")
        if head:
            t.add_column(head, justify="right")
        for g, block in groups.items():
            row = [g, str(block["n_problems"]), _ci(block.get(GREEDY))[0]]
            if head:
                row.append(_ci(block.get(head))[0])
            t.add_row(*row)
        console.print(t)
    p = result.protocol
    console.print(f"protocol: template {p['template']} ({p['template_hash']}), k={p['k']}, "
                  f"T={p['temperature']}, top_p={p['top_p']}, max tokens {p['max_new_tokens']}"
                  f", {p['n_problems']} problems of split {p.get('split')} "
                  f"({p.get('problems_hash')}), extractor {p['extractor']}; "
                  f"{result.seconds:.1f}s")
    if m.get("scorer_errors"):
        console.print(f"[red]scorer errors: {m['scorer_errors']}[/red] (not counted as wrong "
                      "answers; the log names each input's hash)")


def eval_cmd(
    model: MODEL = None,
    benchmark: Annotated[list[str] | None, typer.Option(
        "--benchmark", help="gsm8k, math500, aime24, aime25, amc23, synthetic, or an ingested "
        "source (repeatable) [default: eval.benchmarks of the config].")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", help="Evaluate the first N problems.")] = None,
    samples: Annotated[int | None, typer.Option(
        "--samples", help="k samples per problem for avg@k / maj@k / pass@k.")] = None,
    as_json: JSON_OUT = False,
    workdir: WORKDIR = None,
    data_dir: DATA_DIR = None,
    template: TEMPLATE = None,
    config: CONFIG = None,
    overrides: SET = None,
) -> None:
    """Evaluate a model: greedy accuracy, avg@k, maj@k, pass@k with bootstrap CIs."""
    from grpo_core.data.readers import SourceUnreadable
    from grpo_core.data.source import SourceError
    from grpo_core.eval.evaluation import evaluate_benchmark
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    cfg = _config(config, overrides, **{
        "model.name_or_path": model, "eval.limit": limit, "eval.samples": samples,
        "project.workdir": str(workdir) if workdir else None,
        "data.data_dir": str(data_dir) if data_dir else None, "model.template": template})
    progress = _progress(as_json)
    results = []
    ws = Workspace.at(cfg.project.workdir)
    backend = tokenizer = scorer = None
    from tasks.launch import own_process

    # Workers (or train.stage_process's one process) load the model and score; this one writes.
    if cfg.eval.shards > 1 or own_process(cfg):
        scorer = _shard_flows(cfg).eval_scorer(ws.root)
    # Fail fast on a store another process holds, then let it go: generation takes minutes
    # to hours, and DuckDB has one writer; evaluate opens the store to read the problems
    # and again to write the results, each briefly (waiting data.store_lock_timeout).
    _open_store(cfg).close()
    _building_note(cfg.model.name_or_path)
    try:
        path = resolve_model_path(cfg.model.name_or_path, ws.models, progress)
        if scorer is None:
            backend, tokenizer = build_backend(path, cfg, progress=progress)
    except OSError as exc:
        _fail(f"cannot load model {cfg.model.name_or_path}: "
              f"{str(exc).strip().splitlines()[0]}", 1)
    for bench in benchmark or cfg.eval.benchmarks:
        try:
            results.append(evaluate_benchmark(cfg.model.name_or_path, bench, cfg, backend=backend,
                                    tokenizer=tokenizer, progress=progress, scorer=scorer,
                                    open_store=lambda: _open_store(cfg, cfg.data.store_lock_timeout)))
        except SourceError as exc:
            _fail(str(exc), 2)
        except SourceUnreadable as exc:
            _fail(str(exc), 1)
    if as_json:
        out = [r.to_json() for r in results]
        typer.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return
    for r in results:
        _print_eval(r)


def register(app: typer.Typer) -> None:
    """Add `filter` and `eval` to the main `grpo` app."""
    app.command("filter")(filter_cmd)
    app.command("eval")(eval_cmd)
