"""The per-problem eval records behind stage results, read from the DuckDB store once at
the end of a pipeline, for the pure decisions of grpo_core.eval (paired deltas, stage
attribution, promotion). A stage result holds its eval run id; results cached before
they held one are found by protocol hash and the model's fingerprint (the newest run)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.data.records import read_eval_results, read_eval_runs
from grpo_core.data.store import Store, StoreError
from grpo_core.eval.score import BenchmarkScore, Scores
from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
from grpo_core.workspace import Workspace


@contextlib.contextmanager
def records_store(workdir: Workspace | str | os.PathLike, timeout: float = 0.0
                  ) -> Iterator[Store | None]:
    """The workspace's store opened read-only, or None when there is none or it stays
    locked past `timeout`: without per-problem records there is no paired number, which
    the callers report, rather than a failed pipeline at its last step."""
    root = workdir.root if isinstance(workdir, Workspace) else Path(workdir)
    path = Workspace(root).db_path
    try:
        store = Store.open(path, read_only=True, timeout=timeout) if path.exists() else None
    except StoreError:
        store = None
    try:
        yield store
    finally:
        if store is not None:
            store.close()


def find_eval_run(store: Store, protocol_hash: str | None, model_path: str) -> str | None:
    """The newest eval run of `model_path` under `protocol_hash`."""
    if not protocol_hash:
        return None
    fp = model_fingerprint(str(model_path))
    runs = [r for r in read_eval_runs(store, protocol_hash) if r["model_fingerprint"] == fp]
    return runs[-1]["run_id"] if runs else None


def run_records(store: Store | None, run_id: str | None) -> list[dict]:
    """The per-problem rows of one eval run ([] without a store or run id)."""
    if store is None or not run_id:
        return []
    return read_eval_results(store, run_id=run_id)


def stage_records(store: Store | None, result: BenchmarkScore, model_path: str | None) -> list[dict]:
    """The rows behind one benchmark's score of the model at `model_path`."""
    if store is None:
        return []
    run_id = result.eval_run_id
    if not run_id and model_path is not None:
        run_id = find_eval_run(store, result.protocol_hash, model_path)
    return run_records(store, run_id)


@dataclass
class PipelineRecords:
    """What the end of a pipeline pairs: {bench: rows} of the final model and of the base
    model, the champion's rows (None: none to pair with), and the stages' rows for the
    attribution: (eval label, the first benchmark's result, rows) in pipeline order."""
    final: dict[str, list[dict]] = field(default_factory=dict)
    base: dict[str, list[dict]] = field(default_factory=dict)
    champion: list[dict] | None = None
    stages: list[tuple[str, BenchmarkScore | None, list[dict]]] = field(default_factory=list)


def pipeline_records(cfg, workdir, final: Scores, model_dir: str, *,
                     base: Scores | None = None, base_model: str | None = None,
                     champion_run: str | None = None,
                     stages: Sequence[tuple[str, Scores, str | None]] = ()) -> PipelineRecords:
    """Read the records once. `base`: the base model's stage results (None: the base was
    evaluated under the final eval's protocol, found by that hash and the base model's
    fingerprint; {}: none); `champion_run`: the champion's eval run id (its version's
    grpo.eval_run_id tag); `stages`: (eval label, its scores, model path)."""
    out = PipelineRecords()
    bench = next(iter(cfg.eval.benchmarks), None)
    with records_store(workdir, cfg.data.store_lock_timeout) as store:
        out.final = {b: stage_records(store, r, str(model_dir)) for b, r in final.items()}
        if base is not None or any(out.final.values()):
            if base is None:
                base = {b: BenchmarkScore(protocol_hash=r.protocol_hash) for b, r in final.items()}
            if base_model is None and not all(r.eval_run_id for r in base.values()):
                # Only then: resolving the built-in model builds it when it is missing.
                root = workdir.root if isinstance(workdir, Workspace) else Path(workdir)
                base_model = resolve_model_path(cfg.model.name_or_path, Workspace(root).models)
            out.base = {b: stage_records(store, r, base_model) for b, r in base.items()}
        out.champion = run_records(store, champion_run) or None
        for label, results, model in stages:
            res = (results or {}).get(bench)
            out.stages.append((label, res, stage_records(store, res, model) if res else []))
    return out
