"""The recipe verdict's freshness in MLflow (the rule and texts: grpo_core.eval.freshness).

`stamp` records on a new comparison run the model versions its verdict was computed with
(tag grpo.verdict_versions, from each parent run's grpo.registered_model/model_version) and
writes "computed with ..." under the verdict in the run's and the experiment's descriptions.
`mark_if_stale`, called when a retrain or a pipeline has finished (either may have promoted
a newer champion), puts a `STALE: ...` line at the top of both and tags the run
grpo.verdict_stale; `comparison_verdict` (what `grpo compare` prints) adds both.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from grpo_core.eval.freshness import (
    computed_with,
    stale,
    stale_line,
    under_verdict,
    with_stale_line,
)
from tasks.tracking.headline import VERDICT_TAG
from tasks.tracking.mlflow_client import client_for, get_client, set_tags
from tasks.tracking.registry import champion_version

VERSIONS_TAG, STALE_TAG = "grpo.verdict_versions", "grpo.verdict_stale"
NOTE = "mlflow.note.content"
log = logging.getLogger(__name__)


def _champion(name: str, c: MlflowClient) -> str | None:
    champ = champion_version(name, c)
    return str(champ.version) if champ else None


def _rewrite_notes(c: MlflowClient, run, tags: dict, edit: Callable[[str], str]) -> None:
    """Set `tags` on comparison run `run` and rewrite its and its experiment's descriptions."""
    set_tags(run.info.run_id, {**tags, NOTE: edit(run.data.tags.get(NOTE, ""))}, c)
    exp = c.get_experiment(run.info.experiment_id)
    c.set_experiment_tag(exp.experiment_id, NOTE, edit(exp.tags.get(NOTE, "")))


def stamp(run_id: str, parent_runs: list[str], client: MlflowClient | None = None) -> str:
    """Record what the comparison run `run_id`'s verdict was computed with; returns the
    "computed with ..." line ("" when no parent registered a model)."""
    c = get_client(client)
    recorded = {}
    for parent in parent_runs:
        tags = c.get_run(parent).data.tags
        name, version = tags.get("grpo.registered_model"), tags.get("grpo.model_version")
        if name and version:
            recorded[name] = {"version": str(version), "champion": _champion(name, c)}
    line = computed_with(recorded)
    if line:
        _rewrite_notes(c, c.get_run(run_id), {VERSIONS_TAG: json.dumps(recorded), STALE_TAG: "no"},
                       lambda note: under_verdict(note, f"({line})"))
    return line


def _newest_comparison(c: MlflowClient, experiment: str):
    """The experiment's newest comparison run (None without one)."""
    exp = c.get_experiment_by_name(experiment)
    found = c.search_runs([exp.experiment_id], "tags.`grpo.pipeline` = 'comparison'",
                          order_by=["attributes.start_time DESC"], max_results=1) if exp else []
    return found[0] if found else None


def _stale_line(run, c: MlflowClient) -> str:
    recorded = json.loads(run.data.tags.get(VERSIONS_TAG) or "{}")
    return stale_line(stale(recorded, {name: _champion(name, c) for name in recorded}))


def comparison_verdict(uri: str | None, experiment: str) -> str | None:
    """The verdict of `experiment`'s newest comparison run, with what it was computed with
    and STALE: ... when a champion moved on (None without one)."""
    c = client_for(uri)
    run = _newest_comparison(c, experiment)
    said = run.data.tags.get(VERDICT_TAG) if run else None
    if said in (None, "none"):
        return None
    line = computed_with(json.loads(run.data.tags.get(VERSIONS_TAG) or "{}"))
    return " ".join(x for x in (said, f"({line})" if line else "", _stale_line(run, c)) if x)


def mark_if_stale(experiment: str, client: MlflowClient | None = None) -> str:
    """Refresh the STALE line of `experiment`'s newest verdict; returns it ("" when fresh or
    there is none). A tracking error is logged, never raised: the run itself is done."""
    try:
        c = get_client(client)
        run = _newest_comparison(c, experiment)
        if run is None or VERSIONS_TAG not in run.data.tags:
            return ""
        line = _stale_line(run, c)
        _rewrite_notes(c, run, {STALE_TAG: line or "no"}, lambda note: with_stale_line(note, line))
        return line
    except MlflowException as exc:
        log.warning("could not check the verdict's freshness: %s", exc)
        return ""
