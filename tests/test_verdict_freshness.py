"""A recipe verdict says which model versions it was computed with, and a newer champion
marks it STALE (issue 34, item 7): the rule (grpo_core.eval.freshness) and its MLflow side
(tasks.tracking.verdict_freshness) on a real SQLite store. The deployment path end to end:
tests/test_deployment.py."""
import json

from mlflow import MlflowClient

from grpo_core.eval.freshness import computed_with, stale, stale_line
from tasks.tracking import verdict_freshness
from tasks.tracking.verdict_freshness import comparison_verdict

RECORDED = {"p-r1_zero": {"version": "2", "champion": "1"}, "p-sft_grpo": {"version": "1", "champion": "1"}}


def test_the_rule():
    assert computed_with(RECORDED) == ("computed with p-r1_zero v2 (champion v1 then), "
                                       "p-sft_grpo v1 (champion)")
    assert stale(RECORDED, {"p-r1_zero": "2", "p-sft_grpo": "1"}) == {}  # its own v2 promoted
    assert stale(RECORDED, {"p-r1_zero": "1", "p-sft_grpo": None}) == {}
    found = stale(RECORDED, {"p-r1_zero": "3", "p-sft_grpo": "1"})
    assert found == {"p-r1_zero": ("2", "3")}
    assert stale_line(found).startswith("STALE: p-r1_zero's champion is now v3, newer than the v2")
    assert stale_line({}) == ""


def test_a_newer_champion_marks_the_verdict_stale(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(uri, uri)
    exp = c.create_experiment("p", artifact_location=str(tmp_path / "art"))
    parents = []
    c.create_registered_model("p-r1_zero")
    for _ in range(3):  # v1..v3 of one model, each its parent run's
        run = c.create_run(exp).info.run_id
        v = c.create_model_version("p-r1_zero", f"runs:/{run}/model", run_id=run).version
        c.set_tag(run, "grpo.registered_model", "p-r1_zero")
        c.set_tag(run, "grpo.model_version", v)
        parents.append(run)
    c.set_registered_model_alias("p-r1_zero", "champion", "1")
    comp = c.create_run(exp, tags={"grpo.pipeline": "comparison", "grpo.verdict": "a beats b",
                                   "mlflow.note.content": "**a beats b**\n\nParent runs: ..."}).info.run_id
    c.set_experiment_tag(exp, "mlflow.note.content", "Verdict: a beats b\n\n- links")
    line = verdict_freshness.stamp(comp, [parents[1]], c)  # computed with v2, champion v1
    assert line == "computed with p-r1_zero v2 (champion v1 then)"
    assert json.loads(c.get_run(comp).data.tags["grpo.verdict_versions"]) == {
        "p-r1_zero": {"version": "2", "champion": "1"}}
    assert c.get_experiment(exp).tags["mlflow.note.content"].startswith(
        "Verdict: a beats b\n(computed with p-r1_zero v2")
    assert verdict_freshness.mark_if_stale("p", c) == ""  # champion v1: older than the verdict's
    assert comparison_verdict(uri, "p") == "a beats b (computed with p-r1_zero v2 (champion v1 then))"

    c.set_registered_model_alias("p-r1_zero", "champion", "3")  # e.g. a retrain promoted v3
    said = verdict_freshness.mark_if_stale("p", c)
    assert said.startswith("STALE: p-r1_zero's champion is now v3, newer than the v2"), said
    note = c.get_experiment(exp).tags["mlflow.note.content"]
    assert note.startswith(said + "\n\nVerdict: a beats b"), note
    assert c.get_run(comp).data.tags["grpo.verdict_stale"] == said
    assert comparison_verdict(uri, "p").endswith(said)
    assert verdict_freshness.mark_if_stale("p", c) == said  # refreshed, not stacked
    assert c.get_experiment(exp).tags["mlflow.note.content"].count("STALE: ") == 1
