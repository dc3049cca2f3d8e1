"""Registered versions are MLflow models: tasks.tracking.registry.register_model logs the trained HF
folder with MLflow's transformers flavour (a LoggedModel of the run, text-generation,
string in and out, the tokenizer, the stored bf16 dtype), so `models:/<name>@champion`
loads with mlflow.transformers.load_model and generates, and download_champion still hands
retraining a from_pretrained folder. Real MLflow on SQLite (no mocks), the bf16
builtin:proxy-qwen2 architecture and tokenizer (random weights: no warm start, to be fast)."""
from __future__ import annotations

import json

import mlflow
import pytest
import torch

from tasks import tracking as T
from tasks.tracking.mlflow_model import MODEL_FORMAT_TAG

NAME = "flav-r1_zero"


@pytest.fixture(scope="module")
def proxy_dir(tmp_path_factory):
    from grpo_core.modeling.proxy import ProxyRecipe, build_proxy_qwen2

    torch.set_num_threads(1)
    return build_proxy_qwen2(tmp_path_factory.mktemp("proxy") / "proxy-qwen2",
                             ProxyRecipe(warm_steps=0))


@pytest.fixture
def store(tracked_config):
    """MLflow's global URI unset, as in a pipeline (tasks.tracking.mlflow_client.connect
    leaves it alone)."""
    cfg, wd = tracked_config
    cfg.project.name = "flav"
    return cfg, wd


def _parent(cfg, wd, beta: float) -> str:
    cfg.grpo.beta = beta  # another config hash: another parent run
    return T.start_parent_run(cfg, cfg.hash(), cfg.project.recipe, "abc1234", "flow", wd)


def _float_dtypes(safetensors_path) -> set:
    from safetensors import safe_open

    with safe_open(str(safetensors_path), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys() if f.get_tensor(k).is_floating_point()}


def test_registered_version_is_a_transformers_model(store, proxy_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from grpo_core.modeling.loading import load_tokenizer

    cfg, wd = store
    p1 = _parent(cfg, wd, 0.04)  # connects this process to the store
    c = T.get_client()
    assert T.register_model(p1, proxy_dir, NAME, tags={"recipe": "r1_zero"}) == "1"
    mv = c.get_model_version(NAME, "1")
    assert mv.tags[MODEL_FORMAT_TAG] == "mlflow-transformers" and mv.run_id == p1

    # MLflow 3's layout: a READY LoggedModel, output of the run, tagged with its version.
    outputs = c.get_run(p1).outputs.model_outputs
    assert len(outputs) == 1
    lm = c.get_logged_model(outputs[0].model_id)
    assert str(lm.status).endswith("READY")
    assert lm.source_run_id == p1
    assert {"name": NAME, "version": "1"} in json.loads(lm.tags["mlflow.modelVersions"])
    # The global URI is not this store: the source is the logged model's artifacts.
    assert mv.source == lm.artifact_location

    # A re-run of the finished config: the same version, nothing logged again.
    assert T.register_model(p1, proxy_dir, NAME) == "1"
    assert len(c.get_run(p1).outputs.model_outputs) == 1
    assert len(c.search_model_versions(f"name = '{NAME}'")) == 1

    d = T.promote(c, NAME, "1", "greedy_accuracy", 0.5, 0.4, ci_hi=0.6)
    assert d.promoted and str(c.get_model_version_by_alias(NAME, "champion").version) == "1"

    # download_champion: a from_pretrained folder (weights + tokenizer), bf16 as stored.
    folder = T.download_champion(NAME, wd / "champ")
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    mlmodel = mlflow.models.Model.load(str(folder.parent / "MLmodel"))
    sig = mlmodel.signature
    assert [s.type.name for s in sig.inputs.inputs] == ["string"]
    assert [s.type.name for s in sig.outputs.inputs] == ["string"]
    flav = mlmodel.flavors["transformers"]
    assert flav["task"] == "text-generation" and flav["torch_dtype"] == "torch.bfloat16"
    assert flav["components"] == ["tokenizer"]
    assert mlmodel.model_id == lm.model_id and mlmodel.run_id == p1
    assert _float_dtypes(folder / "model.safetensors") == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype="auto")
    assert model.dtype == torch.bfloat16
    original = AutoModelForCausalLM.from_pretrained(str(proxy_dir), dtype="auto")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                original.state_dict().values(), strict=True))
    tok, ref = load_tokenizer(str(folder)), load_tokenizer(str(proxy_dir))
    text = "<think> 2+3 </think> <answer> 5 </answer>"
    assert tok(text)["input_ids"] == ref(text)["input_ids"]
    assert tok.chat_template == ref.chat_template and tok.eos_token == ref.eos_token
    assert T.download_champion(NAME, wd / "champ") == folder  # cached: same version

    # A second version, registered while the global URI is this store (as a user's
    # MLFLOW_TRACKING_URI): its source is models:/<model_id>, as mlflow.register_model's.
    uri = c.tracking_uri
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    p2 = _parent(cfg, wd, 0.02)
    assert T.register_model(p2, proxy_dir, NAME) == "2"
    lm2 = c.get_logged_model(c.get_run(p2).outputs.model_outputs[0].model_id)
    assert c.get_model_version(NAME, "2").source == f"models:/{lm2.model_id}"

    # Both load through the registry with MLflow's own loaders, and generate.
    pipe = mlflow.transformers.load_model(f"models:/{NAME}@champion")
    assert pipe.model.dtype == torch.bfloat16
    out = pipe("2+3=", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("2+3=")
    prompt_ids = pipe.tokenizer("2+3=")["input_ids"]
    ids = pipe("2+3=", max_new_tokens=4, min_new_tokens=4, do_sample=False,
               return_tensors=True)[0]["generated_token_ids"]
    assert list(ids[:len(prompt_ids)]) == prompt_ids and len(ids) == len(prompt_ids) + 4
    assert mlflow.transformers.load_model(f"models:/{NAME}/2").model.dtype == torch.bfloat16
    pyfunc = mlflow.pyfunc.load_model(f"models:/{NAME}/2")
    pred = pyfunc.predict(["2+3="], params={"max_new_tokens": 3})
    assert isinstance(pred[0], str) and pred[0].startswith("2+3=")

    # A new champion replaces the downloaded one.
    c.set_registered_model_alias(NAME, "champion", "2")
    folder2 = T.download_champion(NAME, wd / "champ")
    assert folder2 != folder and not folder.exists() and (folder2 / "config.json").is_file()


def test_unloadable_folder_is_registered_as_plain_files(store):
    """What transformers cannot load (here a config without weights or tokenizer) is
    still registered, as the folder's files, and downloaded back as they are."""
    cfg, wd = store
    fake = wd / "fake"
    fake.mkdir()
    (fake / "config.json").write_text(json.dumps({"model_type": "llama", "tag": "x"}))
    (fake / "model.safetensors").write_bytes(b"\0" * 64)
    p = _parent(cfg, wd, 0.04)
    v = T.register_model(p, fake, NAME)
    c = T.get_client()
    mv = c.get_model_version(NAME, v)
    assert mv.tags[MODEL_FORMAT_TAG] == "hf-folder" and mv.tags["grpo.flavour_error"]
    assert mv.source == f"runs:/{p}/model"
    assert not c.get_run(p).outputs.model_outputs
    c.set_registered_model_alias(NAME, "champion", v)
    folder = T.download_champion(NAME, wd / "champ")
    assert json.loads((folder / "config.json").read_text())["tag"] == "x"
