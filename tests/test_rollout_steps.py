"""One step numbering (issue 24 item 5): the `rollouts` table counts steps from 1, as the
trainer's logs and checkpoints do, and a round resumed from checkpoint-N keeps the rows of
steps 1..N in a real DuckDB store and in the launched round's rollouts file. (The trainer
side, the sink's steps against the logged ones, is in tests/test_grpo.py and
tests/test_batch_patterns.py.)"""
from __future__ import annotations

import json

from grpo_core.data.records import drop_rollouts_after, read_rollouts, write_rollout_steps
from grpo_core.data.store import Store
from tasks.launch import keep_rows_through, read_rollouts_file


def _rows(n: int = 2) -> list[dict]:
    return [{"prompt": "Q", "completion": f"c{i}", "problem_id": "p", "answer": "1",
             "rewards": {"accuracy": 0.0}, "reward": 0.0, "advantage": 0.0} for i in range(n)]


def test_resume_from_checkpoint_keeps_the_steps_it_trained(tmp_path) -> None:
    with Store.open(tmp_path / "store.duckdb") as store:
        write_rollout_steps(store, [(s, _rows()) for s in (1, 2, 3, 4)], "run")
        write_rollout_steps(store, [(1, _rows())], "other")
        # resumed from checkpoint-2: steps 3 and 4 are generated again
        assert drop_rollouts_after(store, "run", 2) == 4
        assert sorted({r["step"] for r in read_rollouts(store, "run")}) == [1, 2]
        # 0: a round re-written whole from its file forgets them all
        assert drop_rollouts_after(store, "run", 0) == 4
        assert read_rollouts(store, "run") == [] and len(read_rollouts(store, "other")) == 2


def test_launched_round_keeps_the_file_rows_through_the_checkpoint(tmp_path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps({"step": s, "completion": f"c{s}"}) + "\n" for s in (1, 2, 3)))
    keep_rows_through(path, 2)
    assert sorted(read_rollouts_file(path)) == [1, 2]
