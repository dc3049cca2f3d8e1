"""The end of a pipeline run: the per-problem records read once (tasks/eval_records.py),
the decisions made by grpo_core.eval's pure functions (paired deltas of final vs base,
which stage earned the gain, the promotion rule), and tasks/tracking told what they
decided (the parent's metrics, tags and description, the registered version)."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from grpo_core.eval.comparison import final_vs_base, stage_attribution
from grpo_core.eval.score import Scores
from grpo_core.findings import Finding
from grpo_core.workspace import Workspace, workdir_of
from tasks import tracking
from tasks.eval_records import pipeline_records
from tasks.tracking.registry import EVAL_RUN_TAG


def finish_pipeline(parent_id: str, cfg, model_dir: str | os.PathLike, final: Scores,
                    findings: Sequence[Finding], workspace: Workspace | str | os.PathLike | None = None,
                    *, champion_records: Sequence[Mapping] | None = None,
                    base: Scores | None = None, base_model: str | None = None,
                    wall_s: float | None = None,
                    stages: Sequence[tuple[str, Scores, str | None]] = (),
                    over: str = "the base") -> dict:
    """Close a pipeline run (tasks.tracking.parent_run.close_pipeline): final metrics and
    findings on the parent, the paired deltas of final vs base on the eval/final run, the
    model registered and promoted by the paired rule on the primary metric of the first
    benchmark, the headline and a description, the runs FINISHED. Returns what happened,
    with a one-line summary, the deltas ({bench: {metric: {"delta", "lo", "hi", "n"}}})
    and the attribution (`stages`: (eval label, its scores, model path) in pipeline
    order).

    `base`: the base model's stage results (None: found under the final eval's protocol;
    {}: none), or what the deltas are over, called `over` in the result line (a retrain:
    the champion's eval, `base_model` its folder); `champion_records`: the champion's rows as a retrain
    re-scored them, else those of the champion version's eval run."""
    workdir = workspace if workspace is not None else workdir_of(None, cfg)
    name = tracking.model_name(cfg) if cfg.tracking.register_model else None
    champ = tracking.champion_version(name) if name else None
    recs = pipeline_records(cfg, workdir, final, str(model_dir), base=base,
                            base_model=base_model, stages=stages,
                            champion_run=champ.tags.get(EVAL_RUN_TAG) if champ else None)
    kw = {"n_resamples": cfg.eval.bootstrap, "seed": cfg.project.seed}
    deltas = final_vs_base(final, recs.final, recs.base, **kw)
    attribution = (stage_attribution(recs.stages, next(iter(cfg.eval.benchmarks), None),
                                     cfg.eval.primary_metric, **kw) if stages else None)
    return tracking.close_pipeline(
        parent_id, cfg, model_dir, final, findings, workdir, deltas=deltas,
        attribution=attribution, base=base, wall_s=wall_s, model=name,
        records=recs.final, champion_records=(list(champion_records) if champion_records
                                              is not None else recs.champion), over=over)
