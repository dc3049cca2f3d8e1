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
from tasks.tracking.mlflow_client import get_client, set_tags
from tasks.tracking.registry import champion_version

VERSIONS_TAG, STALE_TAG = "grpo.verdict_versions", "grpo.verdict_stale"
NOTE = "mlflow.note.content"
log = logging.getLogger(__name__)


def stamp(run_id: str, parent_runs: list[str], client: MlflowClient | None = None) -> str:
    """Record what the comparison run `run_id`'s verdict was computed with; returns the
    "computed with ..." line ("" when no parent registered a model)."""
    c = get_client(client)
    recorded = {}
    for parent in parent_runs:
        tags = c.get_run(parent).data.tags
        name, version = tags.get("grpo.registered_model"), tags.get("grpo.model_version")
        if name and version:
            champ = champion_version(name, c)
            recorded[name] = {"version": str(version),
                              "champion": str(champ.version) if champ else None}
    line = computed_with(recorded)
    if not line:
        return ""
    run = c.get_run(run_id)
    set_tags(run_id, {VERSIONS_TAG: json.dumps(recorded), STALE_TAG: "no",
                      NOTE: under_verdict(run.data.tags.get(NOTE, ""), f"({line})")}, c)
    exp = c.get_experiment(run.info.experiment_id)
    c.set_experiment_tag(exp.experiment_id, NOTE,
                         under_verdict(exp.tags.get(NOTE, ""), f"({line})"))
    return line


def newest_comparison(c: MlflowClient, experiment_id: str):
    """The experiment's newest comparison run (None without one)."""
    found = c.search_runs([experiment_id], "tags.`grpo.pipeline` = 'comparison'",
                          order_by=["attributes.start_time DESC"], max_results=1)
    return found[0] if found else None


def freshness(run, client: MlflowClient | None = None) -> dict:
    """{"computed_with": line, "stale": "STALE: ..." or ""} of comparison run `run`."""
    c = get_client(client)
    recorded = json.loads(run.data.tags.get(VERSIONS_TAG) or "{}")
    champions = {}
    for name in recorded:
        champ = champion_version(name, c)
        champions[name] = str(champ.version) if champ else None
    return {"computed_with": computed_with(recorded), "stale": stale_line(stale(recorded, champions))}


def comparison_verdict(uri: str | None, experiment: str) -> str | None:
    """The verdict of `experiment`'s newest comparison run, with what it was computed with
    and STALE: ... when a champion moved on (None without one)."""
    client = MlflowClient(tracking_uri=uri, registry_uri=uri) if uri else get_client()
    exp = client.get_experiment_by_name(experiment)
    run = newest_comparison(client, exp.experiment_id) if exp is not None else None
    said = run.data.tags.get(VERDICT_TAG) if run else None
    if said in (None, "none"):
        return None
    f = freshness(run, client)
    return " ".join(x for x in (said, f"({f['computed_with']})" if f["computed_with"] else "",
                                f["stale"]) if x)


def mark_if_stale(experiment: str, client: MlflowClient | None = None) -> str:
    """Refresh the STALE line of `experiment`'s newest verdict; returns it ("" when fresh or
    there is none). A tracking error is logged, never raised: the run itself is done."""
    try:
        c = get_client(client)
        exp = c.get_experiment_by_name(experiment)
        run = newest_comparison(c, exp.experiment_id) if exp is not None else None
        if run is None or VERSIONS_TAG not in run.data.tags:
            return ""
        line = freshness(run, c)["stale"]
        set_tags(run.info.run_id, {STALE_TAG: line or "no",
                                   NOTE: with_stale_line(run.data.tags.get(NOTE, ""), line)}, c)
        c.set_experiment_tag(exp.experiment_id, NOTE,
                             with_stale_line(exp.tags.get(NOTE, ""), line))
        return line
    except MlflowException as exc:
        log.warning("could not check the verdict's freshness: %s", exc)
        return ""
