"""`grpo run CONFIG --smoke` (flows/smoke.py): a config's whole DAG with its structure
intact on a small bf16 Qwen2 proxy, on a CPU in minutes, and its report."""
import json
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_runs import GRPO, ROOT, run_env

from grpo_core.config import load_config
from grpo_core.data.stage_split import prompts_per_update
from grpo_core.modeling.memory_plan import gradient_checkpointing

SHIPPED = sorted(str(p.relative_to(ROOT)) for p in [
    *ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/recipes/*.yaml"),
    *ROOT.glob("configs/models/*.yaml")])
PRESET = "configs/models/qwen2.5-0.5b-instruct.yaml"
BENCHMARKS = {"gsm8k", "math500", "aime24", "aime25", "amc23"}


@pytest.mark.parametrize("path", SHIPPED)
def test_overrides_keep_the_structure(path, tmp_path):
    from flows.smoke import PROXY, smoke_overrides

    real = load_config(ROOT / path, [f"project.workdir={tmp_path}"])
    cfg = smoke_overrides(real)
    assert cfg.project.workdir == str(tmp_path / "smoke")
    assert cfg.tracking.tracking_uri == f"sqlite:///{(tmp_path / 'smoke').resolve()}/mlflow.db"
    assert cfg.model.name_or_path == PROXY
    # what the DAG is made of: unchanged
    for section, fields in {"model": ["template"], "sft_stage": ["enabled"], "sft": ["learning_rate"],
                            "rounds": ["count", "kl_schedule"], "algorithm": ["name"],
                            "grpo": ["gradient_accumulation_steps", "beta",
                                     "loss_type", "learning_rate", "scale_rewards"],
                            "rewards": ["funcs", "weights"],
                            "filter": ["enabled", "band", "refilter_each_round"],
                            "eval": ["benchmarks"], "train": ["precision"],
                            "data": ["decontaminate", "decontam_ngram"]}.items():
        for f in fields:
            assert getattr(getattr(cfg, section), f) == getattr(getattr(real, section), f), f
    assert [s.source for s in cfg.data.train] == [s.source for s in real.data.train]
    assert cfg.grpo.activation_checkpointing == gradient_checkpointing(real, real.grpo.activation_checkpointing)
    # what makes it small and CPU-only
    assert cfg.grpo.max_steps == 2 and cfg.eval.limit == 4 and cfg.rollout.backend == "hf"
    assert not cfg.grpo.use_vllm and cfg.train.num_processes == 1
    assert cfg.train.accelerate_config is None
    assert cfg.grpo.max_completion_length <= 16 and cfg.eval.max_new_tokens <= 16
    assert not cfg.diagnosis.stop_on_collapsed_start  # 16 tokens solve nothing: no stop
    if cfg.sft_stage.enabled:
        assert cfg.sft.max_steps == 2
    # one optimizer step can be filled from the pool
    pool = sum(s.limit for s in cfg.data.train)
    assert prompts_per_update(cfg) <= pool


def test_smoke_refuses_bad_use_before_any_work(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {ROOT / PRESET}\ngrpo:\n  num_generations: 1\n")
    ws = tmp_path / "ws"
    for args, field in [([str(bad), "--smoke"], "grpo.num_generations"),
                        (["--smoke"], "--smoke"),
                        ([PRESET, "--model", "x"], "--model")]:
        res = subprocess.run([GRPO, "run", *args], env=run_env(ws), cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 2, res.stderr
        assert field in res.stderr
    assert not ws.exists()


def _smoke(config: str, workdir: Path, data: Path) -> tuple[dict, float, str]:
    t0 = time.time()
    res = subprocess.run([GRPO, "run", config, "--smoke", "--quiet"],
                         env=run_env(workdir, GRPO_DATA_DIR=str(data)), cwd=ROOT,
                         capture_output=True, text=True, timeout=900, check=False)
    seconds = time.time() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((workdir / "reports" / "smoke.json").read_text()), seconds, res.stdout


def _check_report(report: dict, real) -> None:
    stages = [s["stage"] for s in report["stages"]]
    assert stages[0] == "data" and stages[-1] == "eval/final"
    expected = (["sft"] if real.sft_stage.enabled else []) + [
        f"grpo/round-{r}" for r in range(1, real.rounds.count + 1)]
    assert list(report["training"]) == expected
    for name, t in report["training"].items():
        assert t["steps"] == 2, name
        assert t["master_dtype"] == "float32", name
        # fp32 master weights move at the config's lr (GRPO 1e-6 in the presets): the
        # warm-started proxy's groups disagree, so GRPO's advantage is not all zero
        assert t["param_change_norm"] > 0, name
        assert t["rss_peak_gb"] > 0, name  # CPU: peak RSS; a GPU adds gpu_peak_gb
        if name.startswith("grpo"):  # issue 23 item 5: how fast, where the time went
            assert 0 < t["throughput"]["gen_share"] < 1, name
            assert t["throughput"]["gen_tokens_per_s"] > 0, name
            assert t["throughput"]["train_tokens_per_s"] > 0, name
    assert report["master_dtype"] == "float32"
    final = report["eval"]["eval/final"]
    assert set(final) == set(real.eval.benchmarks)
    for bench, v in final.items():
        assert v["problems"] == 4, bench
        assert v["split"] in ("test", "eval"), bench
    plan = report["memory_plan"]
    assert plan["model"] == real.model.name_or_path


@pytest.mark.integration
def test_smoke_of_the_qwen_preset(shared_data, tmp_path):
    workdir = tmp_path / "ws"
    report, seconds, stdout = _smoke(PRESET, workdir, shared_data)
    print(f"smoke of {PRESET}: {seconds:.0f} s")  # measured, not asserted: it depends on the machine
    real = load_config(ROOT / PRESET)
    _check_report(report, real)
    assert {s["stage"] for s in report["stages"]} >= {"data", "eval/base", "sft", "eval/sft",
                                                       "filter/round-1", "filter/round-2",
                                                       "eval/round-2"}
    assert set(report["decontamination"]) == BENCHMARKS  # every eval set, counted
    for bench, c in report["decontamination"].items():
        assert c["problems"] > 0 and "flagged" in c, bench
    assert report["decontamination"]["gsm8k"]["problems"] == 1319
    assert {v["split"] for v in report["eval"]["eval/final"].values()} == {"test"}
    # SFT at lr 1e-5 on fp32 master weights moves the bf16-saved weights
    assert report["training"]["sft"]["param_change_norm"] > 0
    plan = report["memory_plan"]
    assert plan["params"] == 494_032_768 and plan["fits"] in (True, False)
    assert set(plan["bytes"]) >= {"policy_weights", "gradients", "optimizer_adam",
                                  "reference_model", "activations_ckpt",
                                  "activations_no_ckpt", "kv_cache"}
    assert "memory plan for Qwen/Qwen2.5-0.5B-Instruct" in stdout
    # its own workspace: nothing of the user's store or MLflow
    assert (workdir / "smoke" / "store.duckdb").is_file()
    assert not (workdir / "store.duckdb").exists() and not (workdir / "mlflow.db").exists()


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("config", [c for c in SHIPPED if c != PRESET])
def test_smoke_of_every_shipped_config(config, shared_data, tmp_path):
    report, seconds, _ = _smoke(config, tmp_path / "ws", shared_data)
    print(f"smoke of {config}: {seconds:.0f} s")
    _check_report(report, load_config(ROOT / config))


def test_large_gradient_accumulation_still_fills_a_step(tmp_path):
    from flows.smoke import smoke_overrides

    real = load_config(ROOT / PRESET, [f"project.workdir={tmp_path}",
                                       "grpo.gradient_accumulation_steps=40"])
    cfg = smoke_overrides(real)
    assert cfg.grpo.gradient_accumulation_steps == 40
    # the preset's pass holds one prompt's group (8 of G 8): the smoke's holds one of G 2
    assert cfg.grpo.per_device_train_batch_size == 2 and cfg.grpo.num_generations == 2
    assert prompts_per_update(cfg) == 40 <= min(s.limit for s in cfg.data.train)
    assert smoke_overrides(real, model="/some/model").model.name_or_path == "/some/model"
