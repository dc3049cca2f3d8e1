"""Decontamination as a join in DuckDB: the same test as grpo_core.data.decontam (word
n-grams of `normalise_text`, an eval problem covered at `min_coverage`), with no Python
loop over the training rows, so its time grows linearly with them at a million rows.

    flags = contaminated_rows(con, train_where, eval_where, n=8, min_coverage=0.95)

Every eval problem's n-gram hashes go into a temporary table (a few thousand problems);
each training row's n-gram hashes are computed in SQL, streamed through a hash join with
that table, and only the (row, eval problem) pairs sharing an n-gram are counted.

Normalisation: NFKC is the identity on ASCII, so an ASCII row is normalised in SQL (lower
case, Python's ASCII whitespace collapsed); any other row goes through `normalise_text`
itself, vectorised over Arrow batches. An n-gram's hash is DuckDB's hash of its words'
hashes (not Python's `hash`): flags equal `decontam.find_contaminated`'s up to 64-bit
collisions, and ties between eval sets go to the first label by name.
"""
from __future__ import annotations

import duckdb
import pyarrow as pa

from grpo_core.data.problems import normalise_text

_NORMALISE_UDF = "grpo_normalise_text"
# Python's str.split() on ASCII splits on these besides the space; each is replaced by a
# space (chained replace(): ~20x faster here than translate() or regexp_replace()).
_SPACE_CODES = (9, 10, 11, 12, 13, 28, 29, 30, 31)


def _word_hashes(col: str) -> str:
    """SQL list of the hashes of the words of `normalise_text(col)`: split in SQL for ASCII
    text (NFKC is the identity there), by the Python UDF otherwise."""
    ascii_text = "replace(" * len(_SPACE_CODES) + f"lower({col})" + "".join(
        f", chr({c}), ' ')" for c in _SPACE_CODES)
    text = (f"CASE WHEN strlen({col}) = length({col}) THEN {ascii_text} "
            f"ELSE {_NORMALISE_UDF}({col}) END")
    return (f"list_transform(list_filter(string_split({text}, ' '), lambda w: w <> ''), "
            f"lambda w: hash(w))")


def _grams(wh: str, n: int) -> str:
    """SQL list of the n-gram hashes of word hashes `wh` (the whole text when shorter)."""
    gram = ", ".join(f"{wh}[i + {k}]" for k in range(n))  # no list built per n-gram
    return (f"CASE WHEN len({wh}) = 0 THEN []::UBIGINT[] WHEN len({wh}) < {n} THEN "
            f"[hash({wh})] ELSE list_transform(range(1, len({wh}) - {n - 2}), "
            f"lambda i: hash({gram})) END")


def _register(con: duckdb.DuckDBPyConnection) -> None:
    try:
        # a native (row by row) UDF: an Arrow one imports pandas at its first call (~1 s)
        con.create_function(_NORMALISE_UDF, normalise_text, [duckdb.sqltype("VARCHAR")],
                            duckdb.sqltype("VARCHAR"), type="native", side_effects=False)
    except duckdb.Error as exc:  # registered by an earlier call on this connection
        if "already" not in str(exc).lower():
            raise


def contaminated_rows(con: duckdb.DuckDBPyConnection, train_where: str, eval_where: str,
                      params: list | None = None, n: int = 8,
                      min_coverage: float = 0.95) -> pa.Table:
    """(source, split, fingerprint, label) of the `problems` rows matching `train_where`
    that reproduce a row matching `eval_where` (label "source/split"). `params` fill the
    `?` of `train_where` then `eval_where`, in that order."""
    _register(con)
    params = list(params or [])
    n_train = train_where.count("?")
    train_params, eval_params = params[:n_train], params[n_train:]
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _eval_grams AS "
        f"WITH docs AS (SELECT row_number() OVER (ORDER BY source, split, fingerprint) AS doc,"
        f" source || '/' || split AS label, {_word_hashes('problem')} AS wh"
        f" FROM problems WHERE {eval_where}), "
        f"grams AS (SELECT DISTINCT doc, label, unnest({_grams('wh', n)}) AS h FROM docs) "
        f"SELECT h, doc, label, count(*) OVER (PARTITION BY doc) AS size FROM grams",
        eval_params)
    try:
        return con.sql(
            f"WITH words AS (SELECT source, split, fingerprint, "
            f"{_word_hashes('problem')} AS wh FROM problems WHERE {train_where}), "
            f"grams AS (SELECT source, split, fingerprint, unnest({_grams('wh', n)}) AS h"
            f" FROM words), "
            f"shared AS (SELECT DISTINCT g.source, g.split, g.fingerprint, e.doc, e.label, "
            f"e.size, g.h FROM grams g JOIN _eval_grams e USING (h)), "
            f"cover AS (SELECT source, split, fingerprint, label, count(*) / any_value(size)"
            f" AS cov FROM shared GROUP BY source, split, fingerprint, doc, label) "
            f"SELECT source, split, fingerprint, first(label ORDER BY cov DESC, label) AS label"
            f" FROM cover WHERE cov >= ? GROUP BY source, split, fingerprint",
            params=train_params + [min_coverage]).to_arrow_table()
    finally:
        con.execute("DROP TABLE IF EXISTS _eval_grams")
