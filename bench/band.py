"""The difficulty band against its alternatives, on the main job's data flow (sft_grpo:
SFT on the SFT part, then two GRPO rounds on fresh RL-part windows), same GRPO compute in
every arm, several training seeds pooled.

    GRPO_TORCH_THREADS=1 python bench/band.py [--seeds 0 1 2] [--arms band hard] [--json F]

Arms (`filter.*` overrides of configs/recipes/sft_grpo.yaml; the rest as shipped):
  band      [0.3, 0.7], the paper's band
  wide      [0.125, 0.875], the main job's (solved 1-7 of 8)
  hard      [0.125, 0.25] (solved 1-2 of 8)
  unfiltered  no filter: each round trains on its whole fresh window
Per arm and seed: GRPO after SFT on the held-out benchmark (SFT model -> the last round's
model, paired over the same problems), the share of zero-variance groups per step (TRL's
frac_reward_zero_std, mean over both rounds' steps), what the filters kept, and wall time
with the filters' own seconds. Then per arm the gain pooled over the seeds
(grpo_core.eval.paired.pooled_paired_delta). Each cell is one `grpo run` in a workspace of
its own (bench/harness.py: resumable)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness import (
    Cell,
    add_grid_args,
    ci,
    finish,
    machine_line,
    markdown_table,
    run_cells,
    stage_seconds,
)
from main_job_seeds import stage_records

from grpo_core.eval.paired import paired_delta, pooled_paired_delta

CONFIG = "configs/recipes/sft_grpo.yaml"
METRIC = "avg@8"
ARMS = {
    "band": ["filter.band=[0.3,0.7]"],
    "wide": ["filter.band=[0.125,0.875]"],
    "hard": ["filter.band=[0.125,0.25]"],
    "unfiltered": ["filter.enabled=false"],
}
KEPT = re.compile(r"(filter/round-\d+): computed in [\d.]+ s: kept (\d+) of (\d+)")


def cell_of(arm: str, seed: int) -> Cell:
    sets = [f"project.seed={seed}", *ARMS[arm]]
    return Cell(arm, seed, ("run", CONFIG, *[a for s in sets for a in ("--set", s)], "--quiet"))


def zero_std_share(workspace: str) -> float | None:
    """Mean frac_reward_zero_std over every logged GRPO step of the cell's rounds (each
    round's last checkpoint holds its whole log history)."""
    last: dict[Path, tuple[int, Path]] = {}
    for state in Path(workspace).glob("checkpoints/*/grpo-*/checkpoint-*/trainer_state.json"):
        step = int(state.parent.name.split("-")[-1])
        if step > last.get(state.parent.parent, (-1, state))[0]:
            last[state.parent.parent] = (step, state)
    fracs = [row["frac_reward_zero_std"] for _, state in last.values()
             for row in json.loads(state.read_text())["log_history"]
             if "frac_reward_zero_std" in row]
    return sum(fracs) / len(fracs) if fracs else None


def measure(res: dict) -> dict:
    ws = res["workspace"]
    seconds = stage_seconds(ws)
    text = (Path(ws) / "cell.log").read_text(errors="replace")
    later, earlier = stage_records(ws, "sft_grpo", "sft", "last")
    return {"gain": paired_delta(later, earlier, METRIC), "zero_std": zero_std_share(ws),
            "kept": {m[1]: f"{m[2]}/{m[3]}" for m in KEPT.finditer(text)},
            "filter_s": round(sum(s for k, s in seconds.items() if k.startswith("filter/"))),
            "grpo_s": round(sum(s for k, s in seconds.items() if k.startswith("grpo/"))),
            "records": (later, earlier)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    add_grid_args(ap, "band")
    a = ap.parse_args(argv)
    print(machine_line(), flush=True)
    cells = [cell_of(arm, seed) for seed in a.seeds for arm in a.arms]  # seed-major: a
    results = run_cells(cells, a.root, measure)  # stopped bench still compares every arm
    rows = []
    for r in results:
        zs = "-" if r["zero_std"] is None else f"{r['zero_std']:.2f}"
        rows.append([r["arm"], r["seed"], ci(r["gain"]), zs,
                     ", ".join(r["kept"].values()) or "-", r["filter_s"], r["grpo_s"], r["wall_s"]])
    print("\n" + markdown_table(["arm", "seed", f"GRPO after SFT ({METRIC}, paired)",
                                 "zero-std groups", "kept", "filter s", "GRPO s", "wall s"], rows))
    pooled = {}
    for arm in a.arms:
        mine = [r for r in results if r["arm"] == arm]
        pooled[arm] = pooled_paired_delta([r["records"] for r in mine], METRIC)
        print(f"{arm}: pooled over {len(mine)} seeds {ci(pooled[arm])}")
    finish(a.json, pooled, "cells", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
