"""Data lineage: which problems each stage consumed, in the store's `lineage` table.

Each training or filtering stage records, under its cache key, the problem ids it read by
role (sft_example with its epochs, filter_candidate, filter_kept, grpo_prompt with the
groups it trained, probe_trained / probe_unseen) and the model fingerprints it went from
and to. A model's lineage is one recursive query back through model_out -> model_in
(`lineage_of`); `overlaps` says which of those stages shared problems, the check that no
stage trained on what an earlier one had (grpo_core/data/stage_split.py)."""
from __future__ import annotations

from grpo_core.data.db import connection, dicts, ensure_tables, has_table, now, transaction

ROLES = ("sft_example", "filter_candidate", "filter_kept", "grpo_prompt", "probe_trained",
         "probe_unseen")
TRAINING_ROLES = ("sft_example", "grpo_prompt")


def record_lineage(con, *, stage_key: str, stage: str, round_no: int | None,
                   config_hash: str, recipe: str, model_in: str, model_out: str | None,
                   uses: dict[str, dict[str, float]]) -> int:
    """Replace what stage `stage_key` consumed: `uses` is role -> {problem id: uses}.
    Idempotent (a cached stage recorded again writes the same rows). Returns rows written."""
    import pyarrow as pa

    unknown = set(uses) - set(ROLES)
    if unknown:
        raise ValueError(f"lineage roles {sorted(unknown)}: not one of {ROLES}")
    rows = [(role, pid, float(n)) for role, ids in uses.items() for pid, n in ids.items()]
    table = pa.table({"role": [r[0] for r in rows], "problem_id": [r[1] for r in rows],
                      "uses": pa.array([r[2] for r in rows], pa.float64())})
    con = ensure_tables(con)
    with transaction(con, _lineage_new=table):
        con.execute("DELETE FROM lineage WHERE stage_key = ?", [stage_key])
        con.execute("INSERT INTO lineage SELECT ?, ?, ?, ?, ?, ?, ?, role, problem_id, uses, ? "
                    "FROM _lineage_new",
                    [stage_key, stage, round_no, config_hash, recipe, model_in, model_out, now()])
    return len(rows)


_CHAIN = """
WITH RECURSIVE chain(model) AS (
    SELECT ?::VARCHAR
    UNION SELECT l.model_in FROM lineage l JOIN chain c ON l.model_out = c.model
    WHERE l.model_in IS NOT NULL)
"""


def lineage_of(con, model_fp: str) -> list[dict]:
    """Per stage that led to model `model_fp` (its training stages back to the base, and
    the filters and probes run on the models between), per role: problems and total uses.
    One query."""
    con = connection(con)
    if not has_table(con, "lineage"):
        return []
    return dicts(con.execute(
        _CHAIN + "SELECT l.stage, l.round, l.role, count(DISTINCT l.problem_id) AS problems, sum(l.uses) AS uses, "
        "any_value(l.recipe) AS recipe, any_value(l.model_in) AS model_in, "
        "any_value(l.model_out) AS model_out "
        "FROM lineage l WHERE l.model_in IN (SELECT model FROM chain) "
        "OR l.model_out IN (SELECT model FROM chain) "
        "GROUP BY l.stage, l.round, l.role ORDER BY min(l.created_at), l.stage, l.role",
        [model_fp]))


def overlaps(con, model_fp: str) -> list[dict]:
    """Pairs of training stages in model `model_fp`'s lineage that share problems (SFT
    examples vs a round's GRPO prompts, one round's prompts vs another's), with the count:
    empty when every stage trained on problems no earlier stage saw."""
    con = connection(con)
    if not has_table(con, "lineage"):
        return []
    roles = ", ".join(f"'{r}'" for r in TRAINING_ROLES)
    return dicts(con.execute(
        _CHAIN + f", trained AS (SELECT DISTINCT stage, round, problem_id FROM lineage "
        f"WHERE role IN ({roles}) AND model_out IN (SELECT model FROM chain)) "
        "SELECT a.stage AS stage_a, a.round AS round_a, b.stage AS stage_b, "
        "b.round AS round_b, count(*) AS shared FROM trained a JOIN trained b "
        "ON a.problem_id = b.problem_id AND (a.stage, coalesce(a.round, 0)) < "
        "(b.stage, coalesce(b.round, 0)) GROUP BY ALL ORDER BY ALL", [model_fp]))


def stage_ids(con, stage_key: str, role: str) -> list[str]:
    """The problem ids stage `stage_key` recorded under `role`, most used first."""
    return [r[0] for r in connection(con).execute(
        "SELECT problem_id FROM lineage WHERE stage_key = ? AND role = ? "
        "ORDER BY uses DESC, problem_id", [stage_key, role]).fetchall()]


def latest_models(con) -> list[tuple[str, str]]:
    """(recipe, model fingerprint) of the newest model each recipe's training stages made."""
    con = connection(con)
    if not has_table(con, "lineage"):
        return []
    return [tuple(r) for r in con.execute(
        "SELECT recipe, arg_max(model_out, created_at) FROM lineage WHERE model_out IS NOT NULL "
        "GROUP BY recipe ORDER BY recipe").fetchall()]
