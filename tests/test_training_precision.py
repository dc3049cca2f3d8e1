"""Training precision: a bf16-stored checkpoint (every Qwen2.5 is one) trains with fp32
master weights and is saved in bf16 again.

transformers 5 loads a checkpoint in its stored dtype; in bf16 an Adam step of ~lr (1e-6
for GRPO, 1e-5 for SFT) on a weight of ~0.02 rounds away (bf16's spacing there is ~1e-4),
so the policy would barely move. The check is on the weights the trainer holds at the end
of training (captured by a callback): float32, and moved nearly everywhere. The saved
model is those weights cast to the stored dtype. One step of 1e-6 is below bf16's
resolution for most weights, so the *saved* file changes only where the rounding flips;
steps accumulate in the fp32 master weights until it does.
"""
import json
from pathlib import Path

import pytest
import torch

from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.verify import rewards


def build_bf16_qwen2(out_dir, seed: int = 0):
    """builtin:proxy-qwen2 (grpo_core/modeling/proxy.py): a randomly initialised 2-layer,
    64-wide Qwen2ForCausalLM with a byte-level BPE tokenizer and a ChatML template, stored
    in bfloat16."""
    from grpo_core.modeling.proxy import ProxyRecipe, build_proxy_qwen2

    return str(build_proxy_qwen2(out_dir, ProxyRecipe(seed=seed)))


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    torch.set_num_threads(1)
    return build_bf16_qwen2(tmp_path_factory.mktemp("qwen2-bf16") / "model")


def weights(path) -> dict:
    from safetensors.torch import load_file

    return load_file(f"{path}/model.safetensors")


def stored_dtype_name(path) -> str:
    tree = json.loads(Path(f"{path}/config.json").read_text())
    return tree.get("dtype") or tree.get("torch_dtype")


def master_spy():
    """Keeps the trainer's parameters (and their dtypes) at the end of training."""
    from transformers import TrainerCallback

    class Spy(TrainerCallback):
        def __init__(self):
            self.params, self.dtypes = {}, set()

        def on_train_end(self, args, state, control, model=None, **kw):
            self.params = {n: p.detach().clone() for n, p in model.named_parameters()}
            self.dtypes = {p.dtype for p in model.parameters()}

    return Spy()


def check_trained(before: dict, spy, out_dir) -> None:
    assert stored_dtype_name(out_dir) == "bfloat16"  # saved as stored
    saved = weights(out_dir)
    assert set(saved) == set(before)
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    # the master weights: float32 and moved almost everywhere by one small step
    assert spy.dtypes == {torch.float32}, spy.dtypes
    moved = total = 0
    for name, p in spy.params.items():
        if p.ndim == 2 and ".layers." in name:  # the projection matrices
            moved += int((p.float() != before[name].float()).sum())
            total += p.numel()
    assert moved / total > 0.5, f"only {moved} of {total} projection weights moved"
    # the saved model is the master weights in bf16, and differs from the input
    for name, t in saved.items():
        assert torch.equal(t, spy.params[name].to(torch.bfloat16)), name
    assert any(not torch.equal(saved[k], before[k]) for k in before)


def test_grpo_step_at_lr_1e6_trains_fp32_master_and_saves_bf16(bf16_model, tmp_path, monkeypatch):
    def chars(completions, **kw):  # varies within every group: a non-zero advantage
        return [len(rewards.completion_text(c)) / 50 for c in completions]

    monkeypatch.setitem(rewards.REWARDS, "chars", chars)
    from grpo_core.train.grpo import run_grpo_round

    cfg = config_from_dict({
        "grpo": {"max_steps": 1, "per_device_train_batch_size": 8, "num_generations": 4, "learning_rate": 1e-6,
                 "max_completion_length": 8, "save_steps": 10},
        "rewards": {"funcs": ["chars"]}})
    spy = master_spy()
    before = weights(bf16_model)
    result = run_grpo_round(bf16_model, generate_problems("train", 2, levels=[1]), cfg,
                            tmp_path / "grpo", "chat", extra_callbacks=[spy])
    assert result.steps == 1
    check_trained(before, spy, result.output_dir)


def test_sft_step_at_lr_1e5_trains_fp32_master_and_saves_bf16(bf16_model, tmp_path):
    from grpo_core.train.sft import run_sft

    cfg = config_from_dict({"sft": {"max_steps": 1, "per_device_train_batch_size": 2,
                                    "learning_rate": 1e-5, "warmup_steps": 0}})  # step 1 at the full lr
    spy = master_spy()
    before = weights(bf16_model)
    result = run_sft(bf16_model, generate_problems("train", 4), cfg, tmp_path / "sft", "chat",
                     extra_callbacks=[spy])
    assert result.steps == 1
    check_trained(before, spy, result.output_dir)


@pytest.mark.parametrize(("precision", "flags"), [
    ("fp32", (False, False)), ("bf16", (True, False)), ("fp16", (False, True)),
])
def test_precision_sets_trl_autocast_flags(precision, flags):
    from grpo_core.train.trl_args import precision_flags

    got = precision_flags(config_from_dict({"train": {"precision": precision}}))
    assert (got["bf16"], got["fp16"]) == flags


def test_auto_precision_is_fp32_on_cpu_and_mixed_on_gpu():
    from grpo_core.train.trl_args import precision_flags

    got = precision_flags(config_from_dict({}))
    if torch.cuda.is_available():
        assert got["bf16"] == torch.cuda.is_bf16_supported() and got["fp16"] != got["bf16"]
    else:
        assert (got["bf16"], got["fp16"], got["use_cpu"]) == (False, False, True)
