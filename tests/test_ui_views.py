"""What MLflow's web app reads from us without a printed link (issue 27): the headline
runs-table view listed under the experiment's "Views" menu, the headline columns as text
with CIs (the comparison run's row filled), and the round's charts on a readable scale.
Against a real `mlflow server` over HTTP; the saved-view contract is checked against the
installed MLflow's own web-app bundle, so an MLflow that stores views otherwise fails here.
The same in a real browser: bench/mlflow_ui_check.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
from mlflow_server import MlflowServer

from grpo_core.eval import headline, ui_views
from grpo_core.train.step_points import HEADLINE_CURVES, chart_copies
from tasks.tracking import headline as views

JS = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
# The runs page's saved-view parser (module "experiment-page saved views" in 3.17's bundle)
ENVELOPE_RULE = ("Invalid saved-view envelope: expected an object with a string `name`, "
                 "number `createdAt`, and string `state`")


def _bundle_has(text: str) -> bool:
    return any(text in p.read_text(errors="ignore") for p in JS.glob("*.js"))


def test_the_installed_web_app_lists_views_stored_as_we_store_them():
    """The tag prefix and the envelope are the web app's, not ours: both are in its bundle."""
    assert _bundle_has(f'"{ui_views.VIEW_TAG_PREFIX}"'), "MLflow's runs views moved off the tag"
    assert _bundle_has(ENVELOPE_RULE), "MLflow's saved-view envelope changed"


def _ui_parse(value: str) -> dict:
    """The web app's parser, rule for rule: what it lists needs these types."""
    env = json.loads(value)
    assert isinstance(env["name"], str) and isinstance(env["createdAt"], int)
    assert isinstance(env["state"], str)
    return json.loads(env["state"])


@pytest.mark.integration
def test_headline_view_saved_under_views_over_http(tmp_path, template_db):
    db = tmp_path / "server.db"
    shutil.copy(template_db, db)
    server = MlflowServer(tmp_path, db).start()
    try:
        server.wait_healthy()
        client = mlflow.MlflowClient(server.uri)
        exp_id = client.create_experiment("recipes")
        tag = ui_views.VIEW_TAG_PREFIX + ui_views.VIEW_KEY
        # a view as an earlier version wrote it (bare state, metric columns): replaced
        client.set_experiment_tag(exp_id, tag, json.dumps({"selectedColumns": [
            "metrics.`synthetic/final`", "tags.`gsm8k avg_at_8 final`"]}))
        key = views.set_experiment_view(client, exp_id, ["synthetic"], "avg@8")
        assert key == ui_views.VIEW_KEY
        status, got = server.request(f"/api/2.0/mlflow/experiments/get?experiment_id={exp_id}")
        assert status == 200
        tags = {t["key"]: t["value"] for t in got["experiment"]["tags"]}
        env = json.loads(tags[tag])
        assert env["name"] == ui_views.VIEW_NAME
        state = _ui_parse(tags[tag])
        cols = state["selectedColumns"]
        assert cols[:4] == ["attributes.`Models`", "tags.`gsm8k avg_at_8 final`",
                            "tags.`synthetic avg_at_8 base`", "tags.`synthetic avg_at_8 final`"]
        assert "tags.`synthetic avg_at_8 delta paired`" in cols
        assert "metrics.`synthetic/final`" not in cols and cols[-1] == "metrics.`findings`"
        assert state["columnOrder"] == cols
        # wide enough for a value and its CI (MLflow's default width cuts them)
        assert state["columnWidths"]["tags.`synthetic avg_at_8 base`"] >= 200
        assert set(state["columnWidths"]) == {c for c in cols if c.startswith("tags.")}
        # saved again (a second pipeline): still one view, created when it first was
        views.set_experiment_view(client, exp_id, ["synthetic"], "avg@8")
        again = json.loads(client.get_experiment(exp_id).tags[tag])
        assert again["createdAt"] == env["createdAt"] and _ui_parse(json.dumps(again)) == state
        assert len([k for k in client.get_experiment(exp_id).tags
                    if k.startswith(ui_views.VIEW_TAG_PREFIX)]) == 1
    finally:
        server.stop()


def test_headline_tags_say_the_metric_and_carry_the_ci():
    numbers = {"synthetic/base": 0.05375, "synthetic/base_lo": 0.035, "synthetic/base_hi": 0.0724,
               "synthetic/final": 0.18121874999999998, "synthetic/final_lo": 0.14,
               "synthetic/final_hi": 0.22, "synthetic/delta": 0.12746874999999998,
               "synthetic/delta_lo": 0.089, "synthetic/delta_hi": 0.153}
    tags = headline.headline_tags(["synthetic"], "avg@8", numbers)
    assert tags == {"synthetic avg_at_8 base": "0.054 [0.035, 0.072]",
                    "synthetic avg_at_8 final": "0.181 [0.140, 0.220]",
                    "synthetic avg_at_8 delta paired": "+0.127 [0.089, 0.153]"}
    # no base evaluation: no base cell (not "0"), and no delta
    assert list(headline.headline_tags(["synthetic"], "avg@8", {"synthetic/final": 0.5})) == [
        "synthetic avg_at_8 final"]


def test_comparison_row_names_its_recipes():
    """Rows as read back from comparison.csv (strings); only `A vs B` rows fill the row."""
    rows = [{"recipe": "r1_zero", "benchmark": "synthetic", "metric": "avg@8", "base": "0.054",
             "base_lo": "", "base_hi": "", "final": "0.121", "final_lo": "0.089",
             "final_hi": "0.153", "delta": "0.067", "delta_lo": "0.044", "delta_hi": "0.094"},
            {"recipe": "sft_grpo - sft over base", "benchmark": "synthetic", "metric": "avg@8",
             "base": "0.05", "final": "0.2", "delta": "0.15"},
            {"recipe": "sft_grpo vs r1_zero", "benchmark": "synthetic", "metric": "avg@8",
             "base": "0.121", "base_lo": "0.089", "base_hi": "0.153", "final": "0.20125",
             "final_lo": "0.156", "final_hi": "0.245", "delta": "0.08000000000000002",
             "delta_lo": "0.047", "delta_hi": "0.113"}]
    # One meaning per column (issue 34, item 8): the base column holds a base model's
    # number in every row, so the comparison row (whose "base" is r1_zero's final) leaves
    # base and final empty and fills the paired delta, naming both recipes.
    assert headline.comparison_tags(rows) == {
        "synthetic avg_at_8 delta paired": "sft_grpo - r1_zero +0.080 [0.047, 0.113]"}
    assert headline.comparison_tags(rows[:2]) == {}


def test_round_charts_readable_loss_and_headline_copies():
    out = chart_copies({"loss": 2.5e-8, "reward": 0.3, "in_round_eval/accuracy": 0.25,
                        "kl": 1e-4})
    assert out["loss_x1e6"] == pytest.approx(0.025)
    assert out["At a glance/reward"] == 0.3
    assert out["At a glance/accuracy_in_round_eval"] == 0.25
    # The run page sorts chart keys: every headline copy before every key it copies, and
    # the in-round eval's accuracy right after the training accuracy.
    order = sorted([*HEADLINE_CURVES.values(), *HEADLINE_CURVES])
    assert order[:len(HEADLINE_CURVES)] == sorted(HEADLINE_CURVES.values())
    folded = sorted([*HEADLINE_CURVES.values(), *HEADLINE_CURVES], key=str.lower)  # either sort
    assert set(folded[:len(HEADLINE_CURVES)]) == set(HEADLINE_CURVES.values())
    assert order.index("At a glance/accuracy_in_round_eval") == order.index("At a glance/accuracy") + 1
    assert "kl" not in out
    assert "loss_x1e6" not in chart_copies({"loss": 2.3}, grpo=False)  # SFT's loss reads as is
