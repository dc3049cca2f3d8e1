"""Rollouts as evidence: a GRPO round's own completions inform the next round's filter.

    priors = rollout_priors(store, run_id, problems, cfg)   # problem key -> Evidence
    report = filter_problems(..., priors=priors)

The round's rollouts (the `rollouts` table, one row per completion, written by its run)
were drawn from the policy while it trained, from the round's input towards its output;
the next filter estimates pass rates under the output. They are evidence about the same
problem under a nearby policy, so they count, weighted down, as pseudo-counts:

    problem p with n_r rollouts of which c_r correct, weight w = filter.rollout_evidence_weight
    n0 = min(w * n_r, k / 2)        pseudo-samples (never more than half of k)
    s0 = n0 * c_r / n_r             pseudo-successes (the rollouts' own rate)
    pass rate = (s + s0) / (n + n0), Wilson interval on the same sums (fractional counts)

where s of n are the fresh samples. The fresh budget is k - floor(n0) (the prior stands
for that many samples; at least half of k stays fresh), and with filter.adaptive the
stop rule tests the sums, so a problem the round kept solving (or failing) leaves the
band after fewer fresh samples. w = 0 turns it off (the default); w = 1 would trust a
rollout as much as a fresh sample of the new policy, which the policy change makes
optimistic. "Correct" is the accuracy reward the round gave the completion (the
verifier's 1/0 on the strict answer, as the filter scores), else the completion is
scored again against the stored gold.

An estimate stores the prior it used (prior_successes, prior_samples), and is reused
only under the same prior.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from grpo_core.data.db import connection, dicts, has_table
from grpo_core.data.problems import Problem
from grpo_core.data.records import problem_key
from grpo_core.eval.adaptive import NO_EVIDENCE, Evidence
from grpo_core.verify.answers import verify
from grpo_core.verify.extraction import extract_answer
from grpo_core.verify.gold import parse_gold


def rollout_counts(con_or_store: Any, run_id: str) -> dict[str, tuple[int, int]]:
    """(correct, total) completions per rollout problem_id of one GRPO round's run;
    completions that cannot be scored (gold unparsable) are left out."""
    con = connection(con_or_store)
    if not has_table(con, "rollouts"):
        return {}
    rows = dicts(con.execute(
        "SELECT problem_id, completion, answer, rewards FROM rollouts "
        "WHERE run_id = ? AND problem_id IS NOT NULL ORDER BY step, idx", [run_id]))
    out: dict[str, list[int]] = {}
    for r in rows:
        ok = _correct(r)
        if ok is None:
            continue
        c = out.setdefault(r["problem_id"], [0, 0])
        c[0] += ok
        c[1] += 1
    return {pid: (c[0], c[1]) for pid, c in out.items()}


def _correct(row: dict) -> bool | None:
    acc = (json.loads(row["rewards"]) if row["rewards"] else {}).get("accuracy")
    if isinstance(acc, (int, float)) and math.isfinite(acc):
        return acc > 0.5
    gold = parse_gold(row["answer"]) if row["answer"] is not None else None
    if gold is None:
        return None
    return bool(verify(gold, extract_answer(row["completion"] or "")))


def priors_from_counts(counts: dict[str, tuple[int, int]], problems: list[Problem],
                       weight: float, k: int) -> dict[str, Evidence]:
    """The rule of the module doc: problem key -> Evidence, for the problems with
    rollouts (`counts` keyed by the rollouts' problem_id, the problem's id)."""
    if weight <= 0:
        return {}
    out = {}
    for p in problems:
        correct, total = counts.get(p.id, (0, 0)) if p.id is not None else (0, 0)
        if total == 0:
            continue
        n0 = min(weight * total, k / 2)
        out[problem_key(p)] = Evidence(n0 * correct / total, n0)
    return out


def rollout_priors(con_or_store: Any, run_id: str | None, problems: list[Problem],
                   cfg) -> dict[str, Evidence]:
    """The priors the filter of `problems` draws from run `run_id`'s rollouts under
    cfg.filter (rollout_evidence_weight, k); empty when off or without a run."""
    w = cfg.filter.rollout_evidence_weight
    if not run_id or w <= 0 or con_or_store is None:
        return {}
    return priors_from_counts(rollout_counts(con_or_store, run_id), problems, w,
                              cfg.filter.k)


def prior_of(priors: dict[str, Evidence] | None, key: str) -> Evidence:
    return (priors or {}).get(key, NO_EVIDENCE)


def evidence_fingerprint(priors: dict[str, Evidence] | None) -> str | None:
    """A digest of the priors (None when there are none): part of the filter's cache key."""
    if not priors:
        return None
    blob = json.dumps(sorted((k, round(e.successes, 12), round(e.samples, 12))
                             for k, e in priors.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
