"""tasks.tracking against a real MLflow: SQLite stores under tmp_path (no mocks), plus one
`integration` test over HTTP against a real `mlflow server`.

A fresh SQLite store spends ~8 s on schema migrations, so the session migrates one
template database and each test copies it (0.2 s)."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest
from mlflow_server import MlflowServer

from grpo_core import workspace
from grpo_core.config import PipelineConfig
from grpo_core.eval.comparison import COMPARE_COLUMNS
from grpo_core.eval.metric_names import eval_metrics, sanitize_key
from grpo_core.eval.score import BenchmarkScore
from grpo_core.eval.ui_views import read_view
from grpo_core.findings import Finding
from grpo_core.redaction import is_secret_name, redact
from grpo_core.train.step_points import RUN_SUMMARY
from tasks import tracking as T
from tasks.finish import finish_pipeline
from tasks.preflight import PreflightError, check_reachable
from tasks.tracking.step_logger import StepLogger

SECRET = "sekrit-7f3a9"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def store(tmp_path, template_db, monkeypatch):
    """A config whose workdir holds a migrated, empty SQLite store; cwd is a scratch folder
    so a stray ./mlruns would be seen."""
    wd = tmp_path / "wd"
    wd.mkdir()
    shutil.copy(template_db, wd / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cfg = PipelineConfig()
    cfg.project.workdir = str(wd)
    cfg.project.name = "trk"
    cfg.project.recipe = "r1_zero"
    return cfg, wd


COLLAPSE = Finding.note("collapse", "frac_reward_zero_std > 0.9 for 5 steps (step 3)", "info",
                       steps=[3])


def _parent(cfg, wd, flow_run="flow-1", **kw) -> str:
    return T.start_parent_run(cfg, cfg.hash(), cfg.project.recipe, "abc1234", flow_run, wd, **kw)


def _all_artifact_files(client, run_id, path=None):
    for f in client.list_artifacts(run_id, path):
        if f.is_dir:
            yield from _all_artifact_files(client, run_id, f.path)
        else:
            yield f.path


# ------------------------------------------------------------------ pure helpers

def test_is_secret_name_word_wise():
    for name in ["HF_TOKEN", "hub_token", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY",
                 "api_key", "apiKey", "OPENAI_API_KEY", "hftoken", "db_passwd", "client_secret",
                 "ssh_keys", "credentials"]:
        assert is_secret_name(name), name
    # The config's own fields that merely contain the letters.
    for name in ["max_tokens", "min_tokens", "max_new_tokens", "keywords", "reasoning_keywords",
                 "num_tokens", "beta", "tokenizer"]:
        assert not is_secret_name(name), name


def test_redact_nested_and_urls():
    tree = {"a": {"hub_token": SECRET, "max_tokens": 800, "n": None, "api_key": None},
            "list": [{"password": SECRET}, "x"],
            "uri": f"https://bob:{SECRET}@host:5000/x", "plain": "https://host/x",
            "length": {"min_tokens": 200}}
    out = redact(tree)
    assert SECRET not in json.dumps(out)
    assert out["a"]["hub_token"] == "***" and out["list"][0]["password"] == "***"
    assert out["a"]["max_tokens"] == 800 and out["length"]["min_tokens"] == 200
    assert out["a"]["api_key"] is None  # nothing to hide, and saying so leaks nothing
    assert out["uri"] == "https://bob:***@host:5000/x" and out["plain"] == "https://host/x"
    assert tree["a"]["hub_token"] == SECRET  # a copy: the input is untouched


def test_parent_run_params_are_the_flattened_config(store):
    cfg, wd = store
    parent = _parent(cfg, wd)  # connects this test's store
    params = T.get_client().get_run(parent).data.params
    assert params["grpo.beta"] == "0.04"
    assert params["filter.band"] == "[0.3, 0.7]"
    assert params["data.train.0.source"] == "synthetic:arith"
    assert params["rewards.length.max_tokens"] == "800"  # not mistaken for a secret
    assert all(len(v) <= 6000 for v in params.values())


def test_sanitize_key():
    assert sanitize_key("pass@4") == "pass_at_4"
    assert sanitize_key("rewards/accuracy(x)/mean") == "rewards/accuracy_x_/mean"
    assert sanitize_key("a//b/./c/") == "a/b/c"
    assert sanitize_key("/lead") == "lead"
    assert sanitize_key("ok-name.1 x") == "ok-name.1 x"
    assert sanitize_key("a:b") == "a_b"


def test_tracking_uri_resolution(tmp_path, monkeypatch):
    cfg = PipelineConfig()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert workspace.tracking_uri(cfg, tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert workspace.tracking_uri(cfg, tmp_path) == "http://127.0.0.1:1"
    cfg.tracking.tracking_uri = "sqlite:////x/y.db"
    assert workspace.tracking_uri(cfg, tmp_path) == "sqlite:////x/y.db"
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert workspace.artifact_root("http://h:1", tmp_path, "e") is None
    assert workspace.artifact_root("sqlite:////x.db", tmp_path, "my exp") == \
        (tmp_path.resolve() / "mlartifacts" / "my-exp").as_uri()


def test_check_reachable_unused_port_fails_fast():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    uri = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(PreflightError) as err:
        check_reachable(uri, timeout=3)
    assert time.monotonic() - t0 < 10 and err.value.exit_code == 1
    assert uri in str(err.value)
    # Credentials in the URI never reach the message.
    with pytest.raises(PreflightError) as err:
        check_reachable(f"http://bob:{SECRET}@127.0.0.1:{port}", timeout=3)
    assert SECRET not in str(err.value) and f"127.0.0.1:{port}" in str(err.value)


# ------------------------------------------------------------------ runs

def test_parent_and_children_reused_on_resume(store):
    cfg, wd = store
    parent = _parent(cfg, wd)
    client = T.get_client()
    run = client.get_run(parent)
    tags = run.data.tags
    assert tags["recipe"] == "r1_zero" and tags["config_hash"] == cfg.hash()
    assert tags["git_commit"] == "abc1234" and tags["prefect_flow_run_id"] == "flow-1"
    assert tags["grpo.pipeline"] == "parent"
    assert run.data.params["grpo.beta"] == "0.04"
    assert run.data.params["eval.primary_metric"] == "greedy_accuracy"
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "trk"
    assert exp.artifact_location == (wd.resolve() / "mlartifacts" / "trk").as_uri()
    files = set(_all_artifact_files(client, parent))
    assert {"config/resolved.yaml", "config/environment.json"} <= files
    import yaml

    local = client.download_artifacts(parent, "config/resolved.yaml", str(wd / "dl"))
    resolved = yaml.safe_load(Path(local).read_text())
    assert resolved["grpo"]["beta"] == 0.04

    names = ["data", "filter/round-1", "sft", "grpo/round-1", "eval/round-1", "eval/final"]
    kids = {n: T.child_run(parent, n) for n in names}
    assert len(set(kids.values())) == len(names)
    for n, rid in kids.items():
        r = client.get_run(rid)
        assert r.info.run_name == f"r1_zero/{n}" and r.data.tags["grpo.stage"] == n
        assert r.data.tags["mlflow.parentRunId"] == parent
        assert r.data.tags["recipe"] == "r1_zero"

    # Killed mid-round: the same config resumes under the same parent and children.
    client.set_terminated(kids["grpo/round-1"], "KILLED")
    client.set_terminated(parent, "KILLED")
    again = _parent(cfg, wd, flow_run="flow-2")
    assert again == parent
    r = client.get_run(parent)
    assert r.info.status == "RUNNING" and r.data.tags["prefect_flow_run_id"] == "flow-2"
    assert r.data.tags["grpo.resumes"] == "1"
    assert T.child_run(parent, "grpo/round-1") == kids["grpo/round-1"]
    assert client.get_run(kids["grpo/round-1"]).info.status == "RUNNING"
    state = json.loads((wd / "runs" / f"{cfg.hash()}.json").read_text())
    assert state["run_id"] == parent and state["status"] == "RUNNING"

    # A finished config run again is a cache hit: still the same parent.
    with pytest.raises(ValueError, match="contains the artifact store"):
        T.register_model(parent, wd, "m")  # the workdir itself: would copy into itself
    finish_pipeline(parent, cfg, _fake_model(wd / "model", "x"), {}, [], wd)
    assert client.get_run(parent).info.status == "FINISHED"
    assert all(client.get_run(k).info.status == "FINISHED" for k in kids.values())
    assert json.loads((wd / "runs" / f"{cfg.hash()}.json").read_text())["status"] == "FINISHED"
    assert _parent(cfg, wd, flow_run="flow-3") == parent

    # Another config gets its own parent run.
    cfg.grpo.beta = 0.02
    assert _parent(cfg, wd) != parent
    assert not (wd.parent / "cwd" / "mlruns").exists()


def test_no_secret_reaches_params_tags_or_artifacts(store, monkeypatch):
    cfg, wd = store
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("GRPO_API_KEY", SECRET)
    parent = _parent(cfg, wd, extra_params={"hub_token": SECRET, "db": f"postgresql://u:{SECRET}@h/d",
                                            "nested": {"secret": SECRET, "max_tokens": 7}})
    child = T.child_run(parent, "sft")
    T.set_tags(child, {"api_key": SECRET, "note": "fine"})
    T.log_json(child, redact({"token": SECRET}), "data/x.json")
    client = T.get_client()
    for rid in (parent, child):
        run = client.get_run(rid)
        blob = json.dumps([run.data.params, run.data.tags])
        assert SECRET not in blob
        dst = wd / "dl" / rid
        dst.mkdir(parents=True)
        client.download_artifacts(rid, "", str(dst))
        for f in dst.rglob("*"):
            if f.is_file():
                assert SECRET.encode() not in f.read_bytes(), f
    run = client.get_run(parent)
    assert run.data.params["hub_token"] == "***" and run.data.params["nested.max_tokens"] == "7"
    env = json.loads((wd / "dl" / parent / "config" / "environment.json").read_text())["env"]
    assert env["HF_TOKEN"] == "***" and env["GRPO_API_KEY"] == "***"


def test_metrics_sanitised_skipped_and_batched(store):
    import numpy as np

    cfg, wd = store
    run = T.child_run(_parent(cfg, wd), "eval/round-1")
    n = T.log_metrics(run, {"pass@4": 0.5, "a(b)": 1, "x//y": 2.0, "nan": float("nan"),
                            "none": None, "inf": math.inf, "np": np.float32(0.25), "flag": True,
                            "text": "skip", "ci": {"mean": 0.4, "lo": 0.3, "hi": 0.5, "n": 20},
                            "nested": {"by_level": {"1": 0.9}}}, step=3)
    m = T.get_client().get_run(run).data.metrics
    assert m == {"pass_at_4": 0.5, "a_b_": 1.0, "x/y": 2.0, "np": 0.25, "flag": 1.0, "ci": 0.4,
                 "ci_ci_lo": 0.3, "ci_ci_hi": 0.5, "ci_n": 20.0, "nested/by_level/1": 0.9}
    assert n == len(m)
    assert T.has_metrics(run)
    many = {f"m/{i}": float(i) for i in range(1500)}  # beyond one log_batch (1000)
    assert T.log_metrics(run, many) == 1500
    assert len(T.get_client().get_run(run).data.metrics) == len(m) + 1500


def test_eval_metrics_flatten_for_compare():
    flat = eval_metrics({"gsm8k": BenchmarkScore(protocol_hash="abc", metrics={
        "greedy_accuracy": {"mean": 0.5, "lo": 0.4, "hi": 0.6, "n": 10},
        "pass@4": {"mean": 0.7, "lo": 0.6, "hi": 0.8}, "ks": [1, 2, 4], "k": 4})})
    assert flat["gsm8k/greedy_accuracy"] == 0.5 and flat["gsm8k/greedy_accuracy_ci_hi"] == 0.6
    assert flat["gsm8k/pass_at_4_ci_lo"] == 0.6 and flat["gsm8k/k"] == 4
    assert "gsm8k/ks" not in flat


def test_artifacts_pngs_and_tables_in_store(store):
    cfg, wd = store
    parent = _parent(cfg, wd)
    grpo, filt, ev = (T.child_run(parent, n) for n in ("grpo/round-1", "filter/round-1", "eval/final"))
    hist = [{"step": s, "reward": 0.1 * s, "reward_std": 0.3, "completions/mean_length": 20.0,
             "frac_reward_zero_std": 0.25} for s in range(1, 8)]  # kl absent (beta = 0)
    assert T.log_training_curves(grpo, hist, "grpo") == "plots/grpo_curves.png"
    assert T.log_passrate_histogram(filt, [0.0, 0.25, 0.5, 0.5, 1.0], (0.3, 0.7), k=8) == \
        "plots/passrate_histogram.png"
    rows = [{"problem_id": f"p{i}", "level": 1, "gold": str(i), "greedy_answer": str(i),
             "greedy_correct": i % 2 == 0, "greedy_completion": "x" * 5000,
             "sample_answers": [str(i), None], "sample_correct": [True, False]} for i in range(4)]
    assert T.log_eval_table(ev, rows, "eval/synthetic.json") == "eval/synthetic.json"
    T.log_eval_table(ev, rows, "eval/synthetic.json")  # replaced, not appended
    T.log_json(ev, {"a": (1, 2), "p": Path("/x")}, "eval/summary.json")
    T.log_text(ev, "hello", "notes/readme.txt")

    client = T.get_client()
    for rid, path in ((grpo, "plots/grpo_curves.png"), (filt, "plots/passrate_histogram.png")):
        # Files in the local artifact store under the workdir, never ./mlruns.
        local = Path(client.get_run(rid).info.artifact_uri.removeprefix("file://")) / path
        assert local.is_file() and local.read_bytes()[:8] == PNG_MAGIC
        assert str(local).startswith(str(wd.resolve() / "mlartifacts"))
    table_file = Path(client.download_artifacts(ev, "eval/synthetic.json", str(wd / "dl")))
    table = json.loads(table_file.read_text())
    assert len(table["data"]) == 4
    cols = table["columns"]
    for col in ("problem_id", "level", "gold", "greedy_completion", "correct", "sample_answers"):
        assert col in cols
    assert len(table["data"][0][cols.index("greedy_completion")]) < 2100
    assert json.loads(Path(client.download_artifacts(ev, "eval/summary.json", str(wd / "dl")))
                      .read_text()) == {"a": [1, 2], "p": "/x"}
    assert not (wd.parent / "cwd" / "mlruns").exists()


# ------------------------------------------------------------------ registry

def _fake_model(dirpath: Path, tag: str) -> Path:
    dirpath.mkdir(parents=True)
    (dirpath / "config.json").write_text(json.dumps({"model_type": "llama", "tag": tag}))
    (dirpath / "model.safetensors").write_bytes(b"\0" * 64)
    return dirpath


def test_register_and_promote_champion(store):
    cfg, wd = store
    name = "trk-r1_zero"
    p1 = _parent(cfg, wd)
    c = T.get_client()
    v1 = T.register_model(p1, _fake_model(wd / "m1", "one"), name)
    assert v1 == "1"
    assert str(c.get_model_version_by_alias(name, "challenger").version) == "1"
    d = T.promote(c, name, v1, "greedy_accuracy", 0.50, 0.40, ci_hi=0.60,
                  protocol_hash="P")
    assert d.promoted and "no champion" in d.reason
    assert str(c.get_model_version_by_alias(name, "champion").version) == "1"
    tags = c.get_model_version(name, "1").tags
    assert tags["grpo.greedy_accuracy"] == "0.5" and tags["grpo.greedy_accuracy.ci_hi"] == "0.6"
    assert tags["grpo.decision"] == "promoted"
    # Registering the same run again is a no-op (a re-run of a finished config).
    assert T.register_model(p1, wd / "m1", name) == "1"

    cfg.grpo.beta = 0.01
    p2 = _parent(cfg, wd)
    v2 = T.register_model(p2, _fake_model(wd / "m2", "two"), name)
    # Better than the champion's mean but inside its CI: not a win.
    d = T.promote(c, name, v2, "greedy_accuracy", 0.55, 0.45, ci_hi=0.65,
                  protocol_hash="P")
    assert not d.promoted and "upper CI 0.600 " in d.reason  # three decimals, as every number shown
    assert str(c.get_model_version_by_alias(name, "champion").version) == "1"
    assert str(c.get_model_version_by_alias(name, "challenger").version) == v2
    assert c.get_model_version(name, v2).tags["grpo.decision"] == "rejected"

    cfg.grpo.beta = 0.02
    p3 = _parent(cfg, wd)
    v3 = T.register_model(p3, _fake_model(wd / "m3", "three"), name)
    # Clearly better but measured under another eval protocol: not compared.
    d = T.promote(c, name, v3, "greedy_accuracy", 0.9, 0.85, ci_hi=0.95,
                  protocol_hash="Q")
    assert not d.promoted and "protocol" in d.reason
    # The same, measured under the same protocol: promoted.
    d = T.promote(c, name, v3, "greedy_accuracy", 0.9, 0.85, ci_hi=0.95,
                  protocol_hash="P")
    assert d.promoted and "> champion v1" in d.reason
    assert str(c.get_model_version_by_alias(name, "champion").version) == v3
    # Numbers supplied by the caller (champion re-evaluated) win over stored tags.
    d = T.promote(c, name, v2, "greedy_accuracy", 0.55, 0.45, ci_hi=0.65,
                  champion_metrics={"greedy_accuracy": {"mean": 0.3, "lo": 0.2,
                                                        "hi": 0.4}})
    assert d.promoted and str(c.get_model_version_by_alias(name, "champion").version) == v2

    assert T.champion_uri(name) == f"models:/{name}@champion"
    folder = T.download_champion(name, wd / "champ")
    assert json.loads((folder / "config.json").read_text())["tag"] == "two"
    assert T.download_champion(name, wd / "champ") == folder  # cached: same version
    with pytest.raises(LookupError):
        T.download_champion("no-such-model", wd / "none")


def test_finish_pipeline_and_compare_table(store):
    cfg, wd = store
    cfg.project.name = "recipes"
    results = {}
    for recipe, base, final in (("r1_zero", 0.2, 0.5), ("sft_grpo", 0.2, 0.6)):
        cfg.project.recipe = recipe
        parent = _parent(cfg, wd)
        for label, acc in (("eval/base", base), ("eval/final", final)):
            run = T.child_run(parent, label)
            T.log_metrics(run, eval_metrics({"synthetic": BenchmarkScore(metrics={
                "greedy_accuracy": {"mean": acc, "lo": acc - 0.1, "hi": acc + 0.1, "n": 50}})}))
        final_res = {"synthetic": BenchmarkScore(protocol_hash="P", metrics={
            "greedy_accuracy": {"mean": final, "lo": final - 0.1, "hi": final + 0.1}})}
        out = finish_pipeline(parent, cfg, _fake_model(wd / f"m-{recipe}", recipe), final_res,
                                [COLLAPSE], wd)
        results[recipe] = out
        assert out["promoted"] and out["model_name"] == f"recipes-{recipe}"
        assert "synthetic greedy_accuracy" in out["summary"]
    client = T.get_client()
    p = client.get_run(results["r1_zero"]["parent_run"])
    assert p.info.status == "FINISHED" and p.data.metrics["final/synthetic/greedy_accuracy"] == 0.5
    assert p.data.tags["findings"] == COLLAPSE.line()
    # Headline numbers under short names (no base eval here: no base/delta, not 0s) ...
    m = p.data.metrics
    assert m["synthetic/final"] == 0.5 and m["synthetic/final_lo"] == pytest.approx(0.4)
    assert m["findings"] == 1 and m["grpo_steps"] == 0 and m["wall_min"] >= 0
    assert "synthetic/base" not in m and "synthetic/delta" not in m
    # the header line with three decimals, as every other cell (issue 34, item 8)
    head = p.data.tags["mlflow.note.content"].split("\n\n")[0]
    assert head.startswith("**r1_zero**: synthetic greedy_accuracy 0.500 [0.400, 0.600];"), head
    assert not re.search(r"\d\.\d{4}", head), head
    # ... and the experiment opens on the runs table showing them.
    exp = client.get_experiment(p.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    view, _ = read_view(exp.tags["mlflow.sharedViewState.grpo-headline"])
    assert "tags.`synthetic greedy_accuracy final`" in view["selectedColumns"]
    # the column's text: the value with its CI, rounded to it
    assert p.data.tags["synthetic greedy_accuracy final"] == "0.50 [0.40, 0.60]"
    links = results["r1_zero"]["links"]
    assert links["runs_table"].endswith(f"/#/experiments/{exp.experiment_id}/runs?workflowType="
                                        "machine_learning&viewStateShareKey=grpo-headline")
    assert links["run"].endswith(f"{p.info.run_id}?workflowType=machine_learning")
    assert "/#/models/recipes-r1_zero/versions/1?" in links["model_version"]
    rows = T.compare_table(workspace.tracking_uri(cfg, wd), "recipes")
    assert [(r["recipe"], r["benchmark"]) for r in rows] == [("r1_zero", "synthetic"),
                                                             ("sft_grpo", "synthetic")]
    assert rows[1]["final"] == 0.6 and rows[1]["base"] == 0.2
    assert rows[1]["final_lo"] == pytest.approx(0.5) and rows[1]["delta"] == pytest.approx(0.4)
    assert list(rows[0]) == COMPARE_COLUMNS
    assert T.compare_table(workspace.tracking_uri(cfg, wd), "nope") == []

    chart = wd / "chart.png"
    chart.write_bytes(PNG_MAGIC)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COMPARE_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    csv_text = buf.getvalue()
    parents = [results[r]["parent_run"] for r in results]
    run = T.log_comparison(cfg, wd, "| table |", csv_text, chart, parents)
    assert T.log_comparison(cfg, wd, "| table |", csv_text, chart, parents) == run
    # The table is on the run's page too: metrics per recipe x benchmark, readable params,
    # and the markdown as the run's description.
    shown = client.get_run(run).data
    assert shown.metrics["sft_grpo/synthetic/final"] == pytest.approx(0.6)
    assert shown.metrics["sft_grpo/synthetic/base"] == pytest.approx(0.2)
    assert shown.metrics["sft_grpo/synthetic/delta"] == pytest.approx(0.4)
    assert shown.metrics["sft_grpo/synthetic/final_lo"] == pytest.approx(0.5)
    assert shown.params["sft_grpo/synthetic"].startswith("base 0.200")
    assert shown.tags["mlflow.note.content"] == "| table |"
    files = set(_all_artifact_files(client, run))
    assert {"comparison/comparison.md", "comparison/comparison.csv", "comparison/chart.png",
            "comparison/comparison_table.json"} <= files
    table = json.loads(Path(client.download_artifacts(run, "comparison/comparison_table.json",
                                                      str(wd / "dl"))).read_text())
    assert len(table["data"]) == 2


def test_fail_pipeline(store):
    cfg, wd = store
    parent = _parent(cfg, wd)
    c = T.get_client()
    running = T.child_run(parent, "grpo/round-1")
    T.fail_pipeline(parent, "RuntimeError: boom", wd)
    assert c.get_run(parent).info.status == "FAILED"
    assert c.get_run(running).info.status == "FAILED"
    assert c.get_run(parent).data.tags["grpo.error"] == "RuntimeError: boom"
    assert _parent(cfg, wd) == parent  # the next run of the config resumes it


# ------------------------------------------------------------------ trainer callbacks

def _tiny_trainer(out: Path, report_to, callbacks=()):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    ids = torch.randint(0, 32, (8, 12))
    data = [{"input_ids": x, "labels": x, "attention_mask": torch.ones_like(x)} for x in ids]
    args = TrainingArguments(output_dir=str(out), max_steps=4, logging_steps=1,
                             per_device_train_batch_size=2, report_to=report_to, use_cpu=True,
                             save_strategy="no", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=data, callbacks=list(callbacks))


def test_step_logger(store):
    """Our StepLogger callback streams the trainer's logs into a child run, with no fluent
    MLflow run left behind."""
    cfg, wd = store
    parent = _parent(cfg, wd)
    c = T.get_client()

    ours = T.child_run(parent, "sft")
    _tiny_trainer(wd / "t1", [], [StepLogger(ours)]).train()
    steps = sorted(m.step for m in c.get_metric_history(ours, "loss"))
    assert steps == [1, 2, 3, 4]  # flushed at train end although the interval is 60 s
    # the trainer's one-value summary: tags of the run (4 digits), not one-dot charts
    run = c.get_run(ours)
    assert not RUN_SUMMARY & set(run.data.metrics), sorted(run.data.metrics)
    assert float(run.data.tags["trainer.train_loss"]) > 0 and "trainer.train_runtime" in run.data.tags
    # a GRPO round's three telling curves also under the prefix MLflow's run page sorts first
    from types import SimpleNamespace

    grpo = T.child_run(parent, "grpo/round-1")
    logger = StepLogger(grpo)
    state = SimpleNamespace(is_world_process_zero=True, global_step=1)
    logger.on_log(SimpleNamespace(num_iterations=1, num_generations=8), state, None,
                  logs={"reward": 0.5, "rewards/accuracy/mean": 0.25, "completions/mean_length": 20.0,
                        "loss": 2e-8})
    logger.close()
    got = c.get_run(grpo).data.metrics
    assert got["At a glance/reward"] == got["reward"] == 0.5
    assert got["At a glance/accuracy"] == 0.25 and got["At a glance/mean_length"] == 20.0
    # GRPO's ~1e-8 loss also on a scale the chart axis labels; the SFT trainer's is not scaled
    assert got["loss_x1e6"] == pytest.approx(0.02) and "loss_x1e6" not in run.data.metrics
    import mlflow

    assert mlflow.active_run() is None
    # The trainer's run did not land in another experiment or in ./mlruns.
    assert not (wd.parent / "cwd" / "mlruns").exists()
    assert ours in {r.info.run_id for r in c.search_runs([c.get_run(parent).info.experiment_id])}


def test_reward_scorer_errors_reach_the_round_run(store, monkeypatch):
    """A planted exception in the accuracy reward's scorer during training shows up as
    scorer_errors/accuracy = 1 on the round's run (and the reward is None, not 0.0)."""
    from transformers import TrainerCallback

    from grpo_core.verify import answers, rewards

    cfg, wd = store
    run = T.child_run(_parent(cfg, wd), "grpo/round-1")
    real = answers._verify_uncached

    def planted(gold, pred, seconds):
        if pred == "13":
            raise RuntimeError("planted scorer bug")
        return real(gold, pred, seconds)

    class OneBadReward(TrainerCallback):  # what TRL's reward call does, once, mid-training
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                answers.clear_caches()  # an earlier test may have cached the ("12", "13") verdict
                monkeypatch.setattr(answers, "_verify_uncached", planted)
                got = rewards.accuracy(["<answer>13</answer>", "<answer>12</answer>"],
                                       answer=["12", "12"])
                monkeypatch.setattr(answers, "_verify_uncached", real)
                assert got == [None, 1.0]

    logger = StepLogger(run)
    _tiny_trainer(wd / "t3", [], [OneBadReward(), logger]).train()
    history = T.get_client().get_metric_history(run, "scorer_errors/accuracy")
    # 1 error from step 2 on; before it 0 (or no point, when no reward error happened yet
    # in this process): counted from the logger's start, not the process's.
    by_step = {m.step: m.value for m in history}
    assert by_step[2] == by_step[3] == by_step[4] == 1.0 and by_step.get(1, 0.0) == 0.0


# ------------------------------------------------------------------ over HTTP

@pytest.mark.integration
def test_over_http_against_mlflow_server(tmp_path, template_db, monkeypatch):
    db = tmp_path / "server.db"
    shutil.copy(template_db, db)
    server = MlflowServer(tmp_path, db).start()
    uri = server.uri
    try:
        server.wait_healthy()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.chdir(tmp_path)
        cfg = PipelineConfig()
        cfg.project.workdir = str(tmp_path / "wd")
        cfg.project.name = "http"
        assert workspace.tracking_uri(cfg, tmp_path / "wd") == uri
        check_reachable(uri)
        parent = T.start_parent_run(cfg, cfg.hash(), "r1_zero", "abc", "flow", tmp_path / "wd")
        assert T.start_parent_run(cfg, cfg.hash(), "r1_zero", "abc", "flow2", tmp_path / "wd") == parent
        child = T.child_run(parent, "grpo/round-1")
        assert T.child_run(parent, "grpo/round-1") == child
        T.log_metrics(child, {"pass@1": 0.5}, step=1)
        for step, reward in ((1, 0.1), (2, 0.2)):
            T.log_metrics(child, {"reward": reward}, step=step)
        T.log_training_curves(child, [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}])
        c = T.get_client()
        assert c.get_run(child).data.metrics["pass_at_1"] == 0.5
        assert [m.step for m in c.get_metric_history(child, "reward")] == [1, 2]
        png = next((tmp_path / "server-artifacts").rglob("grpo_curves.png"))
        assert png.read_bytes()[:8] == PNG_MAGIC
        name = "http-r1_zero"
        v = T.register_model(parent, _fake_model(tmp_path / "m", "http"), name)
        d = T.promote(c, name, v, "greedy_accuracy", 0.5, 0.4, ci_hi=0.6)
        assert d.promoted and str(c.get_model_version_by_alias(name, "champion").version) == v
        folder = T.download_champion(name, tmp_path / "champ")
        assert json.loads((folder / "config.json").read_text())["tag"] == "http"
        assert not (tmp_path / "mlruns").exists()
    finally:
        server.stop()
