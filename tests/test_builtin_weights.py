"""builtin:tiny-arith ships its weights (grpo_core/builtin_models/tiny-arith): every machine
starts the demo from the same base model, whatever its CPU's float kernels would build."""
import hashlib
import json
import time

import pytest

from grpo_core.modeling.loading import builtin_dir, resolve_model_path
from grpo_core.modeling.tiny import (
    SHIPPED_DIR,
    TinyRecipe,
    build_record,
    build_tiny_model,
    shipped_tiny,
    weights_sha256,
)


def test_shipped_weights_are_the_recipes_and_match_their_record():
    meta = json.loads((SHIPPED_DIR / "builtin.json").read_text())
    recorded = hashlib.sha256(json.dumps(meta["recipe"], sort_keys=True).encode()).hexdigest()[:10]
    # a recipe change without re-shipping (grpo model build --ship) fails here
    assert recorded == TinyRecipe().key()
    assert shipped_tiny() == SHIPPED_DIR
    assert weights_sha256(SHIPPED_DIR) == meta["weights_sha256"]
    assert (SHIPPED_DIR / "model.safetensors").stat().st_size < 2**20  # 0.8 MB in the repo
    assert set(meta["built_on"]) >= {"torch", "cpu_capability", "machine"}


def test_builtin_loads_the_shipped_weights_without_building(tmp_path):
    t0 = time.perf_counter()
    path = resolve_model_path("builtin:tiny-arith", tmp_path / "models")
    assert path == str(SHIPPED_DIR)
    assert time.perf_counter() - t0 < 5  # no pretraining (~2 min)
    assert not (tmp_path / "models").exists()  # nothing built into the workspace
    assert builtin_dir("builtin:tiny-arith", tmp_path) == SHIPPED_DIR
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    out = model.generate(**tok(["What is 2 + 3?"], return_tensors="pt"), max_new_tokens=4,
                         do_sample=False)
    assert out.shape[1] > 0


def test_another_recipe_is_built_not_shipped(tmp_path):
    other = TinyRecipe(pretrain_steps=1)
    assert shipped_tiny(other) is None


@pytest.mark.slow
def test_rebuilding_reproduces_the_shipped_weights_on_the_same_kernels(tmp_path):
    """Bit-exact only with the CPU kernels the shipped build ran on (torch version, CPU
    capability: AVX2 vs AVX-512 kernels sum in other orders); elsewhere the rebuild is
    another model, which is why the weights ship. ~2 min on 2 idle cores."""
    meta = json.loads((SHIPPED_DIR / "builtin.json").read_text())
    here = build_record()
    if (here["torch"], here["cpu_capability"], here["machine"]) != (
            meta["built_on"]["torch"], meta["built_on"]["cpu_capability"], meta["built_on"]["machine"]):
        pytest.skip(f"other kernels than the shipped build's: {here} vs {meta['built_on']}")
    build_tiny_model(tmp_path / "rebuilt", TinyRecipe())
    assert weights_sha256(tmp_path / "rebuilt") == meta["weights_sha256"]
