"""Ingest at scale (issue 25): near duplicates dropped, memory bounded by the batch and
not the source, hub datasets streamed. Real DuckDB files and real files written here."""
import json
import tracemalloc

import pytest

from grpo_core.data.adapters import resolve_source
from grpo_core.data.source import SourceError
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


def _hub_repo(root):
    """A hub dataset repository laid out as NuminaMath/DeepMath publish theirs: a README
    naming configs, each a folder of Parquet shards per split; answers inside solutions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def shard(path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), path)

    for k in range(2):  # config "olympiads": two train shards, \boxed{} solutions
        shard(root / "olympiads" / f"train-0000{k}-of-00002.parquet",
              [{"question": f"Olympiad {k}-{i}: compute {i} squared.",
                "worked": f"It is $\\boxed{{{i * i}}}$."} for i in range(50)])
    shard(root / "gsm" / "train-00000-of-00001.parquet",  # config "gsm": train and test
          [{"question": f"Sam has {i} pens and buys 2. How many now?",
            "worked": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(30)])
    shard(root / "gsm" / "test-00000-of-00001.parquet",
          [{"question": f"Ana has {i} cups and breaks 1. How many are left?",
            "worked": f"{i} - 1 = {i - 1}\n#### {i - 1}"} for i in range(1, 11)])
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: olympiads\n  data_files:\n  - split: train\n"
        "    path: olympiads/train-*\n- config_name: gsm\n  data_files:\n  - split: train\n"
        "    path: gsm/train-*\n  - split: test\n    path: gsm/test-*\n---\n")


def test_hub_dataset_configs_and_splits_are_streamed_at_ingest(tmp_path, monkeypatch):
    """A local copy of a hub repository read through datasets' own loader (the folder
    stands in for the hub: nothing is mocked, there is no network here), one source per
    config and split, rows streamed: no Arrow copy lands in the datasets cache."""
    import datasets

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    repo = tmp_path / "numina-like"
    _hub_repo(repo)
    mapping = "problem=question,solution=worked"
    got = {}
    with Store.open(tmp_path / "s.duckdb") as store:
        for config, split, limit in (("olympiads", "train", None), ("gsm", "train", None),
                                     ("gsm", "test", None), ("olympiads", "train", 7)):
            adapter = resolve_source(str(repo), config=config, split=split, columns=mapping,
                                     limit=limit, name=f"numina-{config}")
            r = store.ingest(adapter)
            got[config, split, limit] = (r.total_rows, r.ingested, r.quarantined_total)
        answers = {p.problem: p.answer for p in store.problems(exclude_contaminated=False)}
    assert got == {("olympiads", "train", None): (100, 100, 0),  # both shards
                   ("gsm", "train", None): (30, 30, 0), ("gsm", "test", None): (10, 10, 0),
                   ("olympiads", "train", 7): (7, 0, 0)}
    assert answers["Olympiad 1-7: compute 7 squared."] == "49"
    assert answers["Sam has 4 pens and buys 2. How many now?"] == "6"
    assert answers["Ana has 3 cups and breaks 1. How many are left?"] == "2"
    assert not list(cache.rglob("*.arrow")), "rows were downloaded, not streamed"
    with pytest.raises(SourceError, match=r"numina-like \[nope\]"):
        resolve_source(str(repo), config="nope")
