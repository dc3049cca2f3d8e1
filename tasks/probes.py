"""The memorisation probe stage (issue 44): after SFT and after each GRPO round, the
stage's model on a sample of the problems the stage trained on and on RL-part problems
no stage reads (tasks/stage_data.py unseen_part), beside its held-out figure; after SFT
also its RL-readiness on those unseen prompts. The numbers go to the probe's MLflow run
(memorisation/*, readiness/*), the stage line and the pipeline's findings; the stage's
lineage records both problem sets. Cached by content, like every stage."""
from __future__ import annotations

import functools

from grpo_core.data.pool import PoolSlice
from grpo_core.data.problems import Problem
from grpo_core.modeling.loading import model_fingerprint, resolve_model_path
from tasks import stage_data, tracking
from tasks.runner import cached_stage, task_result
from tasks.stage_keys import probe_key
from tasks.stage_results import ProbeResult


def memorisation_probe(ctx, start_model: str, model_path: str, stage: str, trained: list[str],
                       unseen: PoolSlice, heldout: float | None = None,
                       readiness: bool = False, scorer=None) -> ProbeResult:
    """Probe `model_path`, the model stage `stage` (e.g. "sft", "grpo/round-1") made from
    `start_model` on `trained` (problem ids, most used first): both models on a sample of
    `trained` and on `unseen`. `heldout`: the stage's eval figure. `scorer`: the eval
    stage's (flows/shards.py: workers score, for eval.shards > 1 or a process per stage)."""
    from grpo_core.eval.evaluation import score_problems
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import load_tokenizer
    from grpo_core.prompts import resolve_template
    from grpo_core.train.memorisation import gap_findings, gap_of, sampled_only, score_sets
    from grpo_core.train.readiness import measure_readiness, readiness_findings

    cfg = ctx.cfg
    trained_fp, read_trained = stage_data.stage_input(ctx, "probe", trained[:cfg.probe.problems])
    unseen_fp, read_unseen = stage_data.stage_input(ctx, "probe", unseen)
    model_fp = model_fingerprint(model_path)
    key = probe_key(cfg, f"{model_fingerprint(start_model)}->{model_fp}", trained_fp, unseen_fp,
                    readiness)

    def compute(run):
        sets: dict[str, list[Problem]] = {"trained": read_trained(), "unseen": read_unseen()}
        sampled = sampled_only(cfg)
        scored, paths, backend, tokenizer = [], [], None, None
        for model in (start_model, model_path):
            paths.append(resolve_model_path(model, ctx.ws.models, progress=ctx.progress))
            if scorer is None:  # here; else the eval's workers load the model themselves
                backend, tokenizer = build_backend(paths[-1], cfg, progress=ctx.progress)
            else:
                tokenizer = load_tokenizer(paths[-1], cfg.model.gguf_file)
            template = resolve_template(cfg.model.template, tokenizer)
            records_of = (functools.partial(scorer, sampled, paths[-1], template) if scorer
                          else functools.partial(score_problems, backend, tokenizer,
                                                 cfg=sampled, template=template))
            scored.append(score_sets(records_of, sets, cfg.rewards.extraction))
        gap = gap_of(stage, *scored, heldout=heldout)
        found = gap_findings(gap, cfg.probe.gap_threshold)
        ready, ready_line = {}, ""
        if readiness and sets["unseen"]:
            r = measure_readiness(paths[-1], sets["unseen"], cfg, backend=backend,
                                  tokenizer=tokenizer if backend else None)
            ready, ready_line = r.metrics(), r.line()
            found += readiness_findings(r, cfg, cfg.probe.min_entropy,
                                        cfg.probe.max_zero_variance_share)
        round_no = int(stage.rsplit("-", 1)[1]) if "round-" in stage else None
        ctx.record_lineage(key, "probe", round_no, model_fp, None, {
            "probe_trained": {p.id or p.fingerprint: 1 for p in sets["trained"]},
            "probe_unseen": {p.id or p.fingerprint: 1 for p in sets["unseen"]}})
        found = [f.at(stage) for f in found]
        tracking.set_tags(run, {"findings": " | ".join(f.line() for f in found) or "none"})
        return ProbeResult(gap=gap, readiness=ready, readiness_line=ready_line, findings=found)

    return task_result(cached_stage(ctx, key, f"probe/{stage.split('/')[-1]}", ProbeResult,
                                    compute))
