"""LoRA (model.peft): TRL trains adapters on a frozen base; the pipeline hands on a merged
model.

    peft_config(cfg)          -> peft.LoraConfig, or None when model.peft is off
    trainer_kwargs(cfg)       -> {"peft_config": ...} for GRPOTrainer / SFTTrainer, or {}
    save_merged(model, dir, dtype)  the merged weights as a plain transformers folder, in
                              the input checkpoint's stored dtype, and the adapter in dir/adapter

The reference model costs nothing: given a peft_config, TRL 1.16's GRPOTrainer keeps no
reference copy (trl/trainer/grpo_trainer.py:987-990, `elif is_peft_model(model):
self.ref_model = None`) and computes the reference log-probs with the adapters disabled
(grpo_trainer.py:2727, `use_adapter(model, adapter_name=None)`): the frozen base is the
reference, exactly the round's input model. Master weights: the base is loaded in float32
like any policy (load_for_training) and never changes; the adapters (float32, peft's
autocast_adapter_dtype) are all that the optimizer holds.

Checkpoints (Trainer's, for resume) hold the adapter only; resume_from_checkpoint loads it
back into the PeftModel. Every model handed on (a round's final/ and best/, SFT's final/)
is merged, so eval, the filter, the next round and the registry see a plain folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from grpo_core.config import ConfigError, PipelineConfig

ADAPTER_DIR = "adapter"  # inside a merged model's folder: the adapter it was merged from
UNSUPPORTED_ALGORITHMS = ("ppo", "grpo_vhead")  # their value models read the full policy


def peft_config(cfg: PipelineConfig):
    """TRL's peft_config for model.peft; None when LoRA is off."""
    p = cfg.model.peft
    if not p.enabled:
        return None
    if cfg.algorithm.name in UNSUPPORTED_ALGORITHMS:
        raise ConfigError("model.peft.enabled", f"LoRA is not supported with algorithm.name "
                          f"{cfg.algorithm.name} (use grpo or rloo)")
    from peft import LoraConfig

    return LoraConfig(r=p.r, lora_alpha=p.alpha, lora_dropout=p.dropout,
                      target_modules=p.target_modules, bias="none", task_type="CAUSAL_LM")


def trainer_kwargs(cfg: PipelineConfig) -> dict:
    """Keyword arguments for a TRL trainer's constructor: peft_config when LoRA is on."""
    config = peft_config(cfg)
    return {} if config is None else {"peft_config": config}


def is_lora(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def merged_state_dict(model, state_dict: dict | None = None) -> dict:
    """The base model's weights with every LoRA layer's update added (W + scale B A), under
    the plain model's names, computed aside: the PeftModel is left untouched (merging in
    place and back would not give the base weights back bit for bit). `state_dict`: the
    PeftModel's, when the Trainer gathered it (ZeRO-3, FSDP); else read from `model`."""
    import torch
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    base = model.get_base_model()
    state = ({k.removeprefix(prefix): v for k, v in state_dict.items()} if state_dict is not None
             else dict(base.state_dict()))
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            if not isinstance(module.base_layer, torch.nn.Linear):
                raise ValueError(f"cannot merge LoRA on {name} ({type(module.base_layer).__name__}): "
                                 "only linear layers are supported")
            key = f"{name}.base_layer.weight"
            for a in (a for a in module.active_adapters if a in module.lora_A):
                up, down = state[f"{name}.lora_B.{a}.weight"], state[f"{name}.lora_A.{a}.weight"]
                delta = (up.float() @ down.float()) * module.scaling[a]
                if module.fan_in_fan_out:
                    delta = delta.T
                state[key] = (state[key].float() + delta).to(state[key].dtype)
    out = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        if "modules_to_save" in key or "trainable_tokens" in key or "original_module" in key:
            raise ValueError(f"cannot merge {key}: only LoRA layers are supported")
        out[key.replace(".base_layer.", ".")] = tensor
    return out


def save_merged(model, output_dir: str | Path, dtype, state_dict: dict | None = None) -> None:
    """Save the PeftModel `model` merged, as a plain transformers folder with weights (and
    config.json's dtype) in `dtype`, and its adapter in output_dir/adapter."""
    out = Path(output_dir)
    cast: dict = {}  # by storage: tied weights stay one tensor
    state = {k: cast.setdefault((v.data_ptr(), v.shape), v.to(dtype)) if v.is_floating_point() else v
             for k, v in merged_state_dict(model, state_dict).items()}
    model.get_base_model().save_pretrained(out, state_dict=state)
    config = out / "config.json"
    tree = json.loads(config.read_text())  # save_pretrained wrote the in-memory dtype
    tree["dtype"] = str(dtype).removeprefix("torch.")
    config.write_text(json.dumps(tree, indent=2, sort_keys=True) + "\n")
    model.save_pretrained(out / ADAPTER_DIR, **({} if state_dict is None else {"state_dict": state_dict}))


def merge_checkpoint(model, checkpoint: str | Path, output_dir: str | Path, dtype) -> str:
    """Load a Trainer checkpoint's adapter into the PeftModel `model` and save it merged
    (save_merged) to output_dir: a round stopped early hands on its last good checkpoint,
    which holds the adapter alone."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(Path(checkpoint) / "adapter_model.safetensors")))
    save_merged(model, output_dir, dtype)
    return str(output_dir)


def adapter_params(model) -> int:
    """Trainable parameters of a PeftModel (the adapters)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
