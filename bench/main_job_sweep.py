"""GRPO after SFT in the main job, by measurement (issue 33, item 4): the sft_grpo recipe on
the built-in model with two rounds, one variant of the GRPO settings per run, all in one
workspace so the data, SFT and eval/sft stages are computed once and served from the cache
after. Per variant: GRPO's own gain over SFT (paired 95% CI, what the parent run's "what
earned it" says), each round's gain, and the run's wall time.

    GRPO_TORCH_THREADS=1 .venv/bin/python bench/main_job_sweep.py --workdir /tmp/sweep
    .venv/bin/python bench/main_job_sweep.py --variant lr3e-5 grpo.learning_rate=3e-5

Resumable: a variant whose run is in the workspace's MLflow store already is read back,
not run again. The printed table is the whole result."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/recipes/sft_grpo.yaml"
TWO_ROUNDS = ["rounds.count=2", "grpo.max_steps=40"]
VARIANTS = {  # name: overrides on top of TWO_ROUNDS
    "shipped (lr 1e-4, beta 0)": [],
    "lr 3e-5": ["grpo.learning_rate=3e-5"],
    "lr 1e-5": ["grpo.learning_rate=1e-5"],
    "lr 3e-4": ["grpo.learning_rate=3e-4"],
    "beta 0.04": ["grpo.beta=0.04"],
    "band 0.3-0.7": ["filter.band=[0.3, 0.7]"],
    "T 0.6 (the eval's)": ["grpo.temperature=0.6"],
    "accuracy reward only": ["rewards.weights=[1.0, 0.0, 0.0]"],
    "G 16": ["grpo.num_generations=16", "grpo.per_device_train_batch_size=128"],
    "80 steps a round": ["grpo.max_steps=80"],
    "loss dr_grpo": ["grpo.loss_type=dr_grpo"],
    # a shorter cold start (R1's is small): room left for GRPO to find
    "SFT 100 steps": ["sft.max_steps=100"],
    "SFT 30 steps": ["sft.max_steps=30"],
}
GAIN = r"([+-]\d\.\d+) \[([+-]?\d\.\d+), ([+-]?\d\.\d+)\]"


def read_gains(note: str) -> dict:
    """GRPO after SFT and each round's gain from the parent run's description."""
    out = {}
    m = re.search(r"GRPO after SFT \((\d+) rounds?\) " + GAIN, note)
    if m:
        out["grpo"] = tuple(float(x) for x in m.groups()[1:])
    found = re.search(r"findings: (.*)", note)
    out["findings"] = found.group(1).replace(" | ", "; ") if found else ""
    for r, *g in re.findall(r"\| eval/round-(\d+) \| eval/\S+ \| " + GAIN, note):
        out[f"round-{r}"] = tuple(float(x) for x in g)
    return out


def parent_note(workdir: Path, run_id: str) -> str:
    """The parent run's description, then its findings (a rolled-back round says so there)."""
    from mlflow import MlflowClient

    run = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}").get_run(run_id)
    return (run.data.tags.get("mlflow.note.content", "") + "\nfindings: "
            + run.data.tags.get("findings", ""))


def run_variant(workdir: Path, name: str, overrides: list[str]) -> tuple[dict, float, str]:
    done_file = workdir / "sweep.json"  # variant -> (parent run id, seconds): resumable
    done = json.loads(done_file.read_text()) if done_file.exists() else {}
    if name not in done:
        args = [str(ROOT / ".venv/bin/grpo"), "run", str(CONFIG), "--quiet", "--workdir", str(workdir)]
        for o in [*TWO_ROUNDS, *overrides]:
            args += ["--set", o]
        t0 = time.time()
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
        seconds = time.time() - t0
        found = re.search(r"parent run: \S+/runs/([0-9a-f]{32})", proc.stdout)
        if proc.returncode != 0 or not found:
            return {}, seconds, f"failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
        done[name] = (found.group(1), seconds)
        workdir.mkdir(parents=True, exist_ok=True)
        done_file.write_text(json.dumps(done, indent=1))
    run_id, seconds = done[name]
    return read_gains(parent_note(workdir, run_id)), seconds, ""


def fmt(g) -> str:
    return f"{g[0]:+.3f} [{g[1]:+.3f}, {g[2]:+.3f}]" if g else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=ROOT / ".grpo-sweep")
    ap.add_argument("--variant", nargs="+", metavar=("NAME", "KEY=VALUE"),
                    help="one variant of your own instead of the built-in list")
    a = ap.parse_args(argv)
    variants = {a.variant[0]: a.variant[1:]} if a.variant else VARIANTS
    print("| variant | GRPO after SFT (2 rounds) | round-1 over SFT | round-2 over round-1 | run s |")
    print("|---|---|---|---|---|")
    for name, overrides in variants.items():
        gains, seconds, err = run_variant(a.workdir, name, overrides)
        grpo = fmt(gains.get("grpo")) if gains.get("grpo") else (
            f"none kept: {gains.get('findings') or 'no GRPO stage'}")
        print(f"| {name} | {err or grpo} | {fmt(gains.get('round-1'))} | "
              f"{fmt(gains.get('round-2'))} | {seconds:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
