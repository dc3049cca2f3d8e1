"""Issue #5, bad data: every kind of broken source, one table, through the ingest API and
through `grpo data ingest`.

For each case a real DuckDB store, already holding a training source (with a quarantined
row of its own) and an eval set (which flags one of the training rows as contaminated), is
snapshotted; then the bad file is ingested exactly as the CLI does it (resolve_source, then
Store.ingest) and once more through the CLI. Each case ends one of four ways:

- quarantined: the good rows are ingested, each bad row is quarantined with a reason code,
  and the report and the quarantine row name the file (the ingest's origin) and the row;
- all_invalid: the same, nothing ingested; the CLI exits 1 naming the file and the reasons;
- empty: nothing to ingest, nothing written; the CLI exits 1 naming the file;
- refused: SourceError (exit 2: usage, e.g. a mapping to a missing column) or
  SourceUnreadable (exit 1: a corrupt file), one line naming the file (and the column);
- accepted: an encoding the readers decode (a BOM says which): every row ingested intact.
Whatever the outcome, no row that was in the store before is lost or altered.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.data.adapters import resolve_source
from grpo_core.data.readers import SourceUnreadable
from grpo_core.data.source import SourceError
from grpo_core.data.store import Store

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TABLES = ("problems", "quarantine", "ingest_log")
GOOD = [{"problem": f"What is {i} plus {i}? Give the sum as a whole number please.",
         "answer": str(2 * i)} for i in range(1, 6)]
OK = [{"problem": "Ann has 3 boxes of 4 pens each. How many pens does she have?",
       "answer": "12"},
      {"problem": "A train covers 60 km in 1.5 hours. What is its speed in km per hour?",
       "answer": "40"}]


def _jsonl(*rows: dict | bytes) -> bytes:
    """JSON lines; bytes rows go in as they are (broken lines, foreign encodings)."""
    return b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in rows)


def _text_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _csv_text(rows: list[dict]) -> str:
    return "problem,answer\n" + "".join(f"\"{r['problem']}\",{r['answer']}\n" for r in rows)


def _parquet(**columns: list) -> Callable[[Path], None]:
    return lambda path: pq.write_table(pa.table(columns), path)


@dataclass(frozen=True)
class Case:
    file: str  # the bad source's file name (its stem is the source name)
    content: bytes | Callable[[Path], None]
    outcome: str  # quarantined | all_invalid | empty | refused | accepted
    rows: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (code, words)
    ingested: int = 0
    columns: str | None = None  # --columns
    words: tuple[str, ...] = ()  # in a refusal, besides the file's path
    exit_code: int = 0  # of `grpo data ingest`


CASES = {
    "malformed_json_line": Case(
        "malformed.jsonl", _jsonl(OK[0], b'{"problem": "broken", "answer": \n', OK[1]),
        "quarantined", {1: ("malformed_json", "line 2: Expecting value")}, ingested=2),
    "truncated_last_line": Case(
        "truncated.jsonl", _jsonl(OK[0], b'{"problem": "What is 6 times 7?", "ans'),
        "quarantined", {1: ("malformed_json", "line 2: Unterminated string")}, ingested=1),
    "latin1_bytes_in_utf8": Case(
        "latin1.jsonl",
        _jsonl(OK[0], b'{"problem": "Caf\xe9 au lait costs 3. What do two cost?", '
                      b'"answer": "6"}\n', OK[1]),
        "quarantined", {1: ("undecodable", "problem: invalid UTF-8 byte 0xE9")}, ingested=2),
    "utf16_jsonl_with_bom": Case(
        "utf16.jsonl", _text_jsonl(OK).encode("utf-16"), "accepted", ingested=2),
    "utf16_csv_with_bom": Case(
        "utf16.csv", _csv_text(OK).encode("utf-16"), "accepted", ingested=2),
    "utf8_csv_with_bom": Case(  # Excel's "CSV UTF-8"
        "excel.csv", b"\xef\xbb\xbf" + _csv_text(OK).encode(), "accepted", ingested=2),
    "utf16_without_bom": Case(  # nothing says UTF-16: every line is garbage, none is taken
        "utf16le.jsonl", _text_jsonl(OK).encode("utf-16-le"), "all_invalid",
        {0: ("malformed_json", "line 1"), 1: ("malformed_json", "line 2"),
         2: ("malformed_json", "line 3")}, exit_code=1),
    "mixed_bad_rows": Case(
        "mixed.jsonl",
        _jsonl(OK[0],
               {"problem": "What is 5 squared?", "answer": [25]},
               {"problem": "Name the number of sides of a square.", "answer": {"value": 4}},
               {"problem": "Is 4 an even number?", "answer": True},
               {"problem": "What is 9 minus 4?"},
               {"answer": "3"},
               {"problem": "   ", "answer": "2"},
               {"problem": "What is 1\x00 plus 1?", "answer": "2"},  # JSON-escaped NUL
               b'{"problem": "What is 2\x00 plus 2?", "answer": "4"}\n',  # a raw NUL byte
               b'{"problem": "What is 0 divided by 0?", "answer": NaN}\n',
               {"problem": "Simplify the fraction.", "answer": "\\frac{"},
               OK[1]),
        "quarantined",
        {1: ("wrong_type", "answer is list, not text"),
         2: ("wrong_type", "answer is dict, not text"),
         3: ("wrong_type", "answer is bool, not text"),
         4: ("missing_answer", "no answer"),
         5: ("missing_problem", "no problem text"),
         6: ("empty_problem", "no problem text"),
         7: ("undecodable", "problem: NUL byte"),
         8: ("malformed_json", "line 9: Invalid control character"),
         9: ("missing_answer", "no answer"),
         10: ("unparseable_answer", "does not parse")}, ingested=2),
    "empty_jsonl": Case("empty.jsonl", b"", "empty", words=("no rows (empty source)",),
                        exit_code=1),
    "blank_lines_only": Case("blank.jsonl", b"\n  \n\t\r\n", "empty",
                             words=("no rows (empty source)",), exit_code=1),
    "csv_header_only": Case("header.csv", b"problem,answer\n", "empty",
                            words=("no rows (empty source)",), exit_code=1),
    "every_row_invalid": Case(
        "invalid.jsonl",
        _jsonl({"problem": "", "answer": "1"}, b"not json\n", {"question": "Q?"},
               {"problem": "What is 3 plus 3?", "answer": None}),
        "all_invalid",
        {0: ("empty_problem", "no problem text"), 1: ("malformed_json", "line 2"),
         2: ("missing_answer", "no answer"), 3: ("missing_answer", "no answer")},
        exit_code=1),
    "csv_mapping_to_missing_column": Case(
        "mapped.csv", b"q,a\nWhat is 2 plus 2?,4\n", "refused",
        columns="problem=question,answer=a",
        words=("column 'question' (mapped to problem) not found", "columns: a, q"), exit_code=2),
    "parquet_list_answers": Case(
        "lists.parquet", _parquet(problem=[OK[0]["problem"], OK[1]["problem"]],
                                  answer=[[12], [40]]),
        "all_invalid", {0: ("wrong_type", "answer is list"), 1: ("wrong_type", "answer is list")},
        exit_code=1),
    "parquet_int_problems": Case(
        "ints.parquet", _parquet(problem=[7, 8], answer=["7", "8"]),
        "all_invalid", {0: ("wrong_type", "problem is int"), 1: ("wrong_type", "problem is int")},
        exit_code=1),
    "parquet_corrupt": Case("corrupt.parquet", b"PAR1 this is not parquet", "refused",
                            words=("not a readable Parquet file",), exit_code=1),
    "json_document_cut_short": Case(
        "doc.json", b'{"data": [{"problem": "What is 2 plus 2?", "answer": "4"}, {"pro',
        "refused", words=("not valid JSON",), exit_code=1),
}


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory) -> Path:
    """A store file holding a training source (5 rows, 1 quarantined row) and an eval set
    whose problem flags one training row as contaminated; copied for each case."""
    root = tmp_path_factory.mktemp("seed")
    train = root / "good.jsonl"
    train.write_bytes(_jsonl(*GOOD, b"{not json\n"))
    (root / "bench").mkdir()
    evals = root / "bench" / "test.jsonl"  # source "bench", split "test": an eval set
    evals.write_bytes(_jsonl({"problem": GOOD[0]["problem"], "answer": GOOD[0]["answer"]}))
    db = root / "seed.duckdb"
    with Store.open(db) as store:
        assert store.ingest(resolve_source(str(train))).ingested == 5
        assert store.ingest(resolve_source(str(evals))).flagged_existing == 1
        assert len(store.quarantined("good")) == 1  # flag and quarantine row: kept by each case
    return db


def _snapshot(store: Store) -> dict[str, Counter]:
    """Every row of every table, with the index of its `source` column."""
    out = {}
    for table in TABLES:
        cur = store.con.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        out[table] = (names.index("source"), Counter(cur.fetchall()))
    return out


def _assert_nothing_lost_or_altered(before: dict, after: dict, bad_source: str) -> None:
    for table in TABLES:
        col, rows = before[table]
        _, now = after[table]
        assert not rows - now, f"{table}: rows lost or altered: {list(rows - now)[:3]}"
        added = {r[col] for r in now - rows}
        assert added <= {bad_source}, f"{table}: rows of other sources added: {added}"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["data", "ingest", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_source_is_quarantined_or_refused_and_the_store_keeps_its_rows(
        case: Case, seeded_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    shutil.copy(seeded_db, db)
    path = tmp_path / case.file
    if callable(case.content):
        case.content(path)
    else:
        path.write_bytes(case.content)
    source = path.stem
    codes = Counter(code for code, _ in case.rows.values())

    # 1. The API, as `grpo data ingest` calls it.
    with Store.open(db) as store:
        before = _snapshot(store)
        if case.outcome == "refused":
            with pytest.raises((SourceError, SourceUnreadable)) as err:
                store.ingest(resolve_source(str(path), columns=case.columns))
            msg = str(err.value)
            assert str(path) in msg and "\n" not in msg, msg
            assert all(w in msg for w in case.words), msg
            assert isinstance(err.value, SourceError) == (case.exit_code == 2)
        else:
            report = store.ingest(resolve_source(str(path), columns=case.columns))
            assert report.origin == str(path) and report.source == source
            assert report.ingested == case.ingested, report
            assert report.quarantined == dict(codes), report
            assert report.all_invalid == (case.outcome == "all_invalid")
            assert report.total_rows == case.ingested + sum(codes.values())
            expected = [f"row {i}: {code}: " for i, (code, _) in sorted(case.rows.items())]
            assert [r[: len(e)] for r, e in zip(report.first_reasons, expected)] == expected[:5]
            stored = store.problems(source, exclude_contaminated=False)
            assert len(stored) == case.ingested
            if case.outcome == "accepted":  # decoded right: the text is what was written
                assert [(p.problem, p.answer) for p in stored] == [
                    (r["problem"], r["answer"]) for r in OK]
            # Each quarantine row: its row, its reason, and (via its ingest) the file.
            q = store.con.execute(
                "SELECT q.row_index, q.code, q.reason, l.origin FROM quarantine q JOIN "
                "ingest_log l USING (ingest_id) WHERE q.source = ? ORDER BY q.row_index",
                [source]).fetchall()
            assert [(i, code) for i, code, _, _ in q] == [
                (i, code) for i, (code, _) in sorted(case.rows.items())]
            for i, code, reason, origin in q:
                assert origin == str(path) and reason.startswith(f"{code}: ")
                assert case.rows[i][1] in reason, (i, reason)
            logged = store.con.execute(
                "SELECT count(*) FROM ingest_log WHERE origin = ?", [str(path)]).fetchone()[0]
            assert logged == (0 if case.outcome == "empty" else 1)
        _assert_nothing_lost_or_altered(before, _snapshot(store), source)

    # 2. The CLI on the same store: exit code and a one-line error naming the file.
    args = [str(path), "--db", str(db)] + (["--columns", case.columns] if case.columns else [])
    code, out = _cli(*args)
    assert code == case.exit_code, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    if case.exit_code == 0:
        assert not errors and f"from {path}: " in out, out
        for i, (reason_code, _) in sorted(case.rows.items())[:5]:
            assert f"quarantined row {i}: {reason_code}: " in out, out
    else:
        assert len(errors) == 1 and errors[0].startswith(f"error: {path}: "), out
        if case.outcome in ("refused", "empty"):
            assert out.strip() == errors[0], out  # the error is all that is printed
            assert all(w in errors[0] for w in case.words), out
        else:  # all_invalid: the counts, then why
            n = sum(codes.values())
            assert f"all {n} rows invalid, nothing ingested; first reasons: row 0: " in out
    with Store.open(db, read_only=True) as store:
        _assert_nothing_lost_or_altered(before, _snapshot(store), source)
