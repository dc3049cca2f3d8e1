"""R1-Zero vs SFT+GRPO, side by side: both recipes through the pipeline (sharing the
cached ingest and base-model evaluation), then one table (markdown + CSV) and a bar
chart with 95% CIs per benchmark, to MLflow, the workspace and a Prefect artifact."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.pipeline import grpo_pipeline  # first: it configures prefect before import
from flows.recipes import RECIPES_DIR, default_recipes  # noqa: F401 - re-exported
from grpo_core.config import PipelineConfig
from grpo_core.workspace import Workspace
from tasks import tracking
from tasks.comparison import COMPARE_COLUMNS

COLUMNS = COMPARE_COLUMNS  # one definition: the table `grpo compare` reads back from MLflow


def comparison_rows(results: dict[str, dict], metric: str) -> list[dict]:
    rows = []
    for recipe, res in results.items():
        for bench, final in res["final"].items():
            base = res["base"].get(bench, {}).get("metrics", {}).get(metric) or {}
            now = final["metrics"].get(metric) or {}
            rows.append({"recipe": recipe, "benchmark": bench, "metric": metric,
                         "base": base.get("mean"), "base_lo": base.get("lo"), "base_hi": base.get("hi"),
                         "final": now.get("mean"), "final_lo": now.get("lo"), "final_hi": now.get("hi"),
                         "delta": (now["mean"] - base["mean"]) if now.get("mean") is not None
                         and base.get("mean") is not None else None})
    return rows


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def to_markdown(rows: list[dict]) -> str:
    lines = ["| recipe | benchmark | metric | base [95% CI] | final [95% CI] | delta |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['benchmark']} | {r['metric']} | {_fmt(r['base'])} "
                     f"[{_fmt(r['base_lo'])}, {_fmt(r['base_hi'])}] | {_fmt(r['final'])} "
                     f"[{_fmt(r['final_lo'])}, {_fmt(r['final_hi'])}] | {_fmt(r['delta'])} |")
    return "\n".join(lines)


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def bar_chart(rows: list[dict], path: Path) -> Path:
    """Base vs final per recipe and benchmark, with 95% CI error bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5, 1.6 * len(rows)), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [f"{r['recipe']}\n{r['benchmark']}" for r in rows]
    for offset, (which, colour) in zip((-0.2, 0.2), (("base", "#9aa5b1"), ("final", "#2b6cb0"))):
        means = [r[which] or 0.0 for r in rows]
        err = [[max(0.0, (r[which] or 0) - (r[f"{which}_lo"] or 0)) for r in rows],
               [max(0.0, (r[f"{which}_hi"] or 0) - (r[which] or 0)) for r in rows]]
        ax.bar([i + offset for i in range(len(rows))], means, width=0.4, yerr=err, capsize=3,
               color=colour, label=which)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel(rows[0]["metric"] if rows else "")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("R1-Zero vs SFT+GRPO (95% bootstrap CI)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


@flow(name="grpo-compare", validate_parameters=True)
def compare_recipes(configs: list[PipelineConfig], progress: bool = True) -> dict:
    results = {}
    for cfg in configs:
        results[cfg.project.recipe] = grpo_pipeline(cfg, progress=progress)
    metric = configs[0].eval.primary_metric
    rows = comparison_rows(results, metric)
    ws = Workspace.at(configs[0].project.workdir).ensure()
    report_dir = ws.root / "reports"
    report_dir.mkdir(parents=True, exist_ok=True)
    md, table_csv = to_markdown(rows), to_csv(rows)
    (report_dir / "comparison.md").write_text(md + "\n")
    (report_dir / "comparison.csv").write_text(table_csv)
    chart = bar_chart(rows, report_dir / "comparison.png")
    tracking.log_comparison(configs[0], ws, md, table_csv, chart, [r["parent_run"] for r in results.values()])
    create_markdown_artifact(key="recipe-comparison", markdown=md,
                             description="R1-Zero vs SFT+GRPO, held-out metrics with 95% CIs")
    return {"rows": rows, "markdown": md, "report_dir": str(report_dir),
            "runs": {k: v["parent_run"] for k, v in results.items()}}
