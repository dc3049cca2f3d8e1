"""The pipeline's units of work around grpo_core: the stages (stages, their cache keys in
stage_keys, the content-keyed cache), launching a stage in its own process (launch), the
vLLM server (vllm_server), the charts (plots), and everything MLflow in tracking/."""
import os

# Runs before any tasks.* module, hence before any of them imports mlflow: no usage
# telemetry, no writes to ~/.config/mlflow.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
