"""Data at scale (issue 25): after ingest the store is the pool, and no stage but ingest
costs more as the pool grows. Real DuckDB files and real files written here; the
end-to-end run (a source file deleted after ingest) is tests/test_data_scale_run.py."""
import json
import tracemalloc
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_core.config import PipelineConfig
from grpo_core.data.adapters import resolve_source
from grpo_core.data.pool import PoolRef, build_pool, query_problems, training_sets
from grpo_core.data.store import Store
from tasks import stage_data
from tasks.stage_keys import problems_fingerprint


def _cfg(*sources, seed=0, **data):
    return PipelineConfig.model_validate({
        "project": {"seed": seed}, "eval": {"benchmarks": ["synthetic"]},
        "data": {"train": [{"source": s} for s in sources], **data}})


def _fill(store: Store, source: str, n: int, levels: int = 5, split: str = "train") -> None:
    """n distinct problems of `source` straight into the problems table (what ingest
    stores), so a large pool is built in a second. Every fourth has no solution (SFT
    cannot use it)."""
    store.con.execute(
        "INSERT INTO problems (source, split, fingerprint, id, problem, answer, solution, level,"
        " subject, row_index) SELECT ?, ?, md5(? || i::VARCHAR)[:16], ? || '/' || ? || '/' || i,"
        " 'What is ' || i || ' plus ' || (i % 97) || '? Think about it step by step.', "
        "(i + i % 97)::VARCHAR, CASE WHEN i % 4 = 0 THEN '' ELSE 'Add ' || i || ' and ' || "
        "(i % 97) || '.' END, (i % ?) + 1, NULL, i FROM range(?) t(i)",
        [source, split, source, source, split, levels, n])


def test_pool_is_stored_once_seeded_and_stratified(tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        _fill(store, "a", 3000)
        _fill(store, "b", 1000)
        cfg = _cfg("a", "b")
        sets = [("a", "train", None), ("b", "train", 500)]
        ref = build_pool(cfg, store, sets)
        assert ref.size == 3500 and build_pool(cfg, store, sets) == ref  # same content, same id
        assert store.con.execute("SELECT count(*) FROM pool_rows").fetchone()[0] == 3500
        head = query_problems(store, ref, 70)
        # a prefix is stratified: sources 3000:500 -> 60:10, each level of a equally
        assert Counter(p.source for p in head) == {"a": 60, "b": 10}
        assert set(Counter(p.level for p in head if p.source == "a").values()) == {12}
        assert [p.id for p in query_problems(store, ref, 70)] == [p.id for p in head]
        other = build_pool(_cfg("a", "b", seed=1), store, sets)
        assert other.pool != ref.pool and other.size == ref.size  # the seed draws other rows
        ids = [p.id for p in head[::-1]][:5] + ["nope/train/1"]
        assert [p.id for p in query_problems(store, ids)] == ids[:5]


# What each stage reads of a whole pool: filter.max_problems 64, a GRPO round's budget
# (2 steps x 4 prompts), SFT's max_examples 48 (rows with a solution only), eval's limit.
_STAGE_CFG = {"filter": {"max_problems": 64}, "sft_stage": {"max_examples": 48},
              "grpo": {"max_steps": 2, "per_device_train_batch_size": 32, "num_generations": 8},
              "eval": {"benchmarks": ["gsm8k"], "limit": 40}}


def _stage_reads(ctx, stage: str, pool: PoolRef) -> list:
    """A stage's data access as tasks/stages.py does it: its problems (tasks.stage_data),
    then their fingerprint for its cache key."""
    from grpo_core.data.benchmarks import benchmark_problems, fingerprint

    if stage == "eval":  # the evaluation set, never the pool
        with ctx.store() as store:
            problems = benchmark_problems("gsm8k", ctx.cfg, store, ctx.cfg.eval.limit)
        fingerprint(problems)
        return problems
    problems = stage_data.stage_problems(ctx, stage, _selection(ctx, stage, pool))
    problems_fingerprint(problems)
    return problems


def _selection(ctx, stage: str, pool: PoolRef):
    """What the pipeline hands `stage` of the pool (flows/pipeline.py): SFT its part, the
    filter (and a GRPO round without one) round 1's window of the RL part."""
    if stage == "sft":
        return stage_data.sft_part(ctx.cfg, pool)
    return stage_data.round_candidates(ctx.cfg, pool, stage_data.rl_size(ctx, pool), 1)[0]


def test_no_stage_reads_more_of_the_pool_as_it_grows(tmp_path):
    """Every stage but ingest (filter and each re-filter, GRPO round, SFT, eval), through
    the stages' own data access: Python memory at 50k rows within 1.5x (+64 KiB) of 500
    rows', the same number of problems. Reading the pool whole, as stages once did (SFT
    until issue 25), takes ~100x at 50k."""
    from grpo_core.workspace import Workspace
    from tasks.stages import Ctx

    cfg = PipelineConfig.model_validate({"data": {"train": [{"source": "big"}]}, **_STAGE_CFG})
    peaks, sizes = {}, {}
    for n in (500, 50_000):
        ctx = Ctx(cfg, Workspace(tmp_path / str(n)).ensure(), parent_run="")
        with ctx.store() as store:
            _fill(store, "big", n)
            _fill(store, "gsm8k", 300, split="test")
            ref = build_pool(cfg, store, [("big", "train", None)])
        for stage in ("filter", "grpo", "sft", "eval"):
            _stage_reads(ctx, stage, ref)  # warm: DuckDB's own caches, imports
            tracemalloc.start()
            problems = _stage_reads(ctx, stage, ref)
            peaks[stage, n] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            sizes[stage, n] = len(problems)
        if n == 50_000:  # the check can fail: the whole pool costs far more
            tracemalloc.start()
            stage_data.open_and_query(ctx, ref)
            whole = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    print(" | ".join(f"{s}: {peaks[s, 500] / 1024:.0f} -> {peaks[s, 50_000] / 1024:.0f} KiB"
                     for s in ("filter", "grpo", "sft", "eval"))
          + f" | whole 50k pool {whole / 1024:.0f} KiB")
    assert sizes == {**{(s, n): k for s, k in (("filter", 64), ("grpo", 8), ("sft", 48),
                                               ("eval", 40)) for n in (500, 50_000)}}
    for stage in ("filter", "grpo", "sft", "eval"):
        assert peaks[stage, 50_000] <= 1.5 * peaks[stage, 500] + 64 * 1024, stage
        assert whole > 20 * peaks[stage, 50_000], stage


def _slice(cfg, stage: str, pool: PoolRef, rl_size: int):
    if stage == "sft":
        return stage_data.sft_part(cfg, pool)
    return stage_data.round_candidates(cfg, pool, rl_size, 1)[0]


def test_a_pool_stages_cache_key_reads_nothing_of_the_pool(tmp_path):
    """A stage handed the stored pool keys on the pool's fingerprint (from ingest) and its
    bounds: a cache hit opens no store (1M rows: ~0.3 s a read saved per stage); the rows
    are read once, when the stage computes. Handed ids, the key is their content."""
    from grpo_core.workspace import Workspace
    from tasks.stages import Ctx

    cfg = PipelineConfig.model_validate({"data": {"train": [{"source": "big"}]}, **_STAGE_CFG})
    ctx = Ctx(cfg, Workspace(tmp_path).ensure(), parent_run="")
    with ctx.store() as store:
        _fill(store, "big", 2000)
        ref = build_pool(cfg, store, [("big", "train", None)])
        other = build_pool(_cfg("big", seed=1), store, [("big", "train", None)])

    class NoStore(Ctx):
        def store(self):
            raise AssertionError("a cache key read the store")

    blind = NoStore(cfg, ctx.ws, parent_run="")
    size = stage_data.rl_size(ctx, ref)  # the flow reads it once, after ingest
    sel = {stage: _slice(cfg, stage, ref, size) for stage in ("filter", "grpo", "sft")}
    keys = {stage: stage_data.stage_input(blind, stage, sel[stage])[0]
            for stage in ("filter", "grpo", "sft")}
    assert len(set(keys.values())) == 3
    assert stage_data.stage_input(blind, "filter", _slice(cfg, "filter", other, size))[0] != keys["filter"]
    assert stage_data.stage_input(blind, "filter", sel["filter"])[0] == keys["filter"]
    bigger = PipelineConfig.model_validate({**cfg.model_dump(mode="json"), "filter": {"max_problems": 65}})
    assert stage_data.stage_input(NoStore(bigger, ctx.ws, ""), "filter",
                                  _slice(bigger, "filter", ref, size))[0] != keys["filter"]
    round2 = stage_data.round_candidates(cfg, ref, size, 2)[0]
    assert stage_data.stage_input(blind, "filter", round2)[0] != keys["filter"]
    fp, read = stage_data.stage_input(ctx, "sft", sel["sft"])
    assert [p.id for p in read()] == [p.id for p in stage_data.stage_problems(ctx, "sft", sel["sft"])]
    ids = [p.id for p in read()[:5]]
    fp_ids, read_ids = stage_data.stage_input(ctx, "grpo", ids)
    assert fp_ids == problems_fingerprint(read_ids()) and [p.id for p in read_ids()] == ids


def test_sft_reads_the_first_rows_with_a_solution(tmp_path):
    """The SFT stage's rows: in pool order, those with a reference solution only, as many
    as max_examples (else its steps) allow, across read blocks; the CLI's `grpo sft` the same."""
    from grpo_core.train.sft import has_trace, sft_problem_budget

    with Store.open(tmp_path / "s.duckdb") as store:
        _fill(store, "big", 10_000)
        ref = build_pool(_cfg("big"), store, [("big", "train", None)])
        order = query_problems(store, ref)
        want = [p.id for p in order if p.solution][:5000]  # a block of 5000 holds 3750
        got = query_problems(store, ref, 5000, keep=has_trace)
        assert [p.id for p in got] == want
        assert len(query_problems(store, ref, 20_000, keep=has_trace)) == 7500  # all there are
    small = PipelineConfig.model_validate({"sft": {"max_steps": 3, "per_device_train_batch_size": 4}})
    assert sft_problem_budget(small) == 12  # 3 steps x 4
    assert sft_problem_budget(small.model_copy(update={"sft_stage": small.sft_stage.model_copy(
        update={"max_examples": 5})})) == 5


def _write_rows(path, rows):
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_sharded_parquet_folder_and_solution_extraction(tmp_path):
    """A hub-style folder of Parquet shards (data/train-0000x-of-00003.parquet), read as
    one source, as a folder and as a glob; answers taken from a solution column
    (\\boxed{} and ####), with --columns naming the columns."""
    data = tmp_path / "numina-like" / "data"
    data.mkdir(parents=True)
    rows = [{"query": f"Compute {i} + 1.", "worked": f"We add: $\\boxed{{{i + 1}}}$"
             if i % 2 else f"{i} plus one is {i + 1}.\n#### {i + 1}", "source": "synthetic"}
            for i in range(30)]
    for k in range(3):
        _write_rows(data / f"train-0000{k}-of-00003.parquet", rows[k * 10:(k + 1) * 10])
    (data / "README.md").write_text("not a shard")
    mapping = "problem=query,solution=worked"
    for source in (str(data), str(data / "train-*.parquet")):
        adapter = resolve_source(source, columns=mapping)
        assert (adapter.source, adapter.split) == ("numina-like", "train")
        with Store.open(tmp_path / "s.duckdb") as store:
            report = store.ingest(adapter)
            got = {p.problem: p.answer for p in store.problems("numina-like", "train")}
        assert report.total_rows == 30 and not report.quarantined, report
        assert got == {f"Compute {i} + 1.": str(i + 1) for i in range(30)}
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _write_rows(mixed / "a.parquet", rows[:2])
    _write_rows(mixed / "b.jsonl", rows[2:4])
    with pytest.raises(ValueError, match="one format per folder"):
        resolve_source(str(mixed), columns=mapping)


def _gsm8k_eval_rows():
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"
    if not path.is_file():
        pytest.skip("no ../shared/data/gsm8k/test.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()[:300]]


def test_decontamination_flags_planted_rows_at_100k(tmp_path):
    """100k synthetic training rows with 25 GSM8K test problems planted verbatim and 25
    inside longer text: exactly the 50 planted rows are flagged and left out of the pool.
    (~8 s of CPU.)"""
    evals = _gsm8k_eval_rows()
    rows = [{"question": f"A shop sells {i} apples on day {i % 31} and {i % 7} pears. "
                         f"How many fruits in total, counting item {i}?",
             "answer": f"#### {i + i % 7}"} for i in range(100_000)]
    planted = {}
    for j, ev in enumerate(evals[:50]):
        text = ev["question"] if j < 25 else f"Read carefully. {ev['question']} Show work."
        row = 1000 * j + 7
        rows[row] = {"question": text, "answer": ev["answer"]}
        planted[f"big/train/{row}"] = text
    train = tmp_path / "big.jsonl"
    _write_rows(train, rows)
    test = tmp_path / "gsm8k-test.jsonl"
    _write_rows(test, evals)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(resolve_source(str(test), split="test", name="gsm8k"))
        report = store.ingest(resolve_source(str(train)))
        flagged = {r[0] for r in store.con.execute(
            "SELECT id FROM problems WHERE contaminated").fetchall()}
        ref = build_pool(_cfg(str(train)), store, training_sets(_cfg(str(train)), [report]))
        pool_ids = {p.id for p in query_problems(store, ref)}
    assert flagged == set(planted), sorted(flagged ^ set(planted))[:5]
    assert report.contaminated == 50 and report.ingested == 100_000
    assert ref.size == 100_000 - 50 and not pool_ids & flagged


def test_ingest_key_keeps_a_deleted_files_digest_and_sees_edits(tmp_path):
    """With the digest memo (the pipeline's), a source deleted after ingest keeps its key
    (the store holds its rows) and an edited one gets a new key; a shard folder's key
    covers every shard."""
    from tasks.stage_keys import ingest_key

    memo = tmp_path / "cache" / "file-digests.json"
    src = tmp_path / "mine.jsonl"
    _write_rows(src, [{"question": "1+1?", "answer": "2"}])
    cfg = _cfg(str(src))
    k0 = ingest_key(cfg, digests=memo)
    assert ingest_key(cfg, digests=memo) == k0
    _write_rows(src, [{"question": "1+1?", "answer": "3"}])
    k1 = ingest_key(cfg, digests=memo)
    assert k1 != k0
    src.unlink()
    assert ingest_key(cfg, digests=memo) == k1
    assert ingest_key(cfg) != k1  # without the memo a missing file is no file at all
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(2):
        _write_rows(shards / f"train-{k}.jsonl", [{"question": f"{k}+1?", "answer": str(k + 1)}])
    folder = _cfg(str(shards))
    f0 = ingest_key(folder, digests=memo)
    _write_rows(shards / "train-1.jsonl", [{"question": "1+1?", "answer": "5"}])
    assert ingest_key(folder, digests=memo) != f0


def test_unchanged_source_is_only_stat_ed(tmp_path):
    """The data stage's key reads a source's digest from the memo while its size and
    modification time match: content swapped behind an unchanged stat keeps the key (the
    file was not read again), a touched file is read and gets its new key."""
    import os

    from tasks.stage_keys import ingest_key

    memo = tmp_path / "cache" / "file-digests.json"
    src = tmp_path / "mine.jsonl"
    _write_rows(src, [{"question": "1+1?", "answer": "2"}])
    cfg = _cfg(str(src))
    k0 = ingest_key(cfg, digests=memo)
    st = src.stat()
    _write_rows(src, [{"question": "1+1?", "answer": "3"}])  # same size
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ingest_key(cfg, digests=memo) == k0
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert ingest_key(cfg, digests=memo) != k0
