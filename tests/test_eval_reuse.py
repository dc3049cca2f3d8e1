"""The final evaluation does not generate again what the last round's evaluation scored:
a benchmark this model was already scored on under the same protocol is read back from
that stage's cache entry (tasks.stages.scored_already); only the others are generated.
Real parts: the built-in tiny model, a DuckDB store, an MLflow SQLite store, GSM8K test
from ../shared/data (skipped without it)."""
from __future__ import annotations

from mlflow.tracking import MlflowClient

from grpo_core import workspace
from grpo_core.workspace import Workspace
from tasks import stages
from tasks import tracking as T


def test_final_eval_reads_back_the_benchmark_the_round_scored(tracked_config, shared_data,
                                                              monkeypatch):
    cfg, wd = tracked_config
    cfg.model.name_or_path = "builtin:tiny-arith"
    cfg.data.data_dir = str(shared_data)
    cfg.eval.limit, cfg.eval.samples, cfg.eval.max_new_tokens = 3, 1, 4
    cfg.eval.benchmarks = ["synthetic", "gsm8k"]
    parent = T.start_parent_run(cfg, cfg.hash(), "r1_zero", "abc", "flow", wd)
    ctx = stages.Ctx(cfg=cfg, ws=Workspace(wd), parent_run=parent, progress=False)
    model = stages.base_model(ctx)

    generated = []  # the benchmarks the evaluation generated for
    from grpo_core.eval import evaluation

    real = evaluation.evaluate_benchmark

    def counting(model_path, bench, *a, **kw):
        generated.append(bench)
        return real(model_path, bench, *a, **kw)

    monkeypatch.setattr(evaluation, "evaluate_benchmark", counting)
    round_ = stages.evaluate_model(ctx, model, "eval/round-1", ["synthetic"])
    assert generated == ["synthetic"]
    final = stages.evaluate_model(ctx, model, "eval/final", ["synthetic", "gsm8k"])
    assert generated == ["synthetic", "gsm8k"]  # gsm8k only: synthetic read back
    assert final.cached is False and list(final.benchmarks) == ["synthetic", "gsm8k"]
    assert final.benchmarks["synthetic"] == round_.benchmarks["synthetic"]
    assert final.benchmarks["gsm8k"].metrics["n_problems"] == 3
    # The final eval's run shows both per-problem tables, the reused one copied over.
    client = MlflowClient(tracking_uri=workspace.tracking_uri(cfg, wd))
    names = {a.path for a in client.list_artifacts(final.mlflow_run, "eval")}
    assert names == {"eval/synthetic.json", "eval/gsm8k.json"}

    # Another protocol (more new tokens) is another evaluation: nothing is read back.
    cfg.eval.max_new_tokens = 5
    stages.evaluate_model(ctx, model, "eval/final", ["synthetic", "gsm8k"])
    assert generated[2:] == ["synthetic", "gsm8k"]
