"""RL-readiness (grpo_core/train/readiness.py) on the real built-in model: sampling, scoring
and the teacher-forced entropy, and the findings a near one-hot policy fires."""
from __future__ import annotations

import math
import os

import pytest

from grpo_core.config import PipelineConfig
from grpo_core.data.synthetic import generate_problems
from grpo_core.findings import ACTIONS
from grpo_core.train.readiness import (
    Readiness,
    completion_entropy,
    measure_readiness,
    readiness_findings,
)

os.environ.setdefault("GRPO_TORCH_THREADS", "1")

G = 4
SHARPEN = 50.0


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.project.workdir = str(tmp_path_factory.mktemp("readiness-wd"))
    cfg.grpo.num_generations = G
    cfg.rollout.backend = "hf"
    return cfg


@pytest.fixture(scope="module")
def problems():
    return generate_problems("eval", 8, seed=0)  # eval split: never in the model's corpus


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from grpo_core.modeling.loading import resolve_model_path

    return resolve_model_path("builtin:tiny-arith", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def sharpened_path(model_path, tmp_path_factory) -> str:
    """The built-in model with every logit multiplied by SHARPEN: near one-hot next tokens.
    Its lm_head is tied to the input embeddings (scaling it would change the inputs too),
    so the final RMSNorm's weight is scaled instead: logits = lm_head(w * x / rms(x)) are
    then exactly SHARPEN times the original ones."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("sharpened")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(SHARPEN)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def base(model_path, problems, cfg) -> Readiness:
    return measure_readiness(model_path, problems, cfg)


@pytest.fixture(scope="module")
def sharpened(sharpened_path, problems, cfg) -> Readiness:
    return measure_readiness(sharpened_path, problems, cfg)


def test_metrics_in_range_on_the_builtin_model(base):
    print(base.line())
    assert (base.problems, base.samples, base.temperature) == (8, G, 1.0)
    assert math.isfinite(base.entropy) and base.entropy > 0
    for v in (base.zero_variance_share, base.pass_at_1, base.pass_at_k):
        assert 0.0 <= v <= 1.0
    assert base.pass_at_k >= base.pass_at_1
    # a pass@1 that is a multiple of 1/(problems x G); no problem solved: every group is zero-variance
    assert (base.pass_at_1 * 8 * G) == pytest.approx(round(base.pass_at_1 * 8 * G))
    if base.pass_at_k == 0:
        assert base.zero_variance_share == 1.0
    m = base.metrics()
    assert set(m) == {"readiness/entropy", "readiness/zero_variance_share",
                      "readiness/pass_at_1", "readiness/pass_at_k"}
    assert m["readiness/entropy"] == base.entropy and m["readiness/pass_at_k"] == base.pass_at_k
    line = base.line()
    assert "at T 1.0" in line and f"at G {G}" in line and f"pass@{G} " in line
    assert "(8 unseen problems)" in line


def test_batched_entropy_matches_one_row_at_a_time(model_path):
    """Left padding, logits_to_keep and the budget's batching change nothing; and the
    entropy of softmax(logits / T) rises with T."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.prompts import render_prompt

    tok = load_tokenizer(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    prompts = [render_prompt(p.problem, "r1_zero") for p in generate_problems("eval", 3, seed=1)]
    comps = [" 3 + 4 = 7 </think> <answer>7</answer>", " so", " 12 is the sum"]

    def reference(t):
        total, count = 0.0, 0
        for p, c in zip(prompts, comps):
            k = len(tok(p, add_special_tokens=False)["input_ids"])
            ids = tok(p + c, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, k - 1 : len(ids) - 1]
            logp = torch.log_softmax(logits / t, -1)
            total += float(-(logp.exp() * logp).sum())
            count += len(ids) - k
        return total, count

    ref_total, ref_count = reference(1.0)
    assert ref_count > 3
    for budget in (1, 10**9):  # one row per batch; all rows in one padded batch
        total, count = completion_entropy(model, tok, prompts, comps, 1.0, budget=budget)
        assert count == ref_count
        assert total == pytest.approx(ref_total, rel=1e-4)
    cold = completion_entropy(model, tok, prompts, comps, 0.5)[0]
    hot = completion_entropy(model, tok, prompts, comps, 2.0)[0]
    assert cold < ref_total < hot


def test_sharpened_policy_fires_entropy_collapsed(base, sharpened, cfg):
    print("base:", base.line())
    print("sharpened:", sharpened.line())
    assert sharpened.entropy < 0.18 and sharpened.entropy < base.entropy / 10
    codes = [f.code for f in readiness_findings(sharpened, cfg)]
    assert "sft_entropy_collapsed" in codes
    base_codes = [f.code for f in readiness_findings(base, cfg)]
    assert ("sft_entropy_collapsed" in base_codes) == (base.entropy < 0.18)
    # zero variance fires exactly above the bound, on either model
    for r, found in ((base, base_codes), (sharpened, codes)):
        assert ("sft_zero_variance" in found) == (r.zero_variance_share > 0.8)


def test_finding_lines_name_the_numbers_and_the_action(cfg):
    r = Readiness(problems=64, samples=8, temperature=1.0, entropy=0.05,
                  zero_variance_share=0.9, pass_at_1=0.34, pass_at_k=0.71)
    found = {f.code: f for f in readiness_findings(r, cfg)}
    assert set(found) == {"sft_entropy_collapsed", "sft_zero_variance"}
    for code, f in found.items():
        assert f.severity == "warn" and f.steps == []
        assert ACTIONS[code] in f.line()
    assert "0.050 nats/token" in found["sft_entropy_collapsed"].line()
    assert "90% of 64 groups of G 8" in found["sft_zero_variance"].line()
    assert "sft.max_steps" in found["sft_entropy_collapsed"].line()
    assert "filter.band" in found["sft_zero_variance"].line()
    fine = Readiness(64, 8, 1.0, 0.5, 0.4, 0.34, 0.71)
    assert readiness_findings(fine, cfg) == []
    assert readiness_findings(fine, cfg, min_entropy=0.6, max_zero_variance=0.3) != []
    assert readiness_findings(Readiness(64, 8, 1.0, math.nan, 0.4, 0.3, 0.7), cfg) == []
