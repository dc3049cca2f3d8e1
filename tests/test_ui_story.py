"""What a user finds in MLflow after the main job, read through MLflow's API: `grpo run`
(both shipped recipes, shrunk, on the built-in model: the `main_job` fixture) in a subprocess, then the facts the
UI shows. The same facts in a real browser: bench/mlflow_ui_check.py.

- each parent run carries the headline metrics under short names (base, final, paired
  delta per benchmark with CIs; steps, wall time, findings), and a description;
- the comparison run carries the comparison table as metrics and params;
- child runs start and end with their stage (durations true) and are named after the
  recipe, so two recipes' stages are told apart;
- the experiment opens on the runs table with the headline columns (a saved view), and
  `grpo run` prints the links to it and to the comparison run."""
from __future__ import annotations

import json
import re

import pytest

from tasks.tracking.mlflow_client import stage_of

pytest_plugins = ["fixtures_models"]
pytestmark = pytest.mark.integration

RECIPES = ("r1_zero", "sft_grpo")
HEADLINE = ["synthetic/base", "synthetic/final", "synthetic/delta"]


@pytest.fixture(scope="module")
def mlflow_side(main_job):
    """What the main job left in MLflow: (stdout, client, experiment, runs)."""
    from mlflow import MlflowClient

    workdir, stdout = main_job
    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    exp = client.get_experiment_by_name("recipes")
    return stdout, client, exp, client.search_runs([exp.experiment_id], max_results=500)


def _parents(runs) -> dict:
    return {r.data.tags["recipe"]: r for r in runs if r.data.tags.get("grpo.pipeline") == "parent"}


def test_parents_carry_the_headline_metrics(mlflow_side):
    _, _, _, runs = mlflow_side
    parents = _parents(runs)
    assert set(parents) == set(RECIPES)
    for recipe, p in parents.items():
        m = p.data.metrics
        for key in HEADLINE:
            assert key in m and f"{key}_lo" in m and f"{key}_hi" in m, (recipe, key, sorted(m))
            assert m[f"{key}_lo"] <= m[key] <= m[f"{key}_hi"]
        # the same numbers as the long-named final metrics, the delta is final minus base
        assert m["synthetic/final"] == m["final/synthetic/avg_at_2"]
        assert m["synthetic/delta"] == pytest.approx(m["synthetic/final"] - m["synthetic/base"])
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
        grpo_steps = sum(r.data.metrics.get("grpo/steps", 0) for r in kids)
        assert m["grpo_steps"] == grpo_steps == 4  # two rounds of grpo.max_steps 2
        assert m["sft_steps"] == (2 if recipe == "sft_grpo" else 0)
        assert m["findings"] == len([f for f in p.data.tags["findings"].split(" | ") if f != "none"])
        # one count of findings (issue 27): the parent's tag and description, its rounds'
        assert p.data.tags["findings.count"] in p.data.tags["mlflow.note.content"]
        assert len(m) <= 30, sorted(m)  # the headline only
        assert 0 < m["wall_min"] < 15
        note = p.data.tags["mlflow.note.content"]
        assert note.startswith(f"**{recipe}**: synthetic avg@2")
        assert f"| synthetic | {m['synthetic/base']:.3f} [" in note  # the headline table
        assert f"| {m['synthetic/delta']:+.3f} [" in note


def test_comparison_run_holds_the_table(mlflow_side):
    _, client, _, runs = mlflow_side
    (comp,) = [r for r in runs if r.data.tags.get("grpo.pipeline") == "comparison"]
    m, parents = comp.data.metrics, _parents(runs)
    for recipe in RECIPES:
        p = parents[recipe].data.metrics
        for col in ("base", "final", "delta"):
            assert m[f"{recipe}/synthetic/{col}"] == pytest.approx(p[f"synthetic/{col}"])
        assert comp.data.params[f"{recipe}/synthetic"].startswith("base ")
    pair = m["sft_grpo vs r1_zero/synthetic/delta"]
    assert pair == pytest.approx(parents["sft_grpo"].data.metrics["synthetic/final"]
                                 - parents["r1_zero"].data.metrics["synthetic/final"])
    assert comp.data.params["metric"] == "avg@2"
    assert "| sft_grpo vs r1_zero | synthetic |" in comp.data.tags["mlflow.note.content"]
    # issue 27: the verdict first on its page, on the experiment's landing text (linked to
    # the comparison and parent runs), and in `grpo run`'s closing lines; each stage's gain
    said = comp.data.tags["grpo.verdict"]
    assert comp.data.tags["mlflow.note.content"].startswith(f"**{said}**")
    landing = client.get_experiment(comp.info.experiment_id).tags["mlflow.note.content"]
    assert landing.startswith(f"Verdict: {said}") and f"/runs/{comp.info.run_id}" in landing
    assert all(f"/runs/{p.info.run_id}" in landing for p in parents.values())
    stdout = mlflow_side[0]
    assert f"verdict: {said}" in stdout
    # each stage's gain as a row of its own, unless it is the recipe's whole gain already
    # (one stage that moved the model: its row would repeat the recipe's)
    two_stages = "GRPO after SFT" in said
    assert ("| sft_grpo - sft over base | synthetic |" in comp.data.tags["mlflow.note.content"]) \
        == two_stages, said
    assert ("sft_grpo - sft over base/synthetic/delta" in m) == two_stages


def test_child_runs_last_as_long_as_their_stage(mlflow_side):
    _, client, _, runs = mlflow_side
    parents = _parents(runs)
    names = {}
    for recipe, p in parents.items():
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
        assert {"data", "eval/base", "filter/round-1", "grpo/round-1", "eval/final"} <= \
            {stage_of(k) for k in kids}
        for k in kids:
            names[k.info.run_name] = recipe
            assert k.info.run_name == f"{recipe}/{stage_of(k)}"
            assert k.info.status == "FINISHED" and k.info.end_time is not None
            assert p.info.start_time <= k.info.start_time <= k.info.end_time <= p.info.end_time
            seconds = k.data.metrics.get("stage/seconds")
            if seconds is not None:  # computed here (a cache hit has no stage time of its own)
                took = (k.info.end_time - k.info.start_time) / 1000
                assert abs(took - seconds) < 5, (k.info.run_name, took, seconds)
    # a GRPO round's page: its diagnosis as description, no charts flat by construction
    for k in (k for k in runs if stage_of(k) == "grpo/round-1"):
        assert k.data.tags["mlflow.note.content"].startswith(
            f"**Diagnosis of this round**: {k.data.tags['findings.count']}")
        assert "reward" in k.data.metrics
        assert not [m for m in k.data.metrics if m.startswith("clip_ratio/")]
    # computed stages exist in both recipes, and the two recipes' runs are told apart
    assert any(k.data.metrics.get("stage/seconds", 0) > 1 for k in runs
               if stage_of(k) == "grpo/round-1")
    assert len(names) == len([r for r in runs if "mlflow.parentRunId" in r.data.tags])


def test_experiment_opens_on_the_headline_table(mlflow_side):
    stdout, client, exp, runs = mlflow_side
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    envelope = json.loads(exp.tags["mlflow.sharedViewState.grpo-headline"])
    assert envelope["name"]  # listed under the runs table's Views menu by this name
    view = json.loads(envelope["state"])
    cols = [f"tags.`synthetic avg_at_2 {c}`" for c in ("base", "final", "delta paired")]
    assert view["selectedColumns"][1:4] == cols and view["columnOrder"] == view["selectedColumns"]
    (comp,) = [r for r in runs if r.data.tags.get("grpo.pipeline") == "comparison"]
    # every parent's cells filled, with CIs; the comparison's row fills the paired delta
    # only (its "base" would be r1_zero's final: one meaning per column, issue 34 item 8)
    for run in _parents(runs).values():
        for col in cols:
            assert re.search(r"\d \[-?\d", run.data.tags[col[6:-1]]), (run.info.run_name, col)
    assert not {c[6:-1] for c in cols[:2]} & set(comp.data.tags)
    assert comp.data.tags["synthetic avg_at_2 delta paired"].startswith("sft_grpo - r1_zero ")
    base = rf"http://127\.0\.0\.1:5000/#/experiments/{exp.experiment_id}/runs"
    assert re.search(rf"comparison run: {base}/{comp.info.run_id}\?workflowType=machine_learning",
                     stdout), stdout[-2000:]
    assert re.search(rf"runs table: {base}\?workflowType=machine_learning&viewStateShareKey="
                     "grpo-headline", stdout)
    assert "mlflow ui --backend-store-uri sqlite:///" in stdout


def test_champions_load_as_mlflow_models_and_generate(mlflow_side, monkeypatch):
    """`mlflow.transformers.load_model("models:/<project>-<recipe>@champion")`, as a user
    would serve or load it, on the built-in model the main job trained and registered."""
    import mlflow.transformers

    _, client, exp, runs = mlflow_side
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)
    parents = _parents(runs)
    for recipe in RECIPES:
        name = f"recipes-{recipe}"
        mv = client.get_model_version_by_alias(name, "champion")
        assert mv.run_id == parents[recipe].info.run_id
        assert mv.tags["grpo.model_format"] == "mlflow-transformers"
        pipe = mlflow.transformers.load_model(f"models:/{name}@champion")
        out = pipe("What is 2 + 3?", max_new_tokens=4, do_sample=False)
        assert out[0]["generated_text"].startswith("What is 2 + 3?")
        assert len(pipe.tokenizer(out[0]["generated_text"])["input_ids"]) > \
            len(pipe.tokenizer("What is 2 + 3?")["input_ids"])


def test_compute_stands_beside_the_gain(mlflow_side):
    """Issue 46: each recipe's training compute on its parent (compute/*), a table of it
    under the comparison, and the verdict saying whether the recipes were compute-matched
    (sft_grpo spends SFT on top of the same GRPO steps: more TFLOP, not matched)."""
    stdout, _, _, runs = mlflow_side
    parents = _parents(runs)
    m = {r: parents[r].data.metrics for r in RECIPES}
    for recipe in RECIPES:
        assert m[recipe]["compute/grpo_steps"] == 4 and m[recipe]["compute/grpo_s"] > 0
        assert m[recipe]["compute/train_tflop"] > 0 and m[recipe]["compute/train_tokens"] > 0
        assert m[recipe]["compute/gen_tokens"] > 0 and m[recipe]["compute/filter_s"] > 0
    assert m["r1_zero"]["compute/sft_s"] == 0 < m["sft_grpo"]["compute/sft_s"]
    assert m["sft_grpo"]["compute/sft_steps"] == 2
    assert "Compute (what each recipe spent" in stdout
    rows = {line.split(" | ")[0].strip("| "): line for line in stdout.splitlines()
            if re.match(r"\| (r1_zero|sft_grpo) \| \d+ \(\d+\) \|", line)}
    assert set(rows) == set(RECIPES), stdout[-3000:]
    assert rows["r1_zero"].startswith("| r1_zero | 0 (0) |")
    said = next(line for line in stdout.splitlines() if line.startswith("verdict: "))
    ratio = m["sft_grpo"]["compute/train_tflop"] / m["r1_zero"]["compute/train_tflop"]
    assert f"sft_grpo spent {ratio:.2f}x r1_zero's training TFLOP" in said, said
    assert ("; not compute-matched: " in said) == (abs(ratio - 1) > 0.10), said
