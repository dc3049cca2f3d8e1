"""Model registry: register a pipeline's model as a version of <project>-<recipe>, promote
it to `champion` when it beats the current one (the paired per-problem difference's CI
above 0), and fetch the champion. tasks.tracking re-exports the public names."""
from __future__ import annotations

import contextlib
import os
import shutil
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from grpo_core.eval.attribution import ci_phrase
from grpo_core.eval.paired import paired_delta
from tasks.tracking.mlflow_client import get_client, sanitize_key, set_tags
from tasks.tracking.mlflow_model import hf_folder, log_and_register
from tasks.tracking.redaction import redact
from tasks.tracking.tracking_store import read_state, slug, write_state

CHAMPION, CHALLENGER = "champion", "challenger"
EVAL_RUN_TAG = "grpo.eval_run_id"
PAIRED_RULE = ("paired: promote when the lower bound of the 95% paired bootstrap CI of "
               "challenger minus champion (per-problem scores, same problems) is > 0")
UNPAIRED_RULE = ("unpaired (no per-problem records given): promote when the challenger's "
                 "mean exceeds the champion's CI upper bound")


def model_name(cfg) -> str:
    """Registered model of a config family: <project>-<recipe>. Stable across retraining
    rounds (a new config hash of the same recipe competes for the same champion)."""
    return slug(f"{cfg.project.name}-{cfg.project.recipe}")


def register_model(run_id: str, model_dir: str | os.PathLike, name: str,
                   tags: Mapping[str, Any] | None = None, client: MlflowClient | None = None) -> str:
    """Log the HF folder `model_dir` (save_pretrained output) as an MLflow model of run
    `run_id` and register it as a new version of `name` with alias `challenger`; returns
    the version.

    The model is MLflow's `transformers` flavour (task text-generation, string in and out,
    the tokenizer as a component, the stored weights' dtype kept), logged as MLflow 3 does
    it: a LoggedModel of the run (the runs table's "Models" column, the run's outputs)
    whose artifacts are the flavour's folder, and a version created from it. So
    `mlflow.transformers.load_model("models:/<name>@champion")` returns a generating
    pipeline and `mlflow.pyfunc.load_model` a string-to-string model. Only MlflowClient
    calls with explicit ids (no fluent API, no global tracking URI: see
    tasks.tracking.mlflow_client.connect).

    A folder the flavour cannot take (transformers cannot load it) is logged as before,
    files as they are under the run's `model/` artifacts, registered from runs:/<id>/model;
    the version's tags say so (grpo.model_format=hf-folder, grpo.flavour_error).

    A second call for the same run (a re-run of a finished config) returns the existing
    version instead of copying the weights again.
    """
    c = get_client(client)
    _ensure_registered_model(c, name)
    existing = [v for v in c.search_model_versions(f"name = '{name}'") if v.run_id == run_id]
    if existing:
        version = max(existing, key=lambda v: int(v.version)).version
    else:
        art = c.get_run(run_id).info.artifact_uri
        if art.startswith("file:"):
            store = Path(urllib.parse.urlparse(art).path).resolve()
            if Path(model_dir).resolve() in (store, *store.parents):
                raise ValueError(f"model_dir {model_dir} contains the artifact store {store}")
        version_tags = {k: str(v) for k, v in redact(dict(tags or {})).items()}
        mv = log_and_register(c, run_id, model_dir, name, version_tags)
        version = mv.version
    c.set_registered_model_alias(name, CHALLENGER, version)
    set_tags(run_id, {"grpo.registered_model": name, "grpo.model_version": str(version)}, c)
    return str(version)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        with contextlib.suppress(MlflowException):  # created meanwhile
            client.create_registered_model(name, description="GRPO pipeline model; aliases "
                                           "champion (serving) and challenger (latest).")


def _metric_tags(metric: str, value: float, ci_lo: float | None, ci_hi: float | None,
                 protocol_hash: str | None, eval_run_id: str | None = None) -> dict[str, str]:
    m = sanitize_key(metric)
    tags = {"grpo.metric": metric, f"grpo.{m}": repr(float(value))}
    if ci_lo is not None:
        tags[f"grpo.{m}.ci_lo"] = repr(float(ci_lo))
    if ci_hi is not None:
        tags[f"grpo.{m}.ci_hi"] = repr(float(ci_hi))
    if protocol_hash:
        tags["grpo.protocol_hash"] = protocol_hash
    if eval_run_id:  # where the next challenger finds this version's per-problem records
        tags[EVAL_RUN_TAG] = eval_run_id
    return tags


def _triplet(source: Mapping[str, Any], metric: str) -> tuple[float | None, float | None, float | None]:
    """(value, ci_lo, ci_hi) from any of: version tags, {"value","ci_lo","ci_hi"},
    {metric: {"mean","lo","hi"}}, or flat {metric, metric_ci_lo, metric_ci_hi}."""
    m = sanitize_key(metric)

    def num(x):
        try:
            return float(x) if x is not None else None
        except (TypeError, ValueError):
            return None

    if f"grpo.{m}" in source:
        return (num(source.get(f"grpo.{m}")), num(source.get(f"grpo.{m}.ci_lo")),
                num(source.get(f"grpo.{m}.ci_hi")))
    if "value" in source:
        return num(source.get("value")), num(source.get("ci_lo")), num(source.get("ci_hi"))
    block = source.get(metric, source.get(m))
    if isinstance(block, Mapping):
        return num(block.get("mean")), num(block.get("lo")), num(block.get("hi"))
    return num(block), num(source.get(f"{m}_ci_lo")), num(source.get(f"{m}_ci_hi"))


def fmt_ci(v, lo, hi) -> str:
    """A value with its CI, "0.5000 [0.4000, 0.6000]" (no CI when a bound is missing)."""
    ci = f" [{lo:.4f}, {hi:.4f}]" if lo is not None and hi is not None else ""
    return f"{v:.4f}{ci}"


def promote_if_better(client: MlflowClient | None, name: str, version: str, metric: str,
                      value: float, ci_lo: float | None = None,
                      champion_metrics: Mapping[str, Any] | None = None, *,
                      ci_hi: float | None = None,
                      protocol_hash: str | None = None,
                      records: Sequence[Mapping] | None = None,
                      champion_records: Sequence[Mapping] | None = None,
                      eval_run_id: str | None = None,
                      n_resamples: int = 1000, seed: int = 0) -> tuple[bool, str]:
    """Make `version` the champion when there is none, or when it beats the champion.
    Returns (promoted, reason).

    With the challenger's per-problem eval `records` (what the pipeline and retrain flows
    pass), the rule is PAIRED_RULE: both models on the same problems, promote when the
    lower bound of the 95% paired bootstrap CI of challenger minus champion is > 0.
    `champion_records` are the champion's rows (retrain: re-evaluated under today's
    protocol; the pipeline: read back through the champion's grpo.eval_run_id tag).
    Without them, or when they come from another protocol or other problems, nothing can
    be paired: the champion stays and the reason says why.

    Without `records` (a caller holding only summary numbers) the rule is UNPAIRED_RULE:
    `value` must exceed the champion's CI upper bound, read from its version tags or
    `champion_metrics`; stored numbers from another protocol are not compared.

    The challenger's value, CI, protocol hash and eval run id are stored as version tags;
    the decision as tags on the challenger version (grpo.decision, grpo.decision_reason,
    grpo.decision_rule, grpo.paired_delta[.ci_lo/.ci_hi], ...).
    """
    c = get_client(client)
    version = str(version)
    for k, v in _metric_tags(metric, value, ci_lo, ci_hi, protocol_hash, eval_run_id).items():
        c.set_model_version_tag(name, version, k, v)
    champ = champion_version(name, c)
    rule, paired = (PAIRED_RULE if records is not None else UNPAIRED_RULE), None
    if champ is None:
        promoted, against = True, ""
        reason = f"no champion yet; v{version} {metric} {fmt_ci(value, ci_lo, ci_hi)}"
    elif str(champ.version) == version:
        promoted, reason, against = True, f"v{version} is already the champion", version
    elif records is not None:
        against = str(champ.version)
        promoted, reason, paired = _paired_decision(
            champ, version, metric, records, champion_records, protocol_hash,
            {"n_resamples": n_resamples, "seed": seed})
    else:
        against = str(champ.version)
        promoted, reason = _unpaired_decision(champ, version, metric, (value, ci_lo, ci_hi),
                                              champion_metrics, protocol_hash)
    if promoted:
        c.set_registered_model_alias(name, CHAMPION, version)
    for k, v in _decision_tags(promoted, reason, against, rule, metric, paired).items():
        c.set_model_version_tag(name, version, k, v)
    # The decision in words on the version's page (its tags sit in a small box below).
    c.update_model_version(name, version, description=decision_text(promoted, reason, against, rule))
    return promoted, reason


def decision_text(promoted: bool, reason: str, against: str, rule: str) -> str:
    """The model version's description: the decision, what it was compared with, the rule."""
    said = "Promoted to champion" if promoted else "Kept as challenger (not promoted)"
    with_ = f"champion v{against}" if against else "no champion (the first version)"
    return f"**{said}.** Compared with {with_}: {reason}.\n\nRule: {rule}."


def _decision_tags(promoted: bool, reason: str, against: str, rule: str, metric: str,
                   paired: Mapping | None) -> dict[str, str]:
    tags = {"grpo.decision": "promoted" if promoted else "rejected",
            "grpo.decision_reason": reason, "grpo.compared_with": against or "none (first version)",
            "grpo.decision_rule": rule,
            "grpo.decided_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if paired:
        tags.update({"grpo.paired_metric": metric, "grpo.paired_delta": repr(paired["delta"]),
                     "grpo.paired_delta.ci_lo": repr(paired["lo"]),
                     "grpo.paired_delta.ci_hi": repr(paired["hi"]),
                     "grpo.paired_n": str(paired["n"])})
    return tags


def _protocol_reason(against: str, theirs: str, ours: str | None, fix: str) -> str:
    return (f"champion v{against} was evaluated under protocol {theirs}, challenger under "
            f"{ours}; kept the champion ({fix})")


def _protocols(records: Sequence[Mapping]) -> set[str]:
    return {r["protocol_hash"] for r in records if r.get("protocol_hash")}


def _paired_decision(champ, version: str, metric: str, records: Sequence[Mapping],
                     champion_records: Sequence[Mapping] | None, protocol_hash: str | None,
                     ci_kw: dict) -> tuple[bool, str, dict | None]:
    against = str(champ.version)
    fix = "re-evaluate both under one protocol: grpo retrain"
    if not records:
        return False, (f"no per-problem records of challenger v{version} to pair with "
                       f"champion v{against}; kept the champion"), None
    if champion_records is None:
        theirs = champ.tags.get("grpo.protocol_hash")
        if protocol_hash and theirs and theirs != protocol_hash:
            return False, _protocol_reason(against, theirs, protocol_hash, fix), None
        return False, (f"no per-problem records of champion v{against} to pair with; kept "
                       f"the champion ({fix})"), None
    ours, theirs = _protocols(records), _protocols(champion_records)
    if ours and theirs and ours != theirs:
        return False, _protocol_reason(against, ",".join(sorted(theirs)),
                                       ",".join(sorted(ours)), fix), None
    from grpo_core.eval.evaluation import vote_key  # maj@k votes as the evaluation did

    try:
        d = paired_delta(list(records), list(champion_records), metric, canon=vote_key, **ci_kw)
    except ValueError as exc:
        return False, (f"no paired comparison with champion v{against}: {exc}; kept the "
                       f"champion"), None
    promoted = d["lo"] > 0
    return promoted, (f"challenger v{version} - champion v{against} {metric}: paired delta "
                      f"{ci_phrase(d)} over {d['n']} problems, "
                      f"CI lower bound {'>' if promoted else '<='} 0"), d


def _unpaired_decision(champ, version: str, metric: str, mine: tuple, champion_metrics,
                       protocol_hash: str | None) -> tuple[bool, str]:
    """UNPAIRED_RULE, for callers without per-problem records."""
    against = str(champ.version)
    if champion_metrics is not None:
        cv, clo, chi = _triplet(champion_metrics, metric)
        champ_protocol = None  # numbers supplied by the caller, under today's protocol
    else:
        cv, clo, chi = _triplet(champ.tags, metric)
        champ_protocol = champ.tags.get("grpo.protocol_hash")
    if cv is None:
        return False, (f"champion v{against} has no recorded {metric}; kept it (pass "
                       f"champion_metrics from a re-evaluation to compare)")
    if protocol_hash and champ_protocol and champ_protocol != protocol_hash:
        return False, _protocol_reason(against, champ_protocol, protocol_hash,
                                       "re-evaluate it and pass champion_metrics")
    bar = chi if chi is not None else cv
    promoted = mine[0] > bar
    return promoted, (f"challenger v{version} {metric} {fmt_ci(*mine)} "
                      f"{'>' if promoted else '<='} champion v{against} "
                      f"{'upper CI ' if chi is not None else ''}{bar:.4f} "
                      f"(champion {fmt_ci(cv, clo, chi)})")


def decision_record(name: str, version: str, client: MlflowClient | None = None) -> dict:
    """What promote_if_better decided for `version`, read back from its tags: decision,
    reason, rule, compared_with and the paired delta ({"delta", "lo", "hi", "n"}) if any."""
    tags = get_client(client).get_model_version(name, str(version)).tags
    out = {k: tags.get(f"grpo.{t}") for k, t in (
        ("decision", "decision"), ("reason", "decision_reason"), ("rule", "decision_rule"),
        ("compared_with", "compared_with"))}
    paired = None
    if tags.get("grpo.paired_delta") is not None:
        paired = {"metric": tags.get("grpo.paired_metric"),
                  "delta": float(tags["grpo.paired_delta"]),
                  "lo": float(tags["grpo.paired_delta.ci_lo"]),
                  "hi": float(tags["grpo.paired_delta.ci_hi"]), "n": int(tags["grpo.paired_n"])}
    return {**out, "paired": paired}


def champion_uri(name: str) -> str:
    return f"models:/{name}@{CHAMPION}"


def champion_version(name: str, client: MlflowClient | None = None):
    """The champion ModelVersion of `name`, or None."""
    try:
        return get_client(client).get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None


def download_champion(name: str, dst: str | os.PathLike, client: MlflowClient | None = None) -> Path:
    """Download the champion into `dst` (skipped when `dst` already holds that version) and
    return the folder to pass to from_pretrained: config.json, the weights and the
    tokenizer files. Raises LookupError when `name` has no champion.

    A version logged with the transformers flavour is downloaded whole to dst/v<version>/
    and the folder returned is its model/ (weights), into which the tokenizer files of
    components/tokenizer/ are copied; a version registered as a plain HF folder (before
    the flavour, or when it failed) is that folder. The previous champion's v<N>/ is
    removed."""
    c = get_client(client)
    mv = champion_version(name, c)
    if mv is None:
        raise LookupError(f"registered model {name!r} has no {CHAMPION!r} alias")
    dst = Path(dst)
    marker = dst / ".grpo_model_version.json"
    want = {"name": name, "version": str(mv.version), "run_id": mv.run_id}
    seen = read_state(marker)
    if {k: seen.get(k) for k in want} == want and (dst / seen.get("folder", "")).is_dir():
        return dst / seen["folder"]
    dst.mkdir(parents=True, exist_ok=True)
    prefix = f"runs:/{mv.run_id}/"
    if mv.run_id and (mv.source or "").startswith(prefix):
        local = Path(c.download_artifacts(mv.run_id, mv.source[len(prefix):], str(dst)))
    else:  # a logged model (or registered elsewhere): where the registry says it is
        out = dst / f"v{mv.version}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        local = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=c.get_model_version_download_uri(name, str(mv.version)),
            dst_path=str(out), tracking_uri=c.tracking_uri))
    folder = hf_folder(local)
    old = seen.get("version")
    if old and str(old) != str(mv.version) and (dst / f"v{old}").is_dir():
        shutil.rmtree(dst / f"v{old}", ignore_errors=True)
    write_state(marker, {**want, "folder": os.path.relpath(folder, dst)})
    return folder
