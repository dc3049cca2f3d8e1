"""filter.shard_runner=dask for real (the `dask` extra: prefect-dask + distributed, installed
by `make setup`): the sharded filter on a LocalCluster of 2 worker processes that the
runner starts, and the sharded evaluation on an existing cluster found through
$DASK_SCHEDULER_ADDRESS, each giving exactly the unsharded rows. As in tests/test_shards.py
the flows use Prefect's temporary local server and the tiny random model; no test here is
skipped when the extra is missing: a missing install fails."""
from __future__ import annotations

import pytest
from test_shards import (  # the same settings and comparisons
    _cfg,
    _eval_cfg,
    _eval_in_a_flow,
    _exact,
    _prefill_in_a_flow,
    _rows,
)

from grpo_core.data.records import problem_key
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.difficulty import run_filter

pytest_plugins = ["fixtures_models"]

def _executed(client) -> dict[str, int]:
    """Tasks each worker of the cluster has run (worker address -> count)."""
    return client.run(lambda dask_worker: dask_worker.state.executed_count)


def test_the_dask_runner_is_a_local_cluster_or_the_given_scheduler(shard_flows, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    import dask.config

    with dask.config.set({"scheduler-address": None}):
        runner = shard_flows.task_runner("dask", 2)
        assert type(runner).__name__ == "DaskTaskRunner" and runner.address is None
        assert runner.cluster_kwargs["n_workers"] == 2
        assert runner.cluster_kwargs["threads_per_worker"] == 1
        assert shard_flows.runs_locally("dask")  # local workers share the cores

    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://10.0.0.5:8786")
    runner = shard_flows.task_runner("dask", 2)
    assert runner.address == "tcp://10.0.0.5:8786" and not runner.cluster_kwargs
    assert not shard_flows.runs_locally("dask")  # a cluster's workers keep their threads


@pytest.mark.integration
def test_sharded_filter_on_a_dask_local_cluster_gives_the_unsharded_rows(
        shard_flows, tiny_model_path, tmp_path, monkeypatch):
    import distributed

    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    problems = generate_problems("train", 8, seed=5)
    with Store.open(tmp_path / "one.duckdb") as store:
        one = run_filter(tiny_model_path, problems, _cfg(1), store=store)
        expected = _rows(store)
    assert one.estimated == 8 and len(expected) == 8

    # The runner makes distributed.LocalCluster (looked up when the flow starts); this one
    # notes, before it closes, how many tasks each of its workers ran.
    clusters: list[dict] = []

    class Noting(distributed.LocalCluster):
        def __exit__(self, *exc):
            with distributed.Client(self, set_as_default=False) as client:
                clusters.append(_executed(client))
            return super().__exit__(*exc)

    monkeypatch.setattr(distributed, "LocalCluster", Noting)
    cfg = _cfg(2)
    cfg.filter.shard_runner = "dask"
    db = tmp_path / "two.duckdb"
    fresh = _prefill_in_a_flow(shard_flows, tiny_model_path, cfg, problems, db, tmp_path / "ws")
    assert fresh == [problem_key(p) for p in problems]
    # One cluster of 2 workers, and it ran both shards.
    assert len(clusters) == 1 and len(clusters[0]) == 2 and sum(clusters[0].values()) == 2
    with Store.open(db) as store:
        two = run_filter(tiny_model_path, problems, cfg, store=store, fresh=fresh)
        assert _rows(store) == expected  # every column but created_at
    assert (two.estimated, two.reused) == (8, 0)
    assert two.counts == one.counts and [p.id for p in two.kept] == [p.id for p in one.kept]
    assert not list((tmp_path / "ws" / "shards").iterdir())  # shard files cleaned up


@pytest.mark.integration
def test_sharded_eval_on_an_existing_dask_cluster_gives_the_unsharded_records(
        shard_flows, tiny_model_path, tmp_path, monkeypatch):
    import distributed

    from grpo_core.eval.evaluation import evaluate_benchmark

    with Store.open(tmp_path / "one.duckdb") as store:
        one = evaluate_benchmark(tiny_model_path, "synthetic", _eval_cfg(1, tmp_path), store=store,
                       limit=8)
    assert len(one.per_problem) == 8

    cfg, db = _eval_cfg(2, tmp_path), tmp_path / "two.duckdb"
    cfg.filter.shard_runner = "dask"
    # A cluster started apart from the pipeline, as `dask scheduler` + `dask worker` would be;
    # its workers set their own torch threads (the runner leaves a cluster's alone).
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None,
                                  env={"GRPO_TORCH_THREADS": "1"}) as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
        two = _eval_in_a_flow(shard_flows, tiny_model_path, cfg, db, tmp_path / "ws", limit=8)
        executed = _executed(client)
    assert len(executed) == 2 and sum(executed.values()) == 2  # the cluster ran both shards
    assert two.per_problem == one.per_problem  # every record, in order, types included
    assert _exact(two.per_problem) == _exact(one.per_problem)
    assert _exact(two.metrics) == _exact(one.metrics)
    assert (two.protocol_hash, two.model_fingerprint) == (one.protocol_hash,
                                                          one.model_fingerprint)
    assert not list((tmp_path / "ws" / "shards").iterdir())
