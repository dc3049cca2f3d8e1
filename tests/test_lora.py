"""LoRA (model.peft, grpo_core/train/lora.py) on builtin:proxy-qwen2, a bf16 Qwen2 with the
real architecture: a GRPO round and an SFT run train the adapters alone (the base weights
stay bit-identical, the reference is the base with adapters disabled, no second copy), the
model handed on is merged in the stored dtype with its adapter beside it, a round killed
with SIGKILL resumes from its adapter checkpoint, and the registered merged model loads
with mlflow.transformers.load_model and generates."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_registry_flavour
import torch

from grpo_core.config import ConfigError, config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train import lora

pytest_plugins = ["fixtures_models"]
store = test_registry_flavour.store  # the registry tests' MLflow store fixture
ROOT = Path(__file__).resolve().parents[1]
LORA = {"enabled": True, "r": 4, "alpha": 8}


def _tree(**grpo) -> dict:
    base = {"max_steps": 2, "save_steps": 1, "max_completion_length": 32, "per_device_train_batch_size": 8,
            "num_generations": 4, "learning_rate": 1e-2}
    return {"model": {"peft": LORA}, "grpo": {**base, **grpo},
            "rewards": {"funcs": ["accuracy", "format"]}}


def _cfg(**grpo):
    return config_from_dict(_tree(**grpo))


def _input_weights(path: str) -> dict:
    """The input checkpoint as training loads it (float32 master weights)."""
    from grpo_core.modeling.loading import load_for_training

    return load_for_training(path)[0].state_dict()


def _saved(folder) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def _split(peft_model) -> tuple[dict, dict]:
    """(base weights under the plain model's names, adapter weights) of a PeftModel."""
    base, adapters = {}, {}
    for k, v in peft_model.get_base_model().state_dict().items():
        if ".lora_" in k:
            adapters[k] = v.detach().clone()
        else:
            base[k.replace(".base_layer.", ".")] = v.detach().clone()
    return base, adapters


def test_config_off_by_default_and_validated():
    cfg = config_from_dict({})
    assert cfg.model.peft.enabled is False
    assert lora.peft_config(cfg) is None and lora.trainer_kwargs(cfg) == {}
    on = config_from_dict({"model": {"peft": {"enabled": True, "r": 8,
                                              "target_modules": ["q_proj", "v_proj"]}}})
    pc = lora.peft_config(on)
    assert (pc.r, pc.lora_alpha, pc.lora_dropout) == (8, 32, 0.0)
    assert set(pc.target_modules) == {"q_proj", "v_proj"}
    assert lora.trainer_kwargs(on)["peft_config"] is not None
    for bad, field in (("model.peft.r=0", "model.peft.r"), ("model.peft.alpha=0", "model.peft.alpha"),
                       ("model.peft.dropout=1.5", "model.peft.dropout"),
                       ("model.peft.rank=8", "model.peft.rank")):
        with pytest.raises(ConfigError) as err:
            config_from_dict({}, [bad])
        assert err.value.field == field, bad
    ppo = config_from_dict({"model": {"peft": LORA}, "algorithm": {"name": "ppo"}})
    with pytest.raises(ConfigError) as err:
        lora.peft_config(ppo)
    assert err.value.field == "model.peft.enabled"


@pytest.fixture(scope="module")
def lora_round(proxy_model_path, tmp_path_factory):
    """One GRPO round with LoRA on the proxy: (result, trainer, adapters before training)."""
    from grpo_core.train.grpo import run_grpo_round

    seen: dict = {}

    def hook(trainer):
        seen["trainer"] = trainer
        seen["adapters0"] = _split(trainer.model)[1]

    out = tmp_path_factory.mktemp("lora-round")
    result = run_grpo_round(proxy_model_path, generate_problems("train", 8, levels=[1]),
                            _cfg(), out, "chat", trainer_hook=hook)
    return result, seen["trainer"], seen["adapters0"]


def test_grpo_round_trains_only_the_adapters(lora_round, proxy_model_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result, trainer, adapters0 = lora_round
    assert result.steps == 2 and not result.stopped_early
    # The reference is the base with adapters disabled: TRL keeps no second model.
    assert trainer.ref_model is None and trainer.beta == 0.04
    assert all("kl" in h for h in result.history)
    model = trainer.model
    assert lora.is_lora(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)

    # Base weights bit-identical to the input; every adapter matrix B moved off its zeros.
    base, adapters = _split(model)
    want = _input_weights(proxy_model_path)
    assert set(base) == set(want)
    assert all(torch.equal(base[k], want[k]) for k in want)
    moved = [k for k in adapters if not torch.equal(adapters[k], adapters0[k])]
    assert any(".lora_B." in k for k in moved) and len(moved) > len(adapters) // 2

    # Handed on: a plain transformers folder, merged, in the stored dtype (bf16) ...
    final = Path(result.output_dir)
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    merged = _saved(final)
    assert {v.dtype for v in merged.values()} == {torch.bfloat16}
    stored = _saved(proxy_model_path)
    assert set(merged) == set(stored)
    changed = [k for k in merged if not torch.equal(merged[k], stored[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # the LoRA targets
    # ... equal to peft's own merge of the adapter saved beside it.
    assert (final / lora.ADAPTER_DIR / "adapter_config.json").is_file()
    base_model = AutoModelForCausalLM.from_pretrained(proxy_model_path, dtype=torch.float32)
    peft_merged = PeftModel.from_pretrained(base_model, str(final / lora.ADAPTER_DIR)).merge_and_unload()
    for k, v in peft_merged.state_dict().items():
        if k in merged:
            assert torch.equal(v.to(torch.bfloat16), merged[k]), k
    # The same merge from the PeftModel's state dict (what the Trainer gathers under ZeRO-3)
    aside = lora.merged_state_dict(model)
    gathered = lora.merged_state_dict(model, model.state_dict())
    assert aside.keys() == gathered.keys() and all(torch.equal(aside[k], gathered[k]) for k in aside)
    reloaded = AutoModelForCausalLM.from_pretrained(str(final), dtype="auto")
    assert reloaded.dtype == torch.bfloat16


def test_sft_with_lora_trains_the_adapters(proxy_model_path, tmp_path):
    from transformers import TrainerCallback

    from grpo_core.train.sft import run_sft

    grab = []

    class Keep(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            grab.append((model, _split(model)[1]))

    cfg = config_from_dict({"model": {"peft": LORA},
                            "sft": {"max_steps": 2, "per_device_train_batch_size": 2, "learning_rate": 1e-2}})
    result = run_sft(proxy_model_path, generate_problems("train", 8), cfg, tmp_path / "sft",
                     "chat", extra_callbacks=[Keep()])
    assert result.steps == 2
    model, adapters0 = grab[0]
    base, adapters = _split(model)
    want = _input_weights(proxy_model_path)
    assert all(torch.equal(base[k], want[k]) for k in want)
    assert any(not torch.equal(adapters[k], adapters0[k]) for k in adapters if ".lora_B." in k)
    final = Path(result.output_dir)
    assert (final / lora.ADAPTER_DIR / "adapter_model.safetensors").is_file()
    merged, stored = _saved(final), _saved(proxy_model_path)
    assert {v.dtype for v in merged.values()} == {torch.bfloat16}
    assert any(not torch.equal(merged[k], stored[k]) for k in stored)


_CHILD = """
import json, torch
torch.set_num_threads(1)
from grpo_core.config import config_from_dict
from grpo_core.data.synthetic import generate_problems
from grpo_core.train.grpo import run_grpo_round
run_grpo_round({model!r}, generate_problems("train", 8, levels=[1]),
               config_from_dict(json.loads({tree!r})), {out!r}, "chat")
"""


def test_round_killed_with_sigkill_resumes_from_the_adapter_checkpoint(proxy_model_path, tmp_path):
    from grpo_core.train.grpo import last_checkpoint, run_grpo_round

    out, steps = tmp_path / "round", 6
    code = _CHILD.format(model=proxy_model_path, tree=json.dumps(_tree(max_steps=steps)),
                         out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 600
    try:
        while not (out / "checkpoint-2" / "trainer_state.json").is_file():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "final").exists(), "the kill came after the round"
    ckpt = Path(last_checkpoint(out))
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    done = int(ckpt.name.split("-")[1])

    result = run_grpo_round(proxy_model_path, generate_problems("train", 8, levels=[1]),
                            _cfg(max_steps=steps), out, "chat", resume=True)
    assert result.steps == steps and min(h["step"] for h in result.history) == done + 1
    assert (Path(result.output_dir) / lora.ADAPTER_DIR / "adapter_config.json").is_file()
    assert _saved(result.output_dir).keys() == _saved(proxy_model_path).keys()


def test_registered_lora_model_is_the_merged_transformers_model(lora_round, store, tmp_path,
                                                                monkeypatch):
    import mlflow

    from tasks import tracking as T
    from tasks.tracking.mlflow_model import MODEL_FORMAT_TAG

    cfg, wd = store
    run = T.start_parent_run(cfg, cfg.hash(), cfg.project.recipe, "abc1234", "flow", wd)
    final = lora_round[0].output_dir
    name = "lora-flav"
    assert T.register_model(run, final, name) == "1"
    c = T.get_client()
    mv = c.get_model_version(name, "1")
    assert mv.tags[MODEL_FORMAT_TAG] == "mlflow-transformers"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", c.tracking_uri)  # models:/ reads the global URI
    pipe = mlflow.transformers.load_model(f"models:/{name}/1")
    assert pipe.model.dtype == torch.bfloat16 and not lora.is_lora(pipe.model)
    merged = _saved(final)
    assert all(torch.equal(v, merged[k]) for k, v in pipe.model.state_dict().items() if k in merged)
    ids = pipe("2+3=", max_new_tokens=4, min_new_tokens=4, do_sample=False,
               return_tensors=True)[0]["generated_token_ids"]
    assert len(ids) == len(pipe.tokenizer("2+3=")["input_ids"]) + 4
    # The adapter is kept with the logged model.
    got = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=f"{mv.source}/{lora.ADAPTER_DIR}", dst_path=str(tmp_path / "dl"),
        tracking_uri=c.tracking_uri))
    assert (got / "adapter_config.json").is_file() and (got / "adapter_model.safetensors").is_file()


def test_round_stopped_early_hands_on_its_last_good_checkpoint_merged(proxy_model_path,
                                                                       tmp_path, monkeypatch):
    """A diverged round keeps its last good checkpoint, which holds the adapter alone: the
    model handed on is that adapter merged, a plain folder like any round's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from grpo_core.train.grpo import run_grpo_round
    from grpo_core.verify import rewards

    calls = {"n": 0}
    real = rewards.REWARDS["format"]

    def turns_bad(completions, **kw):  # registered as "format"; NaN from the third step's scoring on
        calls["n"] += 1
        out = real(completions, **kw)
        return [float("nan")] * len(out) if calls["n"] >= 3 else out

    monkeypatch.setitem(rewards.REWARDS, "format", turns_bad)
    out = tmp_path / "diverge"
    result = run_grpo_round(proxy_model_path, generate_problems("train", 8, levels=[1]),
                            _cfg(max_steps=5), out, "chat")
    assert result.stopped_early and result.steps == 3
    final = Path(result.output_dir)
    assert final == out / "final" and (final / "tokenizer.json").is_file()
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    base = AutoModelForCausalLM.from_pretrained(proxy_model_path, dtype=torch.float32)
    good = PeftModel.from_pretrained(base, str(out / "checkpoint-2")).merge_and_unload()
    merged = _saved(final)
    assert all(torch.equal(v.to(torch.bfloat16), merged[k])
               for k, v in good.state_dict().items() if k in merged)


def test_in_round_eval_hands_on_the_best_step_merged(proxy_model_path, tmp_path, monkeypatch):
    """in_round_eval.every with LoRA: scores scripted 0.2, 0.6, 0.1 at steps 1-3, so the round's
    model is step 2's adapter merged (bf16), with that adapter in best/adapter; saving it
    mid-round leaves the base weights bit-identical."""
    from grpo_core.train import grpo as grpo_mod
    from grpo_core.train.in_round_eval import BEST_DIR

    scripted = iter([0.2, 0.6, 0.1])
    seen: dict[int, dict] = {}

    class ScriptedEvaluator(grpo_mod.InRoundEvaluator):
        def __call__(self, model, tokenizer):
            seen[len(seen) + 1] = lora.merged_state_dict(model)
            return next(scripted)

    monkeypatch.setattr(grpo_mod, "InRoundEvaluator", ScriptedEvaluator)
    grab = []
    cfg = config_from_dict({**_tree(max_steps=3, save_steps=10),
                            "in_round_eval": {"every": 1, "problems": 4}})
    out = tmp_path / "round"
    result = grpo_mod.run_grpo_round(proxy_model_path, generate_problems("train", 12, levels=[1]),
                                     cfg, out, "chat", trainer_hook=grab.append)
    assert result.steps == 3 and result.best_step == 2
    assert result.output_dir == str(out / BEST_DIR)
    best = Path(result.output_dir)
    assert (best / lora.ADAPTER_DIR / "adapter_config.json").is_file()
    merged = _saved(best)
    assert all(torch.equal(seen[2][k].to(torch.bfloat16), merged[k]) for k in merged)
    assert not all(torch.equal(seen[2][k], seen[3][k]) for k in seen[2])  # step 3 moved on
    base, _ = _split(grab[0].model)
    want = _input_weights(proxy_model_path)
    assert all(torch.equal(base[k], want[k]) for k in want)
