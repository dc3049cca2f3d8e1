"""Model fixtures: a tiny *random* Llama with the project's tokenizer, saved to disk.

Built in about a second, so the real HF rollout path (tokenise, left-pad, generate,
decode) runs in unit tests without the 2-minute built-in model. Its answers are noise:
tests that need known pass rates use a fake backend instead.

Also `shard_flows`: flows.shards with Prefect's home in a temporary folder; and
`main_job`: the README's main job (`grpo run`, both recipes compared) shrunk to about a
minute, run once per session for the tests that read what it leaves in MLflow and Prefect.

Use from a test module with `pytest_plugins = ["fixtures_models"]`.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("GRPO_TORCH_THREADS", "1")


def build_random_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """A 1-layer, 32-wide LlamaForCausalLM + BPE tokenizer (tags as ordinary tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_core.data.synthetic import arithmetic_facts, generate_problems
    from grpo_core.modeling.tiny import build_tokenizer

    torch.manual_seed(seed)
    texts = arithmetic_facts(seed, n_two_digit=50) + [
        p.problem + " " + p.solution for p in generate_problems("train", 100, seed=seed)]
    tok = build_tokenizer(texts, vocab_size=320)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    import torch

    torch.set_num_threads(1)
    return str(build_random_tiny_model(tmp_path_factory.mktemp("models") / "tiny-random"))


@pytest.fixture(scope="session")
def proxy_model_path(tmp_path_factory) -> str:
    """builtin:proxy-qwen2 (small warm-started Qwen2, bf16, multi-token tags, ChatML), built once
    through resolve_model_path into a session models cache."""
    import torch

    from grpo_core.modeling.loading import resolve_model_path

    torch.set_num_threads(1)
    return resolve_model_path("builtin:proxy-qwen2", tmp_path_factory.mktemp("proxy-models"))


@pytest.fixture(scope="module")
def shard_flows(tmp_path_factory):
    """flows.shards with Prefect's home in a temporary folder (set before prefect loads)."""
    from flows import configure_prefect

    configure_prefect(tmp_path_factory.mktemp("prefect-ws"))
    import flows.shards

    return flows.shards


# Both recipes on the built-in model in about a minute: 40 problems, 2 GRPO steps of 2
# prompts x 2, 2 SFT steps, 8 eval problems x 2 samples.
MAIN_JOB_SHRINK = [
    "filter.k=2", "filter.max_problems=8", "grpo.max_steps=2", "grpo.save_steps=1",
    "grpo.per_device_train_batch_size=4", "grpo.num_generations=2", "grpo.max_completion_length=8",
    "eval.limit=8", "eval.samples=2", "eval.primary_metric=avg@2", "eval.max_new_tokens=8",
    "eval.bootstrap=20", "sft.max_steps=2", "sft.per_device_train_batch_size=4",
    'data.train=[{source: "synthetic:arith", limit: 64, levels: [1]}]', "probe.problems=4"]


@pytest.fixture(scope="session")
def main_job(tmp_path_factory) -> tuple[Path, str]:
    """(workdir, stdout) of `grpo run --quiet --set ...` (MAIN_JOB_SHRINK) in a subprocess:
    Prefect's temporary server writing into <workdir>/prefect, MLflow on SQLite."""
    import subprocess

    from pipeline_runs import GRPO, ROOT, run_env

    workdir = tmp_path_factory.mktemp("main-job") / "ws"
    sets = [arg for s in MAIN_JOB_SHRINK for arg in ("--set", s)]
    run = subprocess.run([GRPO, "run", "--quiet", "--workdir", str(workdir), *sets],
                         env=run_env(workdir), cwd=ROOT, capture_output=True, text=True,
                         timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return workdir, run.stdout
