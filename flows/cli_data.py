"""`grpo data ...`: ingest problem sets into the DuckDB store and inspect it.

Exit codes: 0 ok; 1 the data is unusable (every row invalid, empty or corrupt file, store
locked); 2 usage (missing path, unknown preset, bad column mapping).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from flows.cli_common import LEVELS, command_group, parse_levels
from grpo_core.data import decontam
from grpo_core.data.adapters import PRESETS, resolve_source
from grpo_core.data.readers import SourceUnreadable
from grpo_core.data.source import SourceError
from grpo_core.data.store import Store, StoreError
from grpo_core.data.validation import MAX_PROBLEM_CHARS, IngestReport
from grpo_core.workspace import Workspace

app = command_group("Ingest and inspect problem sets.", pretty_exceptions_enable=False)
console = Console(highlight=False, soft_wrap=True)

DB = Annotated[Path | None, typer.Option(
    "--db", help="DuckDB store file [default: <workdir>/store.duckdb].")]
WORKDIR = Annotated[Path | None, typer.Option(
    "--workdir", help="Workspace folder [default: $GRPO_WORKDIR or ./.grpo].")]
NGRAM = Annotated[int, typer.Option("--ngram", min=3, help="n of the decontamination n-grams.")]
COVERAGE = Annotated[float, typer.Option(
    "--min-coverage", min=0.01, max=1.0,
    help="Share of an eval problem's n-grams a training problem must hold to be flagged.")]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _db_path(db: Path | None, workdir: Path | None) -> Path:
    return Path(db) if db else Workspace.at(workdir).db_path


def _open(db: Path | None, workdir: Path | None, read_only: bool,
          timeout: float = 0.0) -> Store:
    try:
        return Store.open(_db_path(db, workdir), read_only=read_only, timeout=timeout)
    except StoreError as exc:
        _fail(str(exc), 1)


def _print_report(r: IngestReport) -> None:
    console.print(f"{r.source}/{r.split} from {r.origin}: {r.total_rows} rows "
                  f"in {r.seconds:.1f}s")
    console.print(f"  ingested:     {r.ingested}")
    near = (f", {r.near_duplicates} near: the same problem text, another gold"
            if r.near_duplicates else "")
    console.print(f"  duplicates:   {r.duplicates} ({r.already_stored} already in the store{near})")
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.quarantined.items()))
    console.print(f"  quarantined:  {r.quarantined_total}" + (f" ({reasons})" if reasons else ""))
    with_ = ", ".join(f"{k} {v}" for k, v in sorted(r.contaminated_with.items()))
    console.print(f"  contaminated: {r.contaminated}" + (f" ({with_})" if with_ else ""))
    if r.flagged_existing:
        console.print(f"  flagged:      {r.flagged_existing} earlier training problems overlap "
                      "this eval set")
    if r.repaired:
        console.print(f"  repaired:     {r.repaired} rows with mis-escaped LaTeX (\\f, \\b, ...)")
    for line in r.first_reasons if r.quarantined_total and not r.all_invalid else []:
        console.print(f"  quarantined {line}")


@app.command()
def ingest(
    source: Annotated[str, typer.Argument(help=(
        f"Preset ({', '.join(PRESETS)}), synthetic:arith, a .jsonl/.json/.parquet/.csv "
        "file or folder of shards, or a hub id owner/name (streamed)."))],
    db: DB = None,
    workdir: WORKDIR = None,
    split: Annotated[str | None, typer.Option(
        "--split", help="Split to read [default: train, or test for eval-only presets].")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="Local copies of the presets laid out like shared/data "
        "[default: $GRPO_DATA_DIR, else the hub].")] = None,
    limit: Annotated[int | None, typer.Option(
        "--limit", min=1, help="Read the first N rows.")] = None,
    columns: Annotated[str | None, typer.Option(
        "--columns", help="Column mapping for files and hub ids: problem=COL,answer=COL"
        "[,solution=COL,id=COL,level=COL,subject=COL].")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", help="Source name to store a file under [default: the file stem].")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="Hub dataset (or a local copy of its repository): which config to "
        "read; ingest each config you want.")] = None,
    max_problem_chars: Annotated[int, typer.Option(
        "--max-problem-chars", min=100, help="Longer problems are quarantined.")
    ] = MAX_PROBLEM_CHARS,
    ngram: NGRAM = decontam.DEFAULT_N,
    min_coverage: COVERAGE = decontam.DEFAULT_MIN_COVERAGE,
    lock_timeout: Annotated[float, typer.Option(
        "--lock-timeout", min=0, help="Seconds to wait for a store held by another process.")
    ] = 0.0,
    levels: LEVELS = None,
) -> None:
    """Validate SOURCE and add it to the store; print counts."""
    chosen = parse_levels(levels, [source])
    try:
        adapter = resolve_source(source, split=split, data_dir=data_dir, columns=columns,
                                 limit=limit, name=name, levels=chosen, config=config)
    except SourceError as exc:
        _fail(str(exc), 2)
    except SourceUnreadable as exc:
        _fail(str(exc), 1)
    with _open(db, workdir, read_only=False, timeout=lock_timeout) as store:
        try:
            report = store.ingest(adapter, max_problem_chars=max_problem_chars, ngram=ngram,
                                  min_coverage=min_coverage, progress=sys.stderr.isatty())
        except SourceUnreadable as exc:
            _fail(str(exc), 1)
    if report.total_rows == 0:
        _fail(f"{adapter.origin}: no rows (empty source)", 1)
    _print_report(report)
    if report.all_invalid:
        _fail(f"{adapter.origin}: all {report.total_rows} rows invalid, nothing ingested; "
              f"first reasons: {'; '.join(report.first_reasons[:3])}", 1)


@app.command()
def stats(
    db: DB = None,
    workdir: WORKDIR = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """Per source and split: problems, contaminated, quarantined."""
    path = _db_path(db, workdir)
    if not path.exists():
        _fail(f"no store at {path} (run `grpo data ingest` first)", 2)
    with _open(db, workdir, read_only=True) as store:
        rows = store.stats()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"problem store {path}")
    for col in ("source", "split", "role", "problems", "contaminated", "quarantined"):
        table.add_column(col, justify="right" if col in ("problems", "contaminated",
                                                         "quarantined") else "left")
    for r in rows:
        table.add_row(r["source"], r["split"], r["role"], str(r["problems"]),
                      str(r["contaminated"]), str(r["quarantined"]))
    table.add_row("total", "", "", str(sum(r["problems"] for r in rows)),
                  str(sum(r["contaminated"] for r in rows)),
                  str(sum(r["quarantined"] for r in rows)), style="bold")
    console.print(table)


@app.command()
def quarantine(
    db: DB = None,
    workdir: WORKDIR = None,
    source: Annotated[str | None, typer.Option("--source", help="Only this source.")] = None,
    split: Annotated[str | None, typer.Option("--split", help="Only this split.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows to show.")] = 20,
) -> None:
    """List quarantined rows: source, split, row and reason."""
    path = _db_path(db, workdir)
    if not path.exists():
        _fail(f"no store at {path} (run `grpo data ingest` first)", 2)
    with _open(db, workdir, read_only=True) as store:
        rows = store.quarantined(source, split)
    for r in rows[:limit]:
        console.print(f"{r['source']}/{r['split']} row {r['row_index']}: {r['reason']}")
    console.print(f"{len(rows)} quarantined rows" + (f" ({limit} shown)" if len(rows) > limit
                                                     else ""))


@app.command("decontam")
def decontaminate(
    db: DB = None,
    workdir: WORKDIR = None,
    ngram: NGRAM = decontam.DEFAULT_N,
    min_coverage: COVERAGE = decontam.DEFAULT_MIN_COVERAGE,
) -> None:
    """Recompute every contamination flag against all eval sets in the store."""
    with _open(db, workdir, read_only=False) as store:
        counts = store.decontaminate(ngram=ngram, min_coverage=min_coverage)
    console.print(f"contaminated training problems: {sum(counts.values())}"
                  + "".join(f"\n  {k}: {v}" for k, v in sorted(counts.items())))


@app.command()
def lineage(
    model: Annotated[str | None, typer.Option(
        "--model", help="A model folder or fingerprint [default: each recipe's newest model].")] = None,
    db: DB = None,
    workdir: WORKDIR = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")] = False,
) -> None:
    """Which problems each stage behind a model consumed (SFT examples and epochs, each
    round's filter candidates and kept set, GRPO prompts and their uses, the memorisation
    probe's sets), and which training stages shared problems (none, unless
    data.stage_overlap or filter.reuse_prompts asked for it)."""
    from grpo_core.data.lineage import latest_models, lineage_of, overlaps

    path = _db_path(db, workdir)
    if not path.exists():
        _fail(f"no store at {path} (run a pipeline first)", 2)
    with _open(db, workdir, read_only=True) as store:
        if model is None:
            models = latest_models(store)
        else:
            fp = model
            if Path(model).exists():
                from grpo_core.modeling.loading import model_fingerprint

                fp = model_fingerprint(model)
            models = [("", fp)]
        out = [{"recipe": recipe, "model": fp, "stages": lineage_of(store, fp),
                "overlaps": overlaps(store, fp)} for recipe, fp in models]
    if not any(o["stages"] for o in out):
        _fail(f"no lineage recorded in {path}" + (f" for model {model}" if model else ""), 1)
    if as_json:
        typer.echo(json.dumps(out, indent=2, default=str))
        return
    for o in out:
        table = Table(title=f"{o['recipe'] or 'model'} {o['model']}")
        for col in ("stage", "round", "role", "problems", "uses"):
            table.add_column(col, justify="right" if col in ("problems", "uses") else "left")
        for r in o["stages"]:
            table.add_row(r["stage"], "" if r["round"] is None else str(r["round"]), r["role"],
                          str(r["problems"]), f"{r['uses']:g}")
        console.print(table)
        shared = [f"{s['stage_a']}{s['round_a'] or ''} & {s['stage_b']}{s['round_b'] or ''}: "
                  f"{s['shared']}" for s in o["overlaps"]]
        console.print("training stages sharing problems: " + ("; ".join(shared) or "none"))
