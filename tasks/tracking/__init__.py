"""One entry point to MLflow tracking for flows and stages (`tracking.<name>`): a thin
adapter that logs what grpo_core.eval decides. It re-exports what its callers use from
the modules doing the work, layered bottom-up (each imports only modules above it):

- redaction, tracking_store: secrets; where the store is and whether it answers (MLflow's
  own credentials); the workdir and its run-state files
- mlflow_client: the process's client (MLflow's HTTP retries cut to seconds), params,
  tags, metrics (one log_batch: MLflow splits it), child runs
- mlflow_model, spool: a model as an MLflow transformers model; the offline spool of
  metric points MLflow's asynchronous logging could not send
- artifacts, registry, trainer_logging: artifacts and tables, the model registry and the
  promotion rule's decision recorded, the trainer callback's keys and the replay of
  unsent points (the callback itself, step_logger.StepLogger, imports transformers: it
  is not re-exported, so importing this facade does not import transformers)
- headline: the experiment's runs-table view, UI links, the comparison's descriptions
- parent_run: a pipeline's parent run from start to close (see its docstring)
"""
from __future__ import annotations

from tasks.tracking.artifacts import (  # noqa: F401 - re-exported
    copy_artifacts,
    log_comparison,
    log_eval_table,
    log_json,
    log_passrate_histogram,
    log_text,
    log_training_curves,
)
from tasks.tracking.headline import (  # noqa: F401 - re-exported
    compare_table,
    comparison_verdict,
    describe_comparison,
    links_for_run,
)
from tasks.tracking.mlflow_client import (  # noqa: F401 - re-exported
    child_run,
    config_params,
    connect,
    current_uri,
    end_run,
    eval_metrics,
    experiment_id,
    get_client,
    has_metrics,
    log_metrics,
    metric_history,
    sanitize_key,
    set_tags,
    stage_of,
)
from tasks.tracking.parent_run import (  # noqa: F401 - re-exported
    close_pipeline,
    fail_pipeline,
    start_parent_run,
)
from tasks.tracking.redaction import is_secret_name, redact  # noqa: F401 - re-exported
from tasks.tracking.registry import (  # noqa: F401 - re-exported
    champion_uri,
    champion_version,
    download_champion,
    model_name,
    promote,
    promote_if_better,
    register_model,
)
from tasks.tracking.tracking_store import (  # noqa: F401 - re-exported
    TrackingUnreachable,
    artifact_root,
    check_reachable,
    tracking_uri,
)
from tasks.tracking.trainer_logging import replay_unsent_metrics  # noqa: F401 - re-exported
