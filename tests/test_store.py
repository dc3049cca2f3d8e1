"""The DuckDB problem store: validation, quarantine, dedup, transactions, locks, and the
whole of shared/data ingested with every row accounted for."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from grpo_core.data import store as store_module
from grpo_core.data.adapters import resolve_source
from grpo_core.data.problems import Problem
from grpo_core.data.store import Store, StoreError, StoreLockedError
from grpo_core.data.validation import IngestReport, check_text, undecodable
from grpo_core.verify import answers  # noqa: F401 - the ingest parses golds

SHARED = [("gsm8k", "train", "gsm8k/train.jsonl"), ("math", "train", "math/train4500.jsonl"),
          ("gsm8k", "test", "gsm8k/test.jsonl"), ("math500", "test", "math500/test.jsonl"),
          ("aime24", "test", "aime24/test.jsonl"), ("aime25", "test", "aime25/test.jsonl"),
          ("amc23", "test", "amc23/test.jsonl")]
GOOD = [{"problem": f"What is {i} plus {i}? Give the sum as a whole number please.",
         "answer": str(2 * i)} for i in range(1, 6)]


def _jsonl(path, rows):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n"
                              for r in rows))
    return str(path)


def _snapshot(store: Store) -> dict:
    return {t: store.con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
            for t in ("problems", "quarantine", "ingest_log")}


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "store.duckdb") as s:
        yield s


# --------------------------------------------------------------------------- shared/data


@pytest.fixture(scope="module")
def shared_store(shared_data, tmp_path_factory):
    """All of shared/data ingested: training sets first, eval sets after (so eval ingests
    flag earlier training rows), timed."""
    path = tmp_path_factory.mktemp("shared") / "store.duckdb"
    reports: dict[tuple[str, str], IngestReport] = {}
    t0 = time.perf_counter()
    with Store.open(path) as store:
        for name, split, _ in SHARED:
            reports[name, split] = store.ingest(
                resolve_source(name, split=split, data_dir=shared_data))
        seconds = time.perf_counter() - t0
        print(f"\ningested all of shared/data in {seconds:.1f}s")
        for (name, split), r in reports.items():
            print(f"  {name}/{split}: total {r.total_rows} ingested {r.ingested} "
                  f"duplicates {r.duplicates} quarantined {r.quarantined} "
                  f"contaminated {r.contaminated} flagged_existing {r.flagged_existing} "
                  f"repaired {r.repaired}")
        yield store, reports


def test_every_shared_row_is_accounted_for(shared_data, shared_store):
    store, reports = shared_store
    for name, split, rel in SHARED:
        lines = sum(1 for line in (shared_data / rel).open(encoding="utf-8") if line.strip())
        r = reports[name, split]
        stored = store.con.execute("SELECT count(*) FROM problems WHERE source = ? AND "
                                   "split = ?", [name, split]).fetchone()[0]
        quarantined = len(store.quarantined(name, split))
        assert r.total_rows == lines, rel
        assert r.ingested + r.quarantined_total + r.duplicates == lines, rel
        assert (stored, quarantined) == (r.ingested, r.quarantined_total), rel
        assert stored + quarantined + r.duplicates == lines, rel


def test_shared_counts_as_measured(shared_store):
    store, reports = shared_store
    got = {k: (r.ingested, r.quarantined_total, r.duplicates) for k, r in reports.items()}
    print("\n(ingested, quarantined, duplicates):", got)
    # Measured on shared/data (no exact duplicates in any file).
    assert got == MEASURED
    assert reports["aime25", "test"].repaired == 2  # "\frac" written as form feed + "rac"
    assert all("\x0c" not in p.problem for p in store.problems("aime25", "test"))


MEASURED = {("gsm8k", "train"): (7473, 0, 0), ("math", "train"): (4500, 0, 0),
            ("gsm8k", "test"): (1319, 0, 0), ("math500", "test"): (500, 0, 0),
            ("aime24", "test"): (30, 0, 0), ("aime25", "test"): (30, 0, 0),
            ("amc23", "test"): (40, 0, 0)}


def test_shared_contamination(shared_store):
    store, _ = shared_store
    contamination = store.contamination()
    print("\ncontamination (train source/split -> eval set -> rows):", contamination)
    assert contamination.get(("math", "train"), {}).get("math500/test", 0) == 0
    gsm_overlap = contamination.get(("gsm8k", "train"), {}).get("gsm8k/test", 0)
    print(f"GSM8K train/test overlap: {gsm_overlap}")
    assert gsm_overlap == 0  # measured: no train problem reproduces a test problem
    assert contamination == {}
    assert store.decontaminate() == {}  # a full recompute agrees with the incremental flags


def test_reingest_adds_nothing(shared_data, shared_store):
    store, _ = shared_store
    before = _snapshot(store)
    r = store.ingest(resolve_source("gsm8k", split="test", data_dir=shared_data))
    assert (r.ingested, r.duplicates, r.already_stored, r.quarantined_total) == (0, 1319, 1319, 0)
    after = _snapshot(store)
    assert after["problems"] == before["problems"]
    assert after["quarantine"] == before["quarantine"]
    assert len(after["ingest_log"]) == len(before["ingest_log"]) + 1


def test_stats_per_source(shared_store):
    store, _ = shared_store
    stats = {(r["source"], r["split"]): r for r in store.stats()}
    assert stats["math500", "test"]["role"] == "eval" and stats["math", "train"]["role"] == "train"
    assert stats["gsm8k", "train"]["problems"] == 7473


# --------------------------------------------------------------------------- bad data


def test_bad_rows_are_quarantined_with_reasons(store, tmp_path):
    rows = [
        {"problem": "What is one plus one?", "answer": "2"},  # 0 ok
        b'{"problem": "broken", "answer": \n',  # 1 malformed JSON
        b'{"problem": "Caf\xe9 au lait costs 3, what is twice that?", "answer": "6"}\n',  # latin-1
        {"problem": "nul\x00byte?", "answer": "1"},  # 3
        {"problem": "I donâ€™t know: what is 2+2?", "answer": "4"},  # 4 mojibake
        {"problem": "", "answer": "1"},  # 5
        {"problem": "What is x?", "answer": "\\frac{"},  # 6 unparseable gold
        {"problem": "x" * 25000, "answer": "1"},  # 7 absurd length
        {"problem": "What is one plus one?", "answer": "2"},  # 8 duplicate of 0
        {"problem": 12345, "answer": "1"},  # 9 wrong type
        {"problem": "Compute \x0crac{1}{2} + \x0crac{1}{2}.", "answer": "1"},  # 10 repaired
        {"problem": "Bad \ufffd replacement?", "answer": "1"},  # 11
    ]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    r = store.ingest(resolve_source(path))
    assert (r.total_rows, r.ingested, r.duplicates, r.repaired) == (12, 2, 1, 1)
    assert r.quarantined == {"malformed_json": 1, "undecodable": 4, "empty_problem": 1,
                             "unparseable_answer": 1, "too_long": 1, "wrong_type": 1}
    q = {row["row_index"]: row for row in store.quarantined("bad", "train")}
    assert sorted(q) == [1, 2, 3, 4, 5, 6, 7, 9, 11]
    assert q[1]["reason"].startswith("malformed_json: line 2")
    assert "invalid UTF-8 byte 0xE9" in q[2]["reason"] and "mojibake" in q[4]["reason"]
    assert "NUL" in q[3]["reason"] and "too_long: problem is 25000 chars" in q[7]["reason"]
    assert json.loads(q[9]["raw"]) == {"problem": 12345, "answer": "1"}
    assert "broken" in json.loads(q[1]["raw"])["line"]
    assert r.first_reasons[0] == q[1]["reason"].join(["row 1: ", ""])
    fixed = next(p for p in store.problems("bad") if "rac" in p.problem)
    assert fixed.problem == "Compute \\frac{1}{2} + \\frac{1}{2}."


def test_csv_and_parquet_bad_rows(store, tmp_path):
    csv_path = tmp_path / "mixed.csv"
    csv_path.write_bytes(b"problem,answer\nWhat is 2 times 3?,6\n"
                         b"Caf\xe9 bill is 4; what is double?,8\n,5\n")
    r = store.ingest(resolve_source(str(csv_path)))
    assert (r.ingested, r.quarantined) == (1, {"undecodable": 1, "empty_problem": 1})
    again = store.ingest(resolve_source(str(csv_path)))
    assert (again.ingested, again.duplicates, again.quarantined_total) == (0, 1, 2)
    assert len(store.quarantined("mixed")) == 2  # a re-ingest does not repeat quarantine rows
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq_path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"problem": ["What is 5 minus 2?", None], "answer": [3, 4]}), pq_path)
    r = store.ingest(resolve_source(str(pq_path)))
    assert (r.ingested, r.quarantined) == (1, {"missing_problem": 1})
    assert store.problems("cols")[0].answer == "3"


def test_nothing_in_the_store_is_lost_or_altered(store, tmp_path):
    store.ingest(resolve_source(_jsonl(tmp_path / "good.jsonl", GOOD)))
    before = _snapshot(store)
    invalid = _jsonl(tmp_path / "invalid.jsonl", [{"problem": "", "answer": "1"},
                                                   b"not json\n", {"question": "q"}])
    r = store.ingest(resolve_source(invalid))
    assert r.all_invalid and r.ingested == 0 and r.quarantined_total == 3
    empty = store.ingest(resolve_source(_jsonl(tmp_path / "empty.jsonl", [])))
    assert empty.total_rows == 0
    after = _snapshot(store)
    assert after["problems"] == before["problems"]
    assert [row for row in after["quarantine"] if row[0] == "good"] == []
    assert all(row in after["ingest_log"] for row in before["ingest_log"])


def test_failed_ingest_rolls_back(store, tmp_path, monkeypatch):
    store.ingest(resolve_source(_jsonl(tmp_path / "good.jsonl", GOOD)))
    before = _snapshot(store)

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store_module, "contaminated_rows", boom)
    more = _jsonl(tmp_path / "more.jsonl", [{"problem": "Brand new: what is 9 times 9?",
                                             "answer": "81"}, b"{bad\n"])
    with pytest.raises(RuntimeError, match="disk on fire"):
        store.ingest(resolve_source(more))
    assert _snapshot(store) == before
    monkeypatch.undo()
    assert store.ingest(resolve_source(more)).ingested == 1  # and the store still works


def test_duplicates_within_a_source_and_across_splits(store, tmp_path):
    path = _jsonl(tmp_path / "dups.jsonl", GOOD + GOOD[:2] + [
        {"problem": GOOD[0]["problem"].upper() + "  ", "answer": "2"}])  # same after normalising
    r = store.ingest(resolve_source(path))
    assert (r.ingested, r.duplicates, r.already_stored) == (5, 3, 0)
    # The same rows as another split are kept there (and flagged, that split being an eval set).
    r2 = store.ingest(resolve_source(path, split="test"))
    assert (r2.ingested, r2.duplicates, r2.flagged_existing) == (5, 3, 5)
    assert store.problems("dups", "train") == []
    assert len(store.problems("dups", "train", exclude_contaminated=False)) == 5


# --------------------------------------------------------------------------- contamination


def test_training_rows_overlapping_eval_sets_are_flagged(store, tmp_path):
    eval_text = ("A regular hexagon is inscribed in a circle of radius 2. What is the area of "
                 "the hexagon, in simplest radical form?")
    store.ingest(resolve_source(_jsonl(tmp_path / "evalset.jsonl",
                                       [{"problem": eval_text, "answer": "6\\sqrt{3}"}]),
                                split="eval"))
    train = _jsonl(tmp_path / "pool.jsonl", GOOD + [
        {"problem": "Warm up first. " + eval_text, "answer": "6\\sqrt{3}"}])
    r = store.ingest(resolve_source(train))
    assert (r.contaminated, r.contaminated_with) == (1, {"evalset/eval": 1})
    assert len(store.problems("pool")) == 5
    flagged = [p for p in store.problems("pool", exclude_contaminated=False)
               if "hexagon" in p.problem]
    assert len(flagged) == 1
    assert store.contamination() == {("pool", "train"): {"evalset/eval": 1}}
    assert {r["source"]: r["contaminated"] for r in store.stats()} == {"evalset": 0, "pool": 1}


# --------------------------------------------------------------------------- store file


def test_open_errors(tmp_path):
    with pytest.raises(StoreError, match="no store at"):
        Store.open(tmp_path / "absent.duckdb", read_only=True)
    (tmp_path / "junk.duckdb").write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="cannot open store"):
        Store.open(tmp_path / "junk.duckdb")


HOLD_LOCK = ("import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
             "print('ready', flush=True); time.sleep(60)")


def test_second_process_gets_a_clear_lock_error(tmp_path):
    path = tmp_path / "store.duckdb"
    Store.open(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError) as err:
            Store.open(path, timeout=0.5)
        assert time.monotonic() - t0 >= 0.5
        msg = str(err.value)
        assert f"store {path} is locked by another process (PID {holder.pid})" in msg
        assert "\n" not in msg
        with pytest.raises(StoreLockedError):
            Store.open(path, read_only=True)
    finally:
        holder.kill()
        holder.wait()
    with Store.open(path, read_only=True) as s:
        assert s.stats() == []


def test_text_checks():
    assert undecodable("naïve café, ½ cup, 因此 − x") is None
    assert "mojibake" in undecodable("cafÃ© au lait")
    p, repaired = check_text(Problem("s", "train", "Find \x08oxed{x}", "1"))
    assert repaired and p.problem == "Find \\boxed{x}"
    assert p.fingerprint == Problem("s", "train", "Find \\boxed{x}", "1").fingerprint
    assert check_text(Problem("s", "train", "tab\tand newline\n are fine", "1"))[1] is False
