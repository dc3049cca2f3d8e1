"""Prefect/MLflow task helpers of the pipeline."""
import os

# Runs before any tasks.* module, hence before any of them imports mlflow: no usage
# telemetry, no writes to ~/.config/mlflow.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
