"""The promotion rule: does a challenger model replace the champion? Pure: the champion's
version and tags and both models' per-problem eval records in, a `Decision` out
(tasks/tracking/registry.py sets the alias and tags it decides).

With the challenger's per-problem records the rule is PAIRED_RULE: both models on the
same problems, promote when the lower bound of the 95% paired bootstrap CI of challenger
minus champion is > 0. Without the champion's records, or when they come from another
protocol or other problems, nothing can be paired: the champion stays and the reason
says why. Without the challenger's records (a caller holding only summary numbers) the
rule is UNPAIRED_RULE: its mean must exceed the champion's CI upper bound, read from the
champion's version tags or `champion_metrics`; numbers from another protocol are not
compared."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_core.eval.comparison import ci_text
from grpo_core.eval.metric_names import sanitize_key
from grpo_core.eval.paired import paired_delta

PAIRED_RULE = ("paired: promote when the lower bound of the 95% paired bootstrap CI of "
               "challenger minus champion (per-problem scores, same problems) is > 0")
UNPAIRED_RULE = ("unpaired (no per-problem records given): promote when the challenger's "
                 "mean exceeds the champion's CI upper bound")
_FIX = "re-evaluate both under one protocol: grpo retrain"


@dataclass(frozen=True)
class Decision:
    promoted: bool
    reason: str
    against: str  # the champion's version compared with, "" for none
    rule: str
    paired: dict | None = None  # {"delta", "lo", "hi", "n"} of challenger minus champion

    def text(self) -> str:
        """The model version's description, plain text (the registry's versions table
        shows descriptions unrendered)."""
        said = "Promoted to champion" if self.promoted else "Kept as challenger (not promoted)"
        with_ = f"champion v{self.against}" if self.against else "no champion (the first version)"
        return f"{said}. Compared with {with_}: {self.reason}. Rule: {self.rule}."


def decide(version: str, metric: str, value: float, ci_lo: float | None, ci_hi: float | None,
           champion: tuple[str, Mapping[str, str]] | None, *, protocol_hash: str | None = None,
           records: Sequence[Mapping] | None = None,
           champion_records: Sequence[Mapping] | None = None,
           champion_metrics: Mapping[str, Any] | None = None,
           n_resamples: int = 1000, seed: int = 0) -> Decision:
    """`champion`: (its version, its version tags), None when there is none."""
    rule = PAIRED_RULE if records is not None else UNPAIRED_RULE
    version = str(version)
    if champion is None:
        return Decision(True, f"no champion yet; v{version} {metric} {ci_text(value, ci_lo, ci_hi)}",
                        "", rule)
    against, tags = str(champion[0]), champion[1]
    if against == version:
        return Decision(True, f"v{version} is already the champion", against, rule)
    if records is not None:
        promoted, reason, paired = _paired(against, tags, version, metric, records,
                                           champion_records, protocol_hash,
                                           {"n_resamples": n_resamples, "seed": seed})
        return Decision(promoted, reason, against, rule, paired)
    promoted, reason = _unpaired(against, tags, version, metric, (value, ci_lo, ci_hi),
                                 champion_metrics, protocol_hash)
    return Decision(promoted, reason, against, rule)


def _protocol_reason(against: str, theirs: str, ours: str | None, fix: str) -> str:
    return (f"champion v{against} was evaluated under protocol {theirs}, challenger under "
            f"{ours}; kept the champion ({fix})")


def _protocols(records: Sequence[Mapping]) -> set[str]:
    return {r["protocol_hash"] for r in records if r.get("protocol_hash")}


def _paired(against: str, tags: Mapping, version: str, metric: str, records: Sequence[Mapping],
            champion_records: Sequence[Mapping] | None, protocol_hash: str | None,
            ci_kw: dict) -> tuple[bool, str, dict | None]:
    if not records:
        return False, (f"no per-problem records of challenger v{version} to pair with "
                       f"champion v{against}; kept the champion"), None
    if champion_records is None:
        theirs = tags.get("grpo.protocol_hash")
        if protocol_hash and theirs and theirs != protocol_hash:
            return False, _protocol_reason(against, theirs, protocol_hash, _FIX), None
        return False, (f"no per-problem records of champion v{against} to pair with; kept "
                       f"the champion ({_FIX})"), None
    ours, theirs = _protocols(records), _protocols(champion_records)
    if ours and theirs and ours != theirs:
        return False, _protocol_reason(against, ",".join(sorted(theirs)),
                                       ",".join(sorted(ours)), _FIX), None
    from grpo_core.eval.evaluation import vote_key  # maj@k votes as the evaluation did

    try:
        d = paired_delta(list(records), list(champion_records), metric, canon=vote_key, **ci_kw)
    except ValueError as exc:
        return False, (f"no paired comparison with champion v{against}: {exc}; kept the "
                       f"champion"), None
    promoted = d["lo"] > 0
    return promoted, (f"challenger v{version} - champion v{against} {metric}: paired delta "
                      f"{ci_text(d['delta'], d['lo'], d['hi'], '+')} over {d['n']} problems, "
                      f"CI lower bound {'>' if promoted else '<='} 0"), d


def triplet(source: Mapping[str, Any], metric: str) -> tuple[float | None, float | None, float | None]:
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


def _unpaired(against: str, tags: Mapping, version: str, metric: str, mine: tuple,
              champion_metrics, protocol_hash: str | None) -> tuple[bool, str]:
    if champion_metrics is not None:
        cv, clo, chi = triplet(champion_metrics, metric)
        champ_protocol = None  # numbers supplied by the caller, under today's protocol
    else:
        cv, clo, chi = triplet(tags, metric)
        champ_protocol = tags.get("grpo.protocol_hash")
    if cv is None:
        return False, (f"champion v{against} has no recorded {metric}; kept it (pass "
                       f"champion_metrics from a re-evaluation to compare)")
    if protocol_hash and champ_protocol and champ_protocol != protocol_hash:
        return False, _protocol_reason(against, champ_protocol, protocol_hash,
                                       "re-evaluate it and pass champion_metrics")
    bar = chi if chi is not None else cv
    promoted = mine[0] > bar
    return promoted, (f"challenger v{version} {metric} {ci_text(*mine)} "
                      f"{'>' if promoted else '<='} champion v{against} "
                      f"{'upper CI ' if chi is not None else ''}{bar:.3f} "
                      f"(champion {ci_text(cv, clo, chi)})")


def metric_tags(metric: str, value: float, ci_lo: float | None, ci_hi: float | None,
                protocol_hash: str | None, eval_run_id: str | None = None) -> dict[str, str]:
    """The challenger's number on its version, for the next challenger to be judged by."""
    m = sanitize_key(metric)
    tags = {"grpo.metric": metric, f"grpo.{m}": repr(float(value))}
    if ci_lo is not None:
        tags[f"grpo.{m}.ci_lo"] = repr(float(ci_lo))
    if ci_hi is not None:
        tags[f"grpo.{m}.ci_hi"] = repr(float(ci_hi))
    if protocol_hash:
        tags["grpo.protocol_hash"] = protocol_hash
    if eval_run_id:  # where the next challenger finds this version's per-problem records
        tags["grpo.eval_run_id"] = eval_run_id
    return tags


def decision_tags(d: Decision, metric: str) -> dict[str, str]:
    tags = {"grpo.decision": "promoted" if d.promoted else "rejected",
            "grpo.decision_reason": d.reason, "grpo.compared_with": d.against or "none (first version)",
            "grpo.decision_rule": d.rule}
    if d.paired:
        tags.update({"grpo.paired_metric": metric, "grpo.paired_delta": repr(d.paired["delta"]),
                     "grpo.paired_delta.ci_lo": repr(d.paired["lo"]),
                     "grpo.paired_delta.ci_hi": repr(d.paired["hi"]),
                     "grpo.paired_n": str(d.paired["n"])})
    return tags
