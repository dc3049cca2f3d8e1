"""Ingest at scale (issue 25): near duplicates dropped, memory bounded by the batch and
not the source, hub datasets streamed. Real DuckDB files and real files written here."""
import json
import tracemalloc

from grpo_core.data.adapters import resolve_source
from grpo_core.data.store import Store


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_exact_and_near_duplicates_are_counted_and_dropped(tmp_path):
    """Near duplicate: the same problem after normalising (case, spacing, NFKC) with its
    gold written another way; the first occurrence is kept, in this ingest and across
    ingests of the same source split (a second file under the same name)."""
    rows = [{"problem": "What is 1/2 plus 0?", "answer": "1/2"},
            {"problem": "What is 1/2 plus 0?", "answer": "1/2"},  # exact
            {"problem": "WHAT  is 1/2\tplus 0?", "answer": "\\frac{1}{2}"},  # near
            {"problem": "What is 1/2 plus 0?", "answer": "0.5"},  # near
            {"problem": "What is １ plus 1?", "answer": "2"},  # full width one: NFKC
            {"problem": "What is 1 plus 1?", "answer": "two"},  # near, but its gold fails
            {"problem": "What is 3 plus 1?", "answer": "4"}]
    with Store.open(tmp_path / "s.duckdb") as store:
        r = store.ingest(resolve_source(_jsonl(tmp_path / "a.jsonl", rows), name="mine"),
                         batch_rows=2)  # duplicates found across batches too
        assert (r.ingested, r.duplicates, r.near_duplicates, r.already_stored) == (3, 4, 3, 0)
        kept = {(p.problem, p.answer) for p in store.problems("mine", "train")}
        assert kept == {("What is 1/2 plus 0?", "1/2"), ("What is １ plus 1?", "2"),
                        ("What is 3 plus 1?", "4")}
        more = [{"problem": "what is 3 plus 1?", "answer": "4.0"},  # near a stored row
                {"problem": "What is 3 plus 1?", "answer": "4"},  # exact, stored
                {"problem": "What is 5 plus 1?", "answer": "6"}]
        r2 = store.ingest(resolve_source(_jsonl(tmp_path / "b.jsonl", more), name="mine"))
        assert (r2.ingested, r2.duplicates, r2.near_duplicates, r2.already_stored) == \
            (1, 2, 1, 1)
        # another source keeps its own copies (the store holds sources, a pool picks
        # them), less its own near duplicate
        r3 = store.ingest(resolve_source(_jsonl(tmp_path / "c.jsonl", more), name="other"))
        assert (r3.ingested, r3.duplicates, r3.near_duplicates) == (2, 1, 1)


def test_ingest_memory_is_bounded_by_the_batch_not_the_source(tmp_path):
    """Python's peak memory while ingesting 30k rows within 1.3x (+256 KiB) of 3k rows', at
    the same batch size: nothing of the source or of the rows already written is kept
    (a set of the rows' fingerprints, as ingest kept before, adds ~3 MB at 30k). Golds come from a
    small set so the bounded parse caches fill alike in both."""
    def rows(n):
        return [{"question": f"Item {i}: what is {i % 50} plus {i % 7} (case {i})?",
                 "answer": f"#### {i % 50 + i % 7}"} for i in range(n)]

    peaks = {}
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(resolve_source(_jsonl(tmp_path / "warm.jsonl", rows(2000))),
                     batch_rows=1000)  # imports, parse caches, DuckDB's first batches
        for n in (3_000, 30_000):
            adapter = resolve_source(_jsonl(tmp_path / f"p{n}.jsonl", rows(n)))
            tracemalloc.start()
            report = store.ingest(adapter, batch_rows=1000)
            peaks[n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert report.ingested == n
    print(f"\ningest peak (Python): 3k rows {peaks[3_000] / 1024:.0f} KiB, "
          f"30k rows {peaks[30_000] / 1024:.0f} KiB")
    assert peaks[30_000] <= 1.3 * peaks[3_000] + 256 * 1024
