"""R1-Zero vs SFT+GRPO, side by side: both recipes through the pipeline (sharing the
cached ingest and base-model evaluation), then one table (markdown + CSV) and a bar
chart with 95% CIs per benchmark, to MLflow, the workspace and a Prefect artifact.

Every delta is of two models scored on the same problems, so it carries the paired
bootstrap CI of the per-problem difference: final vs base per recipe (computed at the end
of each pipeline), each stage over the one before (base -> sft -> round-N; which stage
earned the gain), and one recipe's final vs the other's. The answer is one sentence
(grpo_core.eval.attribution.verdict), said first everywhere: the Prefect run's log and
artifact, the comparison run's and the experiment's descriptions in MLflow, `grpo run`'s
closing lines and `grpo compare`. It ends with whether the recipes were compute-matched,
and the table is followed by each recipe's compute (grpo_core.eval.compute)."""
from __future__ import annotations

import csv
import io

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.pipeline import grpo_pipeline
from flows.run_view import compare_run_name, prefect_run_link
from grpo_core.config import PipelineConfig
from grpo_core.eval.attribution import verdict
from grpo_core.eval.comparison import (
    COMPARE_COLUMNS,
    attribution_rows,
    ci_triple,
    paired_deltas,
    table_row,
)
from grpo_core.eval.compute import compute_markdown, match_clause, matching_steps
from grpo_core.eval.score import metric_of
from grpo_core.eval.ui_views import ui_base
from grpo_core.workspace import Workspace
from tasks import tracking
from tasks.eval_records import records_store, stage_records
from tasks.plots import comparison_chart
from tasks.preflight import RunPlan, preflight_all
from tasks.stage_results import PipelineResult
from tasks.tracking import verdict_freshness

COLUMNS = COMPARE_COLUMNS  # one definition: the table `grpo compare` reads back from MLflow


def comparison_rows(results: dict[str, PipelineResult], metric: str) -> list[dict]:
    """One row per recipe and benchmark: base and final with their CIs, and the delta with
    the paired CI the pipeline computed (finish_pipeline's `deltas`, in its `registered`
    report); a delta without per-problem records has no CI rather than an unpaired one."""
    rows = []
    for recipe, res in results.items():
        deltas = res.registered.get("deltas") or {}
        for bench, final in res.final.items():
            base, now = metric_of(res.base, bench, metric), final.metric(metric)
            rows.append(_row(recipe, bench, metric, base, now, deltas.get(bench, {}).get(metric)))
    return rows


def _row(label: str, bench: str, metric: str, base: dict, now: dict, paired: dict | None) -> dict:
    """The table row (grpo_core.eval.comparison.table_row) of CI blocks and a paired delta."""
    return table_row(label, bench, metric, ci_triple(base), ci_triple(now),
                     ci_triple(paired, "delta"))


def pair_label(a: str, b: str) -> str:
    return f"{a} vs {b}"


def recipe_pair_rows(configs: list[PipelineConfig], results: dict[str, PipelineResult],
                     metric: str) -> list[dict]:
    """Recipe against recipe on each benchmark: the later recipe's final model minus the
    earlier one's (e.g. sft_grpo vs r1_zero), both scored on the same benchmark problems,
    with the paired CI; the `base` columns hold the earlier recipe's final. Benchmarks
    whose records cannot be paired (other problems, no store) get no row."""
    cfgs = {c.project.recipe: c for c in configs}
    recipes, rows = list(results), []
    for i, ref in enumerate(recipes):
        for other in recipes[i + 1:]:
            for bench in results[other].final:
                if bench in results[ref].final:
                    rows += _pair_row(cfgs, results, other, ref, bench, metric)
    return rows


def _paired_finals(cfgs: dict, results: dict, a: str, b: str, bench: str, metric: str
                   ) -> dict | None:
    """a's final minus b's final on `bench`, paired ({"delta", "lo", "hi", "n"}), or None
    when they cannot be paired."""
    return paired_deltas(
        _final_records(cfgs[a], results[a], bench), _final_records(cfgs[b], results[b], bench),
        [metric], n_resamples=cfgs[a].eval.bootstrap, seed=cfgs[a].project.seed).get(metric)


def _pair_row(cfgs: dict, results: dict, a: str, b: str, bench: str, metric: str) -> list[dict]:
    """[the row of a's final minus b's final on `bench`], or [] when they cannot be paired."""
    paired = _paired_finals(cfgs, results, a, b, bench, metric)
    if paired is None:
        return []
    a_block, b_block = (results[r].final[bench].metric(metric) for r in (a, b))
    return [_row(pair_label(a, b), bench, metric, b_block, a_block, paired)]


def stage_rows(results: dict[str, PipelineResult]) -> list[dict]:
    """Each recipe's stage gains (`<recipe> - sft over base`, ...) on the first benchmark,
    from the attribution its pipeline computed (finish_pipeline's `attribution`)."""
    return [row for recipe, res in results.items()
            for row in attribution_rows(recipe, _attribution(res))]


def _attribution(res: PipelineResult) -> dict:
    return res.registered.get("attribution") or {}


def recipes_verdict(configs: list[PipelineConfig], results: dict[str, PipelineResult], metric: str) -> str:
    """The verdict sentence of the last recipe against the first (sft_grpo vs r1_zero) on
    the first benchmark, with each recipe's SFT / GRPO phases; "" for a single recipe."""
    cfgs = {c.project.recipe: c for c in configs}
    recipes = list(results)
    if len(recipes) < 2:
        return ""
    ref, other, bench = recipes[0], recipes[-1], configs[0].eval.benchmarks[0]
    paired = (_paired_finals(cfgs, results, other, ref, bench, metric)
              if bench in results[ref].final and bench in results[other].final else None)
    phases = {r: _attribution(results[r]).get("phases") or {} for r in recipes}
    said = verdict(other, ref, bench, metric, paired, phases)
    return said + match_clause(results[ref].compute.model_dump(),
                               results[other].compute.model_dump(),
                               ref, other) if said else said


def _final_records(cfg: PipelineConfig, res: PipelineResult, bench: str) -> list[dict]:
    ws = Workspace.at(cfg.project.workdir)
    with records_store(ws, cfg.data.store_lock_timeout) as store:
        return stage_records(store, res.final[bench], res.model_dir)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _fmt_delta(r: dict) -> str:
    if r["delta"] is None:
        return "-"
    ci = f" [{_fmt(r['delta_lo'])}, {_fmt(r['delta_hi'])}]" if r["delta_lo"] is not None else ""
    return f"{r['delta']:+.3f}{ci}"


def to_markdown(rows: list[dict]) -> str:
    lines = ["| recipe | benchmark | metric | base [95% CI] | final [95% CI] | delta [paired 95% CI] |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['recipe']} | {r['benchmark']} | {r['metric']} | {_fmt(r['base'])} "
                     f"[{_fmt(r['base_lo'])}, {_fmt(r['base_hi'])}] | {_fmt(r['final'])} "
                     f"[{_fmt(r['final_lo'])}, {_fmt(r['final_hi'])}] | {_fmt_delta(r)} |")
    lines += ["", ("delta: final minus base, with the paired bootstrap 95% CI of the "
                   "per-problem difference (both models scored on the same problems); a CI above "
                   "0 is a gain. Rows `A vs B` compare A's final model (final) with B's (base); "
                   "rows `A - sft over base` compare one stage's model with the stage before's.")]
    return "\n".join(lines)


def memorisation_markdown(results: dict[str, PipelineResult]) -> str:
    """The memorisation probe of every training stage (tasks/probes.py): accuracy on the
    problems it trained on and on unseen RL-part problems, each with its gain over the
    stage's start model, the gap between the gains, the held-out figure; "" without probes."""
    lines = []
    for recipe, res in results.items():
        for p in (m.gap for m in res.memorisation):
            t_gain, u_gain = p.trained - p.trained_before, p.unseen - p.unseen_before
            held = "-" if p.heldout is None else f"{p.heldout:.3f}"
            lines.append(f"| {recipe} | {p.stage} | {p.trained:.3f} ({t_gain:+.3f}) | "
                         f"{p.unseen:.3f} ({u_gain:+.3f}) | {t_gain - u_gain:+.3f} "
                         f"+/- {1.96 * p.gap_se:.3f} | {held} |")
    if not lines:
        return ""
    return "\n".join(["", "", "Memorisation probe (gain over the stage's start model in brackets; "
                      "gap: trained gain minus unseen gain, 95% half-width):", "",
                      "| recipe | stage | trained | unseen | gap | held-out |",
                      "|---|---|---|---|---|---|", *lines])


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@flow(name="grpo-compare", validate_parameters=True, flow_run_name=compare_run_name)
def compare_recipes(configs: list[PipelineConfig], progress: bool = True,
                    plans: list[RunPlan] | None = None) -> dict:
    """`plans`: each config's preflight, the store held (`grpo run`); None (a deployment's
    run): made here, each pipeline taking the store in its turn."""
    log = get_run_logger()
    results, ran = {}, {}
    planned_runs = list(zip(configs, plans or preflight_all(configs), strict=True))
    matching = any(c.project.compute_match for c in configs)
    if matching:  # the SFT recipes first: what their SFT spent sets the others' extra steps
        planned_runs.sort(key=lambda run: not run[0].sft_stage.enabled)
    sft_spent = None
    for cfg, plan in planned_runs:
        if matching and not cfg.sft_stage.enabled and sft_spent:
            cfg = with_matching_steps(cfg, sft_spent, log)
        ran[cfg.project.recipe] = cfg
        results[cfg.project.recipe] = grpo_pipeline(cfg, progress=progress, plan=plan)
        if cfg.sft_stage.enabled:
            sft_spent = results[cfg.project.recipe].compute.model_dump()
    configs = [ran[c.project.recipe] for c in configs]  # the table in the configured order
    results = {c.project.recipe: results[c.project.recipe] for c in configs}
    report = comparison_report(configs, results)
    parents = [r.parent_run for r in results.values()]
    run = publish_comparison(configs[0], report, parents)
    # which model versions (and champions) the verdict speaks of: a newer champion flags it
    report["computed_with"] = verdict_freshness.stamp(run, parents)
    links = tracking.links_for_run(run)
    # The answer first, in the run's own log (the Prefect UI shows only what is logged here).
    if report["verdict"]:
        log.info("verdict: %s (%s)", report["verdict"], report["computed_with"] or "no models")
    log.info("comparison (%s):\n%s\nMLflow comparison run: %s", report["report_dir"],
             report["markdown"], links.get("run"))
    create_markdown_artifact(
        key="recipe-comparison", markdown=artifact_markdown(report, links, tracking.current_uri()),
        description="R1-Zero vs SFT+GRPO: the verdict, and held-out metrics with paired 95% CIs")
    return {**report, "runs": {k: v.parent_run for k, v in results.items()},
            "comparison_run": run, "links": links}


def with_matching_steps(cfg: PipelineConfig, sft_recipe: dict, log) -> PipelineConfig:
    """project.compute_match: `cfg` (a recipe without SFT) with the extra GRPO steps per
    round that spend what the SFT recipe's SFT spent (grpo_core.eval.compute)."""
    extra = matching_steps(sft_recipe, cfg.rounds.count)
    log.info("compute_match: %s gets %d more GRPO steps a round (%d -> %d) for the SFT's "
             "%.3g TFLOP", cfg.project.recipe, extra, cfg.grpo.max_steps,
             cfg.grpo.max_steps + extra, sft_recipe.get("sft_tflop", 0.0))
    return cfg.model_copy(update={"grpo": cfg.grpo.model_copy(
        update={"max_steps": cfg.grpo.max_steps + extra})})


def artifact_markdown(report: dict, links: dict, uri: str = "") -> str:
    """The Prefect artifact: the verdict (and the model versions it was computed with), the
    links to the MLflow comparison run, the table. The links are the UI of the store in use
    (`uri`): an MLflow server's own address; for a local store, where `mlflow ui` serves it
    ($GRPO_MLFLOW_UI_URL, else its default), with the command that does."""
    head = [f"**{report['verdict']}**", ""] if report["verdict"] else []
    if report.get("computed_with"):
        head += [f"({report['computed_with']})", ""]
    if links.get("run"):
        head += [f"MLflow: [comparison run]({links['run']})"
                 + (f", [runs table]({links['runs_table']})" if links.get("runs_table") else ""), ""]
        if uri and not uri.startswith(("http://", "https://")):
            head += [f"(a local store, `{uri}`: serve it with `mlflow ui --backend-store-uri "
                     f"{uri}` at {ui_base(uri)} for these links)", ""]
    return "\n".join([*head, report["markdown"]])


@task(name="comparison-report", cache_policy=NO_CACHE)
def comparison_report(configs: list[PipelineConfig], results: dict[str, PipelineResult]) -> dict:
    """The table (recipe rows, stage rows, recipe-vs-recipe rows), the verdict, and the
    files under <workdir>/reports: comparison.md, .csv, .png."""
    metric = configs[0].eval.primary_metric
    rows = (comparison_rows(results, metric) + stage_rows(results)
            + recipe_pair_rows(configs, results, metric))
    said = recipes_verdict(configs, results, metric)
    ws = Workspace.at(configs[0].project.workdir).ensure()
    report_dir = ws.root / "reports"
    report_dir.mkdir(parents=True, exist_ok=True)
    md = (to_markdown(rows) + memorisation_markdown(results)
          + compute_markdown({r: res.compute.model_dump() for r, res in results.items()}))
    table_csv = to_csv(rows)
    (report_dir / "comparison.md").write_text((f"**{said}**\n\n" if said else "") + md + "\n")
    (report_dir / "comparison.csv").write_text(table_csv)
    chart = comparison_chart(rows, report_dir / "comparison.png")
    return {"rows": rows, "markdown": md, "csv": table_csv, "verdict": said,
            "chart": str(chart) if chart else None, "report_dir": str(report_dir)}


@task(name="log-comparison", cache_policy=NO_CACHE)
def publish_comparison(cfg: PipelineConfig, report: dict, parent_runs: list[str]) -> str:
    """The comparison run in MLflow (its description and the experiment's say the verdict,
    linked to the parents and to this Prefect run); returns its run id."""
    run = tracking.log_comparison(cfg, Workspace.at(cfg.project.workdir), report["markdown"],
                                  report["csv"], report["chart"], parent_runs)
    tracking.describe_comparison(run, report["verdict"], report["markdown"], parent_runs,
                                 prefect_run_link(), rows=report["rows"])
    return run


