"""The main job (`grpo run`: R1-Zero vs SFT+GRPO) over several training seeds, pooled.

    GRPO_TORCH_THREADS=1 python bench/main_job_seeds.py [--seeds 0 1 2] [--root DIR]

Each seed is one `grpo run --set project.seed=S` in a workspace of its own under --root
(default .bench/main_job_seeds): a seed whose workspace holds a finished result is read
back, not run again, and a killed run resumes from the stage cache (one command, resumable).
Per seed, from its store (paired over the same held-out problems): GRPO after SFT (SFT
model -> the last round's model), SFT alone, R1-Zero (base -> its last round's model),
the run's own verdict line and wall time; then the paired deltas pooled over the seeds
(grpo_core.eval.paired.pooled_paired_delta: per problem the mean over seeds). The table
goes to stdout with the CPU and load; --json writes it too."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, load

from grpo_core.data.lineage import latest_models
from grpo_core.data.records import model_records
from grpo_core.data.store import Store
from grpo_core.eval.paired import paired_delta, pooled_paired_delta

GRPO = str(Path(sys.executable).with_name("grpo"))
METRIC = "avg@8"
PHASES = {  # phase -> (recipe, from, to): lineage stages, "base" the built-in model
    "GRPO after SFT": ("sft_grpo", "sft", "last"),
    "SFT alone": ("sft_grpo", "base", "sft"),
    "R1-Zero": ("r1_zero", "base", "last"),
}


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


def run_seed(root: Path, seed: int) -> dict:
    """The seed's result: read back when its workspace finished, else `grpo run` first."""
    ws = root / f"seed-{seed}"
    done = ws / "bench_result.json"
    if done.exists():
        return json.loads(done.read_text())
    t0 = time.time()
    env = {**os.environ, "GRPO_WORKDIR": str(ws)}
    out = subprocess.run([GRPO, "run", "--set", f"project.seed={seed}", "--quiet"], cwd=ROOT,
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"seed {seed}: grpo run exited {out.returncode}:\n{out.stderr[-3000:]}")
    verdict = next((line[len("verdict: "):] for line in out.stdout.splitlines()
                    if line.startswith("verdict: ")), "")
    result = {"seed": seed, "wall_s": round(time.time() - t0), "verdict": verdict,
              "workspace": str(ws)}
    done.write_text(json.dumps(result, indent=1))
    return result


def phase_records(ws: str) -> dict[str, tuple[list[dict], list[dict]]]:
    """phase -> (records of the later model, records of the earlier) on the benchmark."""
    with Store.open(Path(ws) / "store.duckdb", read_only=True) as store:
        out = {}
        for phase, (recipe, a, b) in PHASES.items():
            later = model_records(store, model_of(store.con, recipe, b), "synthetic")
            earlier = model_records(store, model_of(store.con, recipe, a), "synthetic")
            out[phase] = (later, earlier)
        return out


def fmt(d: dict) -> str:
    return f"{d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--root", type=Path, default=ROOT / ".bench" / "main_job_seeds")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    a.root.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"GRPO_TORCH_THREADS={os.environ.get('GRPO_TORCH_THREADS', '-')}; load {load()}")
    seeds, pairs = [], {p: [] for p in PHASES}
    for seed in a.seeds:
        res = run_seed(a.root, seed)
        recs = phase_records(res["workspace"])
        res["phases"] = {p: paired_delta(*recs[p], METRIC) for p in PHASES}
        for p in PHASES:
            pairs[p].append(recs[p])
        seeds.append(res)
        print(f"seed {seed} ({res['wall_s']} s, load {load()}): " + "; ".join(
            f"{p} {fmt(d)}" for p, d in res["phases"].items()), flush=True)
    pooled = {p: pooled_paired_delta(pairs[p], METRIC) for p in PHASES}
    print(f"\n| phase ({METRIC}, paired, {len(seeds)} seeds) | "
          + " | ".join(f"seed {s['seed']}" for s in seeds) + " | pooled |")
    print("|---" * (len(seeds) + 2) + "|")
    for p in PHASES:
        print(f"| {p} | " + " | ".join(fmt(s["phases"][p]) for s in seeds)
              + f" | {fmt(pooled[p])} |")
    every = all(s["phases"]["GRPO after SFT"]["delta"] > 0 for s in seeds)
    print(f"\nGRPO after SFT: every seed > 0: {every}; pooled lower bound > 0: "
          f"{pooled['GRPO after SFT']['lo'] > 0}")
    for s in seeds:
        print(f"seed {s['seed']} verdict: {s['verdict']}")
    if a.json:
        a.json.write_text(json.dumps({"seeds": seeds, "pooled": pooled}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
