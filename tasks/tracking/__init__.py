"""One entry point to MLflow tracking for flows and stages (`tracking.<name>`): a thin
adapter that logs what grpo_core.eval decides. Its modules, bottom-up (each imports only
those before it): mlflow_client (the process's client: params, tags, metrics, child runs), mlflow_model,
spool (metric points MLflow's asynchronous logging could not send), artifacts, registry,
headline (views, UI links, descriptions), verdict_freshness, parent_run.
step_logger.StepLogger, the trainer callback, imports transformers: it is not re-exported.
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
    describe_comparison,
    links_for_run,
)
from tasks.tracking.mlflow_client import (  # noqa: F401 - re-exported
    child_run,
    connect,
    current_uri,
    end_run,
    experiment_id,
    get_client,
    has_metrics,
    log_metrics,
    metric_history,
    set_tags,
)
from tasks.tracking.parent_run import (  # noqa: F401 - re-exported
    close_pipeline,
    fail_pipeline,
    start_parent_run,
)
from tasks.tracking.registry import (  # noqa: F401 - re-exported
    champion_uri,
    champion_version,
    download_champion,
    model_name,
    promote,
    register_model,
)
from tasks.tracking.spool import replay_unsent_metrics  # noqa: F401 - re-exported
from tasks.tracking.verdict_freshness import comparison_verdict  # noqa: F401 - re-exported
