"""Paired decisions against a real MLflow registry (SQLite under tmp_path) and a real DuckDB
store: champion promotion and the comparison's deltas follow the paired per-problem rule
(issue 11, deliverable 6), where the unpaired rule (challenger mean above the champion's
own CI upper bound) would decide the other way.

Each case is two pipelines of one recipe: the first registers the champion, the second
evaluates its base (the champion's model) and its final (the challenger) on the same
problems; finish_pipeline reads both record sets back from the store."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from grpo_core import workspace
from grpo_core.config import PipelineConfig
from grpo_core.data.records import write_eval
from grpo_core.data.store import Store
from grpo_core.eval.comparison import COMPARE_COLUMNS
from grpo_core.eval.metric_names import eval_metrics
from grpo_core.eval.metrics import summarise
from grpo_core.eval.promotion import PAIRED_RULE
from grpo_core.eval.score import BenchmarkScore, Scores
from grpo_core.modeling.loading import model_fingerprint
from grpo_core.workspace import Workspace
from tasks import eval_records as comparison
from tasks import tracking as T
from tasks.finish import finish_pipeline
from tasks.stage_results import PipelineResult
from tasks.tracking.registry import EVAL_RUN_TAG

K = 20  # samples per problem: avg@20 moves in steps of 0.05
METRIC = f"avg@{K}"
BENCH = "synthetic"
# Problems of spread difficulty; the challenger gets one more sample right on each of them.
SPREAD = [(7 * i) % 19 for i in range(40)]
# Problems of even difficulty; the challenger solves half of them and mostly fails the rest.
EVEN = [9 if i % 2 else 11 for i in range(40)]
SWINGS = [20 if i % 2 else 2 for i in range(40)]


@pytest.fixture
def wd(tmp_path, template_db, monkeypatch) -> Path:
    """A workdir with a migrated, empty MLflow store; cwd is a scratch folder."""
    wd = tmp_path / "wd"
    wd.mkdir()
    shutil.copy(template_db, wd / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return wd


def _cfg(wd: Path, project: str, recipe: str = "r1_zero", beta: float = 0.04) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "project": {"name": project, "recipe": recipe, "workdir": str(wd)},
        "eval": {"samples": K, "primary_metric": METRIC, "benchmarks": [BENCH]},
        "grpo": {"beta": beta}})


def _model(wd: Path, tag: str) -> Path:
    folder = wd / "models-fake" / tag
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "tag": tag}))
    (folder / "model.safetensors").write_bytes(tag.encode() * 16)
    return folder


def _records(correct_counts: list[int]) -> list[dict]:
    return [{"problem_id": f"p{i:03d}", "gold": "1", "greedy_correct": c * 2 >= K,
             "sample_correct": [True] * c + [False] * (K - c),
             "sample_answers": ["1"] * c + ["0"] * (K - c)} for i, c in enumerate(correct_counts)]


def _evaluate(wd: Path, model: Path, counts: list[int], run_id: str, protocol: str = "P") -> Scores:
    """Store one eval run of `model` (as grpo_core.eval.evaluation does) and return the
    scores stages.evaluate_model would hand on for it."""
    records = _records(counts)
    metrics = summarise(records)
    with Store.open(Workspace(wd).db_path) as store:
        write_eval(store, {"run_id": run_id, "protocol_hash": protocol, "benchmark": BENCH,
                           "model": str(model), "model_fingerprint": model_fingerprint(str(model)),
                           "metrics": metrics}, records)
    return {BENCH: BenchmarkScore(metrics=metrics, protocol_hash=protocol, eval_run_id=run_id)}


def _pipeline(cfg: PipelineConfig, wd: Path, model: Path, final: Scores, base: Scores | None) -> dict:
    """The end of a pipeline run: eval/base and eval/final child runs, then finish_pipeline."""
    parent = T.start_parent_run(cfg, cfg.hash(), cfg.project.recipe, "abc1234", "flow", wd)
    for label, res in (("eval/base", base), ("eval/final", final)):
        if res is not None:
            T.log_metrics(T.child_run(parent, label), eval_metrics(res))
    return finish_pipeline(parent, cfg, model, final, [], wd,
                             base=base or {})


def _unpaired_promotes(champion: list[int], challenger: list[int]) -> bool:
    """The old rule: the challenger's mean above the champion's own 95% CI upper bound."""
    return summarise(_records(challenger))[METRIC]["mean"] > summarise(_records(champion))[METRIC]["hi"]


def _case(wd: Path, project: str, champion: list[int], challenger: list[int]) -> tuple[dict, dict]:
    """Champion v1 registered by a first pipeline; a second one (base = the champion's
    model, final = the challenger) decides on v2. Returns (its report, its stage results)."""
    m1, m2 = _model(wd, f"{project}-1"), _model(wd, f"{project}-2")
    first = _pipeline(_cfg(wd, project), wd, m1, _evaluate(wd, m1, champion, f"{project}-e1"), None)
    assert first["promoted"] and "no champion" in first["reason"]
    base = _evaluate(wd, m1, champion, f"{project}-e1b")  # the champion again, as eval/base
    final = _evaluate(wd, m2, challenger, f"{project}-e2")
    report = _pipeline(_cfg(wd, project, beta=0.01), wd, m2, final, base)
    return report, PipelineResult(parent_run=report["parent_run"], base=base,
                                  final=final, registered=report, model_dir=str(m2))


def _check_registry(wd: Path, project: str, report: dict, promoted: bool) -> None:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(f"sqlite:///{wd}/mlflow.db")
    name = f"{project}-r1_zero"
    tags = c.get_model_version(name, "2").tags
    assert report["promoted"] is promoted and report["version"] == "2"
    assert tags["grpo.decision"] == ("promoted" if promoted else "rejected")
    assert tags["grpo.decision_rule"] == PAIRED_RULE == report["rule"]
    assert float(tags["grpo.paired_delta.ci_lo"]) == pytest.approx(report["paired"]["lo"])
    assert (report["paired"]["lo"] > 0) is promoted and report["paired"]["n"] == 40
    assert report["paired"]["delta"] == pytest.approx(0.05)
    assert str(c.get_model_version_by_alias(name, "champion").version) == ("2" if promoted else "1")
    assert tags[EVAL_RUN_TAG] == f"{project}-e2"
    # the decision in words on the version's page (issue 27): what, against what, by which rule
    said = c.get_model_version(name, "2").description
    assert said.startswith("Promoted to champion." if promoted else "Kept as challenger")
    assert "Compared with champion v1" in said and f"Rule: {PAIRED_RULE}" in said
    # the registry's versions table shows descriptions unrendered (issue 34, item 8): no
    # markdown in them, and its numbers with three decimals as everywhere else
    assert not re.search(r"[*_`#|]{1,2}\w|\w[*_`]{2}", said.replace("per-problem", "")), said
    assert re.search(r"paired delta \+0\.050 \[-?0\.\d{3}, -?0\.\d{3}\] over 40 problems", said), said
    assert c.get_model_version(name, "1").tags["grpo.compared_with"] == "none (first version)"


def _check_comparison(wd: Path, project: str, stage_results: dict, promoted: bool) -> None:
    from flows.compare import comparison_rows, to_markdown

    rows = T.compare_table(workspace.tracking_uri(_cfg(wd, project), wd), project)
    assert [(r["recipe"], r["benchmark"]) for r in rows] == [("r1_zero", BENCH)]
    row = rows[0]
    assert list(row) == COMPARE_COLUMNS
    assert row["delta"] == pytest.approx(0.05) and (row["delta_lo"] > 0) is promoted
    # The flow's own table (from the pipeline's return value) says the same.
    (flow_row,) = comparison_rows({"r1_zero": stage_results}, METRIC)
    assert {k: flow_row[k] for k in ("delta", "delta_lo", "delta_hi")} == pytest.approx(
        {k: row[k] for k in ("delta", "delta_lo", "delta_hi")})
    shown = f"+0.050 [{row['delta_lo']:.3f}, {row['delta_hi']:.3f}]"
    assert shown in to_markdown(rows)
    # `grpo compare` prints that table from MLflow.
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["compare", "--experiment", project, "--workdir", str(wd)])
    assert out.exit_code == 0 and shown in out.output, out.output


def test_small_gain_on_every_problem_is_promoted_though_inside_the_champion_ci(wd):
    assert not _unpaired_promotes(SPREAD, [c + 1 for c in SPREAD])
    report, results = _case(wd, "every", SPREAD, [c + 1 for c in SPREAD])
    assert report["paired"]["lo"] == pytest.approx(0.05)  # the same gain on every problem
    _check_registry(wd, "every", report, promoted=True)
    _check_comparison(wd, "every", results, promoted=True)


def test_gain_of_swings_is_not_promoted_though_above_the_champion_ci(wd):
    assert _unpaired_promotes(EVEN, SWINGS)
    report, results = _case(wd, "swings", EVEN, SWINGS)
    assert report["paired"]["lo"] < 0 < report["paired"]["hi"]
    _check_registry(wd, "swings", report, promoted=False)
    _check_comparison(wd, "swings", results, promoted=False)


def test_champion_on_other_problems_or_protocol_is_kept(wd):
    m1, m2, m3 = (_model(wd, f"m{i}") for i in (1, 2, 3))
    _pipeline(_cfg(wd, "other"), wd, m1, _evaluate(wd, m1, SPREAD, "o-e1"), None)
    # Other problems (the first ten only): nothing to pair, however good the challenger.
    better = _evaluate(wd, m2, [20] * 10, "o-e2")
    report = _pipeline(_cfg(wd, "other", beta=0.01), wd, m2, better, None)
    assert not report["promoted"] and "not the same problems" in report["reason"]
    # Another protocol: not compared either.
    report = _pipeline(_cfg(wd, "other", beta=0.02), wd, m3,
                       _evaluate(wd, m3, [20] * 40, "o-e3", protocol="Q"), None)
    assert not report["promoted"] and "protocol" in report["reason"]
    assert report["paired"] is None and report["deltas"] == {}


def test_retrain_passes_the_champion_records(wd):
    """Retrain re-evaluates the champion and hands its rows over: they decide, not the
    champion's stored tags (here from another protocol)."""
    m1, m2 = _model(wd, "r1"), _model(wd, "r2")
    _pipeline(_cfg(wd, "retrain"), wd, m1, _evaluate(wd, m1, SPREAD, "r-e1", protocol="OLD"), None)
    again = _evaluate(wd, m1, SPREAD, "r-e1-now")
    with comparison.records_store(wd) as store:
        champion_records = comparison.stage_records(store, again[BENCH], str(m1))
    parent = T.start_parent_run(_cfg(wd, "retrain", beta=0.01), "h-retrain", "r1_zero+retrain",
                                "abc", "flow", wd)
    report = finish_pipeline(parent, _cfg(wd, "retrain"), m2,
                               _evaluate(wd, m2, [c + 1 for c in SPREAD], "r-e2"), [], wd,
                               champion_records=champion_records, base={})
    assert report["promoted"] and report["paired"]["lo"] == pytest.approx(0.05)
    assert report["deltas"] == {}  # a retrain has no base eval


def test_stage_result_without_run_id_is_found_by_model_fingerprint(wd):
    """Results cached before they held the eval run id: the protocol hash and the model's
    fingerprint find the newest run of that model."""
    m1, m2 = _model(wd, "f1"), _model(wd, "f2")
    _evaluate(wd, m1, SPREAD, "f-old")
    _evaluate(wd, m1, EVEN, "f-new")
    _evaluate(wd, m2, SPREAD, "f-other-model")
    with comparison.records_store(wd) as store:
        rows = comparison.stage_records(store, BenchmarkScore(protocol_hash="P"), str(m1))
        assert {r["run_id"] for r in rows} == {"f-new"} and len(rows) == 40
        assert comparison.stage_records(store, BenchmarkScore(protocol_hash="Q"), str(m1)) == []
    with comparison.records_store(wd.parent / "nowhere") as store:
        assert store is None


def test_recipe_against_recipe_row(wd):
    """sft_grpo's final against r1_zero's final, scored on the same problems."""
    from flows.compare import recipe_pair_rows

    cfgs = [_cfg(wd, "pair", "r1_zero"), _cfg(wd, "pair", "sft_grpo")]
    m1, m2 = _model(wd, "zero"), _model(wd, "sft")
    results = {"r1_zero": PipelineResult(parent_run="z", model_dir=str(m1),
                                         final=_evaluate(wd, m1, SPREAD, "z")),
               "sft_grpo": PipelineResult(parent_run="s", model_dir=str(m2), final=_evaluate(
                   wd, m2, [c + 1 for c in SPREAD], "s"))}
    (row,) = recipe_pair_rows(cfgs, results, METRIC)
    assert row["recipe"] == "sft_grpo vs r1_zero" and list(row) == COMPARE_COLUMNS
    assert row["base"] == pytest.approx(summarise(_records(SPREAD))[METRIC]["mean"])
    assert row["delta"] == pytest.approx(0.05) and row["delta_lo"] == pytest.approx(0.05)
    # Other problems: no row rather than an unpaired delta.
    results["sft_grpo"].final = _evaluate(wd, m2, [20] * 10, "s10")
    assert recipe_pair_rows(cfgs, results, METRIC) == []


def test_report_outputs_carry_the_paired_ci(wd):
    """The flow's CSV, markdown and chart, with a recipe row and a recipe-vs-recipe row."""
    from flows.compare import to_csv, to_markdown
    from tasks.plots import comparison_chart

    rows = [{"recipe": "r1_zero", "benchmark": BENCH, "metric": METRIC, "base": 0.4,
             "base_lo": 0.3, "base_hi": 0.5, "final": 0.45, "final_lo": 0.35, "final_hi": 0.55,
             "delta": 0.05, "delta_lo": 0.03, "delta_hi": 0.07},
            {"recipe": "sft_grpo vs r1_zero", "benchmark": BENCH, "metric": METRIC,
             "base": 0.45, "base_lo": 0.35, "base_hi": 0.55, "final": 0.5, "final_lo": 0.4,
             "final_hi": 0.6, "delta": 0.05, "delta_lo": -0.02, "delta_hi": 0.12},
            {"recipe": "no_records", "benchmark": BENCH, "metric": METRIC, "base": 0.4,
             "base_lo": 0.3, "base_hi": 0.5, "final": 0.45, "final_lo": 0.35, "final_hi": 0.55,
             "delta": 0.05, "delta_lo": None, "delta_hi": None}]
    import csv
    import io

    back = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert [r["delta_lo"] for r in back] == ["0.03", "-0.02", ""]
    md = to_markdown(rows)
    assert "| +0.050 [0.030, 0.070] |" in md and "| +0.050 [-0.020, 0.120] |" in md
    assert "| +0.050 |" in md  # no records, no CI: not an unpaired one either
    png = comparison_chart(rows, wd / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _stage_pipeline(wd: Path, recipe: str, stages: list[tuple[str, list[int]]]) -> dict:
    """A pipeline of `recipe` whose models after each stage score `counts` (one model and
    eval run per stage; eval/final is the last stage's cached eval, as the pipeline's is)."""
    cfg = _cfg(wd, "verdict", recipe)
    evaluated = []
    for label, counts in stages:
        m = _model(wd, f"{recipe}-{label.replace('/', '-')}")
        evaluated.append((label, _evaluate(wd, m, counts, f"{recipe}-{label}"), str(m)))
    evaluated.append(("eval/final", *evaluated[-1][1:]))
    parent = T.start_parent_run(cfg, cfg.hash(), recipe, "abc1234", "flow", wd)
    final, model = evaluated[-1][1], evaluated[-1][2]
    for label, res, _ in (evaluated[0], evaluated[-1]):
        T.log_metrics(T.child_run(parent, label), eval_metrics(res))
    report = finish_pipeline(parent, cfg, model, final, [], wd,
                               base=evaluated[0][1], stages=evaluated)
    return PipelineResult(parent_run=parent, final=final, base=evaluated[0][1], model_dir=model,
                          registered=report)


def test_stage_attribution_and_verdict_reach_every_page(wd):
    """Issue 27: each stage's paired gain on the parent, the stage rows of the comparison,
    and the verdict on the comparison run, the experiment's landing text and `grpo compare`."""
    from flows.compare import comparison_rows, recipes_verdict, stage_rows, to_markdown

    base = [c % 17 for c in SPREAD]  # 0..16 of 20 right: room for 3 more
    sft_grpo = _stage_pipeline(wd, "sft_grpo", [("eval/base", base), ("eval/sft", [c + 2 for c in base]),
                                                ("eval/round-1", [c + 3 for c in base])])
    r1_zero = _stage_pipeline(wd, "r1_zero", [("eval/base", base), ("eval/round-1", [c + 1 for c in base])])
    att = sft_grpo.registered["attribution"]
    assert [(g["stage"], g["over"]) for g in att["stages"]] == [
        ("eval/sft", "eval/base"), ("eval/round-1", "eval/sft")]  # eval/final: the same eval
    assert att["phases"]["SFT"]["delta"] == pytest.approx(0.1)
    assert att["phases"]["GRPO"]["delta"] == pytest.approx(0.05)
    c = T.get_client()
    # the parent holds the headline only: the primary metric's final block, not every metric
    parent_metrics = c.get_run(sft_grpo.parent_run).data.metrics
    assert len(parent_metrics) <= 30 and "final/synthetic/avg_at_20" in parent_metrics
    assert not [k for k in parent_metrics if k.startswith("final/") and "avg_at_20" not in k]
    note = c.get_run(sft_grpo.parent_run).data.tags["mlflow.note.content"]
    assert "SFT alone gave +0.100" in note and "| eval/round-1 | eval/sft | +0.050" in note
    # above MLflow's "Show more" fold (issue 34, item 8): the result, then what earned it,
    # each one short paragraph, with three decimals; the tables after them
    head, earned, table = note.split("\n\n")[:3]
    assert head.startswith("**sft_grpo**: synthetic avg@20 0.") and len(head) < 250
    assert re.search(r"avg@20 0\.\d{3} \[0\.\d{3}, 0\.\d{3}\], [+-]0\.\d+ .* over the base "
                     r"\(paired\);", head), head
    assert earned.startswith("**What earned it") and "SFT alone gave +0.100" in earned
    assert table.startswith("| benchmark (avg@20, 95% CI) |")

    results = {"r1_zero": r1_zero, "sft_grpo": sft_grpo}
    cfgs = [_cfg(wd, "verdict", r) for r in results]
    said = recipes_verdict(cfgs, results, METRIC)
    assert said.startswith(f"sft_grpo beats r1_zero on {BENCH} {METRIC} by +0.100")
    assert "SFT alone gave +0.100" in said and "GRPO after SFT (1 round) +0.050" in said
    rows = stage_rows(results)
    # r1_zero's one stage gain (round-1 over base) is its recipe row again: left out
    # (issue 34, item 8); sft_grpo's two stages are not its final over its base
    assert [r["recipe"] for r in rows] == ["sft_grpo - sft over base", "sft_grpo - round-1 over sft"]
    rows = comparison_rows(results, METRIC) + rows
    md = to_markdown(rows)
    run = T.log_comparison(cfgs[0], wd, md, "recipe\n", None, [sft_grpo.parent_run, r1_zero.parent_run])
    T.describe_comparison(run, said, md, [sft_grpo.parent_run, r1_zero.parent_run],
                          {"id": "prefect-run-id", "url": None}, rows=rows)
    page = c.get_run(run).data.tags["mlflow.note.content"]
    assert page.startswith(f"**{said}**") and sft_grpo.parent_run in page and "prefect-run-id" in page
    # above the fold: the verdict, then one short line per recipe; the table after them
    lines = page.splitlines()
    assert lines[1].startswith("- r1_zero: 0.") and lines[2].startswith("- sft_grpo: 0.")
    assert all(len(x) < 100 for x in lines[1:3]) and "over the base" in lines[2]
    assert lines[4].startswith("| recipe |") and page.index("Parent runs") > page.index("| recipe |")
    exp = c.get_experiment(c.get_run(run).info.experiment_id)
    assert exp.tags["mlflow.note.content"].startswith(f"Verdict: {said}") and run in exp.tags["mlflow.note.content"]
    assert T.headline.VIEW_NAME in exp.tags["mlflow.note.content"]  # where the view is listed
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["compare", "--experiment", "verdict", "--workdir", str(wd)])
    assert out.exit_code == 0 and f"verdict: {said}" in out.output, out.output
