"""The main job (`grpo run`: R1-Zero vs SFT+GRPO) over several training seeds, pooled.

    GRPO_TORCH_THREADS=1 python bench/main_job_seeds.py [--seeds 0 1 2] [--root DIR]

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

from harness import Cell, add_grid_args, ci, finish, machine_line, markdown_table, run_cells

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


def verdict_of(ws: str) -> str:
    text = (Path(ws) / "cell.log").read_text(errors="replace")
    return next((line[len(VERDICT):] for line in text.splitlines()
                 if line.startswith(VERDICT)), "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_args(ap, "main_job_seeds")
    a = ap.parse_args(argv)
    print(machine_line(), flush=True)
    cells = [Cell("main-job", s, ("run", "--set", f"project.seed={s}")) for s in a.seeds]
    seeds = run_cells(cells, a.root, lambda r: {
        "records": {p: stage_records(r["workspace"], *PHASES[p]) for p in PHASES},
        "verdict": verdict_of(r["workspace"])})
    for s in seeds:
        s["phases"] = {p: paired_delta(*s["records"][p], METRIC) for p in PHASES}
    pooled = {p: pooled_paired_delta([s["records"][p] for s in seeds], METRIC) for p in PHASES}
    print("\n" + markdown_table(
        [f"phase ({METRIC}, paired, {len(seeds)} seeds)", *[f"seed {s['seed']}" for s in seeds],
         "pooled"],
        [[p, *[ci(s["phases"][p]) for s in seeds], ci(pooled[p])] for p in PHASES]))
    every = all(s["phases"]["GRPO after SFT"]["delta"] > 0 for s in seeds)
    print(f"\nGRPO after SFT: every seed > 0: {every}; pooled lower bound > 0: "
          f"{pooled['GRPO after SFT']['lo'] > 0}")
    for s in seeds:
        print(f"seed {s['seed']} ({s['wall_s']} s) verdict: {s['verdict']}")
    finish(a.json, pooled, "seeds", seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
