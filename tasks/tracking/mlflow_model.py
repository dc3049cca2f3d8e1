"""A trained model as an MLflow model: the `transformers` flavour (text-generation, string
in and out, the tokenizer as a component, the stored dtype kept), logged as a LoggedModel
of the pipeline's run and registered from it, through an explicit MlflowClient only. A
LoRA model's adapter/ is kept beside it (a downloaded one back as a from_pretrained
folder: grpo_core.modeling.loading.hf_folder)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.train.lora import ADAPTER_DIR
from grpo_core.workspace import is_remote

MODEL_FORMAT_TAG = "grpo.model_format"
MODEL_VERSIONS_TAG = "mlflow.modelVersions"  # mlflow.utils.mlflow_tags.MLFLOW_MODEL_VERSIONS
_log = logging.getLogger(__name__)


def log_and_register(c: MlflowClient, run_id: str, model_dir: str | os.PathLike, name: str,
                     version_tags: dict[str, str]):
    """A new version of `name` holding the HF folder `model_dir` in the transformers
    flavour; one the flavour cannot take is logged as plain files under the run's `model/`
    (version tags grpo.model_format=hf-folder, grpo.flavour_error)."""
    with tempfile.TemporaryDirectory(prefix="grpo-mlflow-model-") as tmp:
        local = Path(tmp) / "model"
        try:
            _save_flavour(model_dir, local, name, run_id)
        except Exception as exc:  # noqa: BLE001 - registered anyway, as plain files
            _log.warning("register_model: %s is not loadable as an MLflow transformers "
                         "model (%s: %s); logging the folder as plain files",
                         model_dir, type(exc).__name__, exc)
            version_tags.update({MODEL_FORMAT_TAG: "hf-folder",
                                 "grpo.flavour_error": f"{type(exc).__name__}: {exc}"[:500]})
            c.log_artifacts(run_id, str(model_dir), "model")
            return c.create_model_version(name, source=f"runs:/{run_id}/model",
                                          run_id=run_id, tags=version_tags)
        version_tags[MODEL_FORMAT_TAG] = "mlflow-transformers"
        adapter = Path(model_dir) / ADAPTER_DIR  # model.peft: the LoRA adapter it merges
        if (adapter / "adapter_config.json").is_file():
            shutil.copytree(adapter, local / ADAPTER_DIR)  # kept beside the merged weights
        return _log_logged_model(c, run_id, local, name, version_tags)


def _model_card(name: str, run_id: str):
    """Our own card: without one MLflow looks the folder path up on the hub, and warns."""
    from huggingface_hub import ModelCard

    return ModelCard("---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n"
                     f"# {name}\n\nFine-tuned by the GRPO pipeline (MLflow run {run_id}).\n")


def _pip_requirements() -> list[str]:
    """What loading the model needs, pinned to the versions here: MLflow's default raises
    without torchvision, and inferring them would load the model again in a subprocess."""
    from grpo_core.versions import installed_version

    return [f"{pkg}=={v.split('+')[0]}" for pkg in
            ("transformers", "torch", "tokenizers", "safetensors", "accelerate")
            if (v := installed_version(pkg))]


def _save_flavour(model_dir: str | os.PathLike, path: Path, name: str, run_id: str) -> None:
    """mlflow.transformers.save_model of the HF folder into `path` (model/, components/
    tokenizer/, MLmodel). The model is loaded in its stored dtype and saved again, not
    handed over as a folder path: MLflow's local-checkpoint route fails under
    transformers 5 (it reads pipelines.check_task(task)[1]["impl"].__name__, now a dotted
    string), and re-saving leaves out a trainer's extra files (training_args.bin, optimizer
    state). Fine-tuned weights are always copied (save_pretrained=False is for hub models)."""
    import mlflow.transformers
    from mlflow.models.signature import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
    from transformers import AutoTokenizer

    from grpo_core.modeling.loading import load_causal_lm

    # The tokenizer exactly as saved (load_tokenizer would add a pad token to the registered
    # model); the weights through the one loader, in their stored dtype.
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_causal_lm(str(model_dir), "auto")
    model.eval()
    signature = ModelSignature(inputs=Schema([ColSpec("string")]),
                               outputs=Schema([ColSpec("string")]),
                               params=ParamSchema([ParamSpec("max_new_tokens", "long", 256)]))
    mlflow.transformers.save_model(
        {"model": model, "tokenizer": tokenizer}, str(path), task="text-generation",
        torch_dtype=model.dtype, signature=signature, model_card=_model_card(name, run_id),
        pip_requirements=_pip_requirements())


def _log_logged_model(c: MlflowClient, run_id: str, local: Path, name: str,
                      version_tags: dict[str, str]):
    """Log `local` as a LoggedModel of the run and register it, as log_model +
    register_model would, through `c` only."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model

    run = c.get_run(run_id)
    lm = c.create_logged_model(run.info.experiment_id, name="model", source_run_id=run_id,
                               tags={"grpo.registered_model": name})
    try:
        c.log_outputs(run_id, [LoggedModelOutput(lm.model_id, step=0)])
        mlmodel = local / "MLmodel"
        meta = Model.load(str(mlmodel))  # the ids the logged model got, as Model.log writes
        meta.run_id, meta.model_id, meta.model_uuid = run_id, lm.model_id, lm.model_id
        meta.artifact_path = lm.artifact_location
        meta.save(str(mlmodel))
        c.log_model_artifacts(lm.model_id, str(local))
    except BaseException:
        with contextlib.suppress(Exception):
            c.finalize_logged_model(lm.model_id, "FAILED")
        raise
    c.finalize_logged_model(lm.model_id, "READY")
    mv = c.create_model_version(name, source=_version_source(c, lm), run_id=run_id,
                                tags=version_tags, model_id=lm.model_id)
    _link_version(c, lm.model_id, name, str(mv.version))
    return mv


def _version_source(c: MlflowClient, lm) -> str:
    """models:/<model_id>, as MLflow 3's register_model records it, where that resolves to
    this store (a tracking server, or the global tracking URI); else the logged model's
    artifact location (a local SQL registry resolves models:/ through the global URI,
    which connect leaves alone)."""
    uri = c.tracking_uri
    if is_remote(uri) or mlflow.get_tracking_uri() == uri:
        return f"models:/{lm.model_id}"
    return lm.artifact_location


def _link_version(c: MlflowClient, model_id: str, name: str, version: str) -> None:
    """The logged model's mlflow.modelVersions tag, as mlflow.register_model sets it (a
    tracking server may have set it already)."""
    entry = {"name": name, "version": version}
    try:
        raw = c.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG)
        seen = json.loads(raw) if raw else []
        if not any(isinstance(e, dict) and e.get("name") == name
                   and str(e.get("version")) == version for e in seen):
            c.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(seen + [entry])})
    except (MlflowException, ValueError) as exc:
        _log.warning("register_model: could not tag logged model %s with %s v%s: %s",
                     model_id, name, version, exc)
