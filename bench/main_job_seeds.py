"""The main job (`grpo run`: R1-Zero vs SFT+GRPO) over several training seeds, pooled.

    GRPO_TORCH_THREADS=1 python bench/main_job_seeds.py [--seeds 0 1 2] [--root DIR]
        [--config CONFIG --set k=v ...]

--config runs that config instead of the main job (e.g. SmolLM2's: its model name resolved
here, as `grpo run` does, so every seed's workspace reads the same fetched folder), with
`--set` overrides; the phases are those of its project.recipes, scored by its
eval.primary_metric (the main job: avg@8), strict and, for greedy, flexible too.

Each seed is one `grpo run --set project.seed=S` in a workspace of its own under --root
(default .bench/main_job_seeds; bench/harness.py: a finished seed is read back, not run
again, and a killed run resumes from the stage cache: one command, resumable).
Per seed, from its store (paired over the same held-out problems): GRPO after SFT (SFT
model -> the last round's model), SFT alone, R1-Zero (base -> its last round's model),
the run's own verdict line and wall time; then the paired deltas pooled over the seeds
(grpo_core.eval.paired.pooled_paired_delta: per problem the mean over seeds). The table
goes to stdout with the CPU and load; --json writes it too."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import (
    Cell,
    add_grid_args,
    ci,
    finish,
    machine_line,
    markdown_table,
    resolved_model,
    run_cells,
)

from grpo_core.data.lineage import latest_models
from grpo_core.data.records import model_records
from grpo_core.data.store import Store
from grpo_core.eval.paired import paired_delta, pooled_paired_delta

METRIC = "avg@8"
PHASES = {  # phase -> (recipe, from, to): lineage stages, "base" the built-in model
    "GRPO after SFT": ("sft_grpo", "sft", "last"),
    "SFT alone": ("sft_grpo", "base", "sft"),
    "R1-Zero": ("r1_zero", "base", "last"),
}
VERDICT = "verdict: "


def model_of(con, recipe: str, which: str) -> str:
    """The fingerprint of `recipe`'s base model, SFT model or last round's model."""
    if which == "last":
        return dict(latest_models(con))[recipe]
    stage = "sft" if which == "sft" else None
    row = con.execute(
        "SELECT model_out, model_in FROM lineage WHERE recipe = ? AND stage = ? "
        "ORDER BY created_at LIMIT 1" if stage else
        "SELECT model_in, model_in FROM lineage WHERE recipe = ? AND model_out IS NOT NULL "
        "ORDER BY created_at LIMIT 1", [recipe, stage] if stage else [recipe]).fetchone()
    return row[0]


def stage_records(ws: str, recipe: str, earlier: str, later: str,
                  bench: str = "synthetic") -> tuple[list[dict], list[dict]]:
    """(records of the later model, records of the earlier) of `recipe` on the benchmark,
    from the workspace's store: the pair a paired delta reads."""
    with Store.open(Path(ws) / "store.duckdb", read_only=True) as store:
        return (model_records(store, model_of(store.con, recipe, later), bench),
                model_records(store, model_of(store.con, recipe, earlier), bench))


def cut_off(records: list[dict]) -> float:
    """The share of a model's greedy answers cut off at eval.max_new_tokens."""
    return sum(bool(r.get("greedy_truncated")) for r in records) / max(len(records), 1)


def verdict_of(ws: str) -> str:
    text = (Path(ws) / "cell.log").read_text(errors="replace")
    return next((line[len(VERDICT):] for line in text.splitlines()
                 if line.startswith(VERDICT)), "")


def grid(a) -> tuple[list[Cell], dict, list[str]]:
    """The cells (one `grpo run` per seed), the phases measured and the metrics read."""
    if a.config is None:
        return ([Cell("main-job", s, ("run", "--set", f"project.seed={s}")) for s in a.seeds],
                PHASES, [METRIC])
    from grpo_core.config import load_config

    cfg = load_config(a.config, a.overrides)
    model = resolved_model(cfg.model.name_or_path, cfg.project.workdir)
    sets = [*a.overrides, f"model.name_or_path={model}"]
    recipes = cfg.project.recipes or [cfg.project.recipe]
    metric = cfg.eval.primary_metric
    metrics = [metric, f"flexible/{metric}"] if metric.startswith("greedy") else [metric]
    return ([Cell(Path(a.config).stem, s, ("run", a.config, *[x for o in
                  [*sets, f"project.seed={s}"] for x in ("--set", o)], "--quiet"))
             for s in a.seeds],
            {p: v for p, v in PHASES.items() if v[0] in recipes}, metrics)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_args(ap, "main_job_seeds")
    ap.add_argument("--config", help="a config to run instead of the main job")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="an override of --config's fields (repeatable)")
    a = ap.parse_args(argv)
    print(machine_line(), flush=True)
    cells, phases, metrics = grid(a)
    seeds = run_cells(cells, a.root, lambda r: {
        "records": {p: stage_records(r["workspace"], *phases[p]) for p in phases},
        "verdict": verdict_of(r["workspace"])})
    rows, pooled = [], {}
    for m in metrics:
        for s in seeds:
            s.setdefault("phases", {}).update(
                {f"{p} ({m})": paired_delta(*s["records"][p], m) for p in phases})
        pooled.update({f"{p} ({m})": pooled_paired_delta([s["records"][p] for s in seeds], m)
                       for p in phases})
        rows += [[f"{p} ({m})", *[ci(s["phases"][f"{p} ({m})"]) for s in seeds],
                  ci(pooled[f"{p} ({m})"])] for p in phases]
    for s in seeds:  # the eval budget must not decide a delta: the cut-off shares beside it
        s["cut_off"] = {p: [cut_off(r) for r in s["records"][p][::-1]] for p in phases}
    rows += [[f"{p}: greedy answers cut off, before -> after",
              *[" -> ".join(f"{x:.1%}" for x in s["cut_off"][p]) for s in seeds], ""]
             for p in phases]
    print("\n" + markdown_table(
        [f"phase (paired, {len(seeds)} seeds)", *[f"seed {s['seed']}" for s in seeds], "pooled"],
        rows))
    after = f"GRPO after SFT ({metrics[0]})"
    if after in pooled:
        every = all(s["phases"][after]["delta"] > 0 for s in seeds)
        print(f"\nGRPO after SFT: every seed > 0: {every}; pooled lower bound > 0: "
              f"{pooled[after]['lo'] > 0}")
    for s in seeds:
        print(f"seed {s['seed']} ({s['wall_s']} s) verdict: {s['verdict']}")
    finish(a.json, pooled, "seeds", seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
