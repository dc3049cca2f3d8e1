"""Issue 44: each training stage learns from problems no earlier stage trained on.

- the pool's SFT and RL parts are disjoint, stable per problem and sized by data.sft_share
  (a real DuckDB store);
- each round's candidates are a fresh window of the RL part; a pool too small for the
  rounds is refused with the numbers and exit code 2, before any training;
- after a real `grpo run` (tiny random model, subprocess), the store's lineage shows SFT
  and GRPO problem ids disjoint, round 2's prompts disjoint from round 1's, and the
  memorisation probe's metrics on its MLflow runs; data.stage_overlap makes them overlap
  and the run says so."""
from __future__ import annotations

import json
import subprocess

import duckdb
import pytest
from pipeline_runs import GRPO, ROOT, run_env, write_config

from grpo_core.config import PipelineConfig
from grpo_core.data.pool import PoolSlice, build_pool, part_size, part_unit, query_problems
from grpo_core.data.stage_split import PoolExhausted, check_rounds, held_out, round_window
from grpo_core.data.store import Store

pytest_plugins = ["fixtures_models"]


def _cfg(**sections) -> PipelineConfig:
    base = {"data": {"train": [{"source": "synthetic:arith", "limit": 600, "levels": [1, 2, 3]}]}}
    return PipelineConfig.model_validate({**base, **sections})


def _pool(tmp_path, cfg):
    from grpo_core.data.pool import ingest_sources, training_sets

    store = Store.open(tmp_path / "store.duckdb")
    ref = build_pool(cfg, store, training_sets(cfg, ingest_sources(cfg, store)))
    return store, ref


def test_pool_parts_are_disjoint_stable_and_sized_by_the_share(tmp_path):
    cfg = _cfg(data={"train": [{"source": "synthetic:arith", "limit": 600}], "sft_share": 0.3})
    store, ref = _pool(tmp_path, cfg)
    with store:
        sft = query_problems(store, PoolSlice(ref.pool, "sft", 0.3))
        rl = query_problems(store, PoolSlice(ref.pool, "rl", 0.3))
        whole = query_problems(store, ref)
        assert len(sft) == part_size(store, ref.pool, "sft", 0.3)
        assert len(rl) == part_size(store, ref.pool, "rl", 0.3)
        assert not {p.fingerprint for p in sft} & {p.fingerprint for p in rl}
        assert {p.fingerprint for p in sft} | {p.fingerprint for p in rl} == \
            {p.fingerprint for p in whole}
        assert 0.22 < len(sft) / len(whole) < 0.38, len(sft)
        # the part is the problem's, by its content hash: SQL and Python agree, and each
        # part keeps the pool's seeded order
        assert all(part_unit(p.fingerprint) < 0.3 for p in sft)
        assert all(part_unit(p.fingerprint) >= 0.3 for p in rl)
        order = {p.fingerprint: i for i, p in enumerate(whole)}
        assert [order[p.fingerprint] for p in rl] == sorted(order[p.fingerprint] for p in rl)
        # another seed orders the pool differently; no problem changes part
        other = build_pool(_cfg(project={"seed": 5}, data=cfg.data.model_dump()), store,
                           [("synthetic:arith", "train", 600)])
        rl_other = query_problems(store, PoolSlice(other.pool, "rl", 0.3))
        assert [p.fingerprint for p in rl_other] != [p.fingerprint for p in rl]
        assert {p.fingerprint for p in rl_other} == {p.fingerprint for p in rl}
        # a window is a slice of the part, in order
        window = query_problems(store, PoolSlice(ref.pool, "rl", 0.3, 10, 30))
        assert [p.fingerprint for p in window] == [p.fingerprint for p in rl[10:30]]


def test_round_windows_are_fresh_and_a_short_pool_is_refused():
    cfg = _cfg(filter={"max_problems": 100}, rounds={"count": 3}, probe={"problems": 50})
    assert held_out(cfg, 400) == 50
    windows = [round_window(cfg, 400, r)[:2] for r in (1, 2, 3)]
    assert windows == [(0, 100), (100, 200), (200, 300)]  # disjoint, in order
    assert check_rounds(cfg, 400) == []
    with pytest.raises(PoolExhausted) as err:
        check_rounds(cfg, 320)  # 270 available: round 3 would need rows 200-300
    said = str(err.value)
    assert "round 3 needs 100 fresh RL-part problems" in said and "270" in said
    assert "filter.reuse_prompts" in said and "data.train limit" in said
    assert err.value.exit_code == 2
    reuse = _cfg(filter={"max_problems": 100, "reuse_prompts": True}, rounds={"count": 3},
                 probe={"problems": 50})
    notes = check_rounds(reuse, 320)
    assert len(notes) == 1 and "re-using" in notes[0]
    start, stop, _ = round_window(reuse, 320, 3)
    assert stop - start == 100 and stop <= 270
    # no filter.max_problems: the RL part shared by the rounds, a share left for a retrain
    assert round_window(_cfg(rounds={"count": 2}, probe={"problems": 0}), 300, 2)[:2] == (100, 200)


def _run(tmp_path, workdir, cfg_path, timeout=900):
    return subprocess.run([GRPO, "run", str(cfg_path), "--quiet"], env=run_env(workdir), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_a_pool_too_small_for_the_rounds_exits_2_before_training(tmp_path, tiny_model_path):
    cfg = write_config(tmp_path, tiny_model_path, rounds={"count": 12})
    out = _run(tmp_path, tmp_path / "ws", cfg)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    # the CLI's last word is the one line with the numbers and the fix (Prefect's own flow
    # log above it still prints the exception: issue 47's "expected refusals" point)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: round ") and "fresh RL-part problems" in last, last
    with duckdb.connect(str(tmp_path / "ws" / "store.duckdb"), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert "problems" in tables  # ingest ran: the check needs the RL part's size
        assert "rollouts" not in tables or not con.execute(
            "SELECT count(*) FROM rollouts").fetchone()[0]  # nothing trained


def _trained(con, stage: str, round_no: int | None = None) -> set[str]:
    role = "sft_example" if stage == "sft" else "grpo_prompt"
    return {r[0] for r in con.execute(
        "SELECT problem_id FROM lineage WHERE stage = ? AND role = ? AND "
        "round IS NOT DISTINCT FROM ?", [stage, role, round_no]).fetchall()}


@pytest.mark.parametrize("overlap", [False, True], ids=["disjoint", "stage_overlap"])
def test_sft_and_each_round_train_on_problems_no_earlier_stage_saw(tmp_path, tiny_model_path,
                                                                  overlap):
    sft_steps = 6  # x 4 traces a step = 24 examples of the SFT part
    cfg = write_config(tmp_path, tiny_model_path, project={"name": "itest", "recipe": "sft_grpo"},
                       sft_stage={"enabled": True},
                       sft={"max_steps": sft_steps, "per_device_train_batch_size": 4},
                       **({"data": {"train": [{"source": "synthetic:arith", "limit": 80,
                                               "levels": [1, 2]}], "stage_overlap": True},
                           "rounds": {"count": 1}} if overlap else {}))
    workdir = tmp_path / "ws"
    out = _run(tmp_path, workdir, cfg)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with duckdb.connect(str(workdir / "store.duckdb"), read_only=True) as con:
        sft, round1 = _trained(con, "sft"), _trained(con, "grpo", 1)
        assert len(sft) == 24 and round1
        model = con.execute("SELECT model_out FROM lineage WHERE stage = 'grpo' "
                            "ORDER BY created_at DESC LIMIT 1").fetchone()[0]
        from grpo_core.data.lineage import overlaps

        shared = overlaps(con, model)
        if overlap:
            assert sft & round1 and shared
            assert "data.stage_overlap is set" in out.stdout + out.stderr
            return
        round2 = _trained(con, "grpo", 2)
        assert round2 and not sft & round1 and not sft & round2 and not round1 & round2
        assert shared == []
        cands = [{r[0] for r in con.execute(
            "SELECT problem_id FROM lineage WHERE role = 'filter_candidate' AND round = ?",
            [r]).fetchall()} for r in (1, 2)]
        assert cands[0] and cands[1] and not cands[0] & cands[1]
        unseen = {r[0] for r in con.execute(
            "SELECT problem_id FROM lineage WHERE role = 'probe_unseen'").fetchall()}
        assert len(unseen) == 8 and not unseen & (sft | round1 | round2 | cands[0] | cands[1])
    # the probe after SFT and after each round: its metrics on its MLflow run, its line
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    probes = {r.data.tags.get("mlflow.runName", r.info.run_name): r for r in runs
              if r.info.run_name.split("/")[-2:-1] == ["probe"]}
    assert {n.split("/", 1)[1] for n in probes} == {"probe/sft", "probe/round-1", "probe/round-2"}
    for run in probes.values():
        assert {"memorisation/trained", "memorisation/unseen", "memorisation/gap",
                "memorisation/heldout"} <= set(run.data.metrics)
    assert {"readiness/entropy", "readiness/zero_variance_share", "readiness/pass_at_1",
            "readiness/pass_at_k"} <= set(next(r for n, r in probes.items()
                                               if n.endswith("probe/sft")).data.metrics)
    said = out.stdout + out.stderr
    assert "probe/round-2: computed" in said and "memorisation: trained" in said
    # grpo data lineage: the same store, in a table and as JSON
    shown = subprocess.run([GRPO, "data", "lineage", "--json", "--workdir", str(workdir)],
                           capture_output=True, text=True, timeout=120, check=True)
    (entry,) = json.loads(shown.stdout)
    assert entry["recipe"] == "sft_grpo" and entry["overlaps"] == []
    roles = {(s["stage"], s["round"], s["role"]) for s in entry["stages"]}
    assert {("sft", None, "sft_example"), ("grpo", 1, "grpo_prompt"),
            ("grpo", 2, "grpo_prompt"), ("filter", 2, "filter_candidate")} <= roles


def test_a_window_too_small_for_the_round_says_how_many_candidates_would_do():
    from flows.pipeline import window_note
    from tasks.stage_results import FilterResult

    cfg = _cfg(grpo={"max_steps": 80, "per_device_train_batch_size": 128, "num_generations": 8})
    kept = FilterResult(kept=300, considered=2000, kept_ids=[str(i) for i in range(300)])
    note = window_note(cfg, kept, 2000)  # 1280 draws over 300: 4.3 each, above 4
    assert note.code == "prompt_repeats" and note.evidence["need"] == 2134
    assert "1280 prompt draws" in note.summary and "~2134 candidates" in note.summary
    enough = FilterResult(kept=320, considered=2000, kept_ids=[str(i) for i in range(320)])
    assert window_note(cfg, enough, 2000) is None
