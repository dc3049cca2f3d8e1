"""How the pipeline's cost grows with the training pool (issue 25).

    .venv/bin/python bench/data_scale.py [--sizes 10000,100000,1000000] [--no-run | --run-only]

For each size, in a temporary folder (never committed): a pool of that many rows, half
GSM8K-shaped (question, "... #### n") and half MATH-shaped (problem, solution with
\\boxed{}, "Level k", type), as two JSONL files. Then, each step its own process (peak RSS
from os.wait4):
  ingest    the five benchmarks' eval splits (../shared/data), then the two files (each
            new training row checked against every eval set), then the pool (SQL)
  decontam  `grpo data decontam`: every flag recomputed from scratch
  grpo run  the quickstart shape on that pool, with the SFT cold start: SFT on 64 traces
            (4 steps), filter.max_problems 64 x k 4, 2 GRPO steps, 20 eval problems; then
            the same command again (served from the cache). Its data stage ingests the
            files into the run's own store (`--run-only`: the grpo runs alone, without the
            separate ingest and decontam steps above)
Prints per-stage seconds and peak RSS per size, and the ratio of the largest size to the
smallest. The targets (issue 25): ingest + decontamination at 1M within 3 min and 3 GB;
filter, GRPO and eval within 1.2x of their 10k time; the cached rerun's memory within 1.2x;
a cache hit under 1 s."""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, load

BENCHMARKS = ["gsm8k", "math500", "aime24", "aime25", "amc23"]
DATA_DIR = ROOT.parent / "shared" / "data"
SUBJECTS = ["Algebra", "Geometry", "Number Theory", "Counting & Probability", "Precalculus"]


def write_pool(folder: Path, n: int) -> list[Path]:
    """n distinct rows: n/2 GSM8K-shaped, n/2 MATH-shaped (levels 1-5, five subjects)."""
    gsm, math = folder / "gsm8k_like.jsonl", folder / "math_like.jsonl"
    with gsm.open("w") as g, math.open("w") as m:
        for i in range(n // 2):
            a, b, c = i % 97 + 3, i // 97 + 2, i % 13 + 1
            g.write(json.dumps({
                "question": f"A baker makes {a} trays of {b} rolls each morning and sells all "
                            f"but {c} rolls by noon (order {i}). How many rolls were sold?",
                "answer": f"{a} * {b} = {a * b} rolls; {a * b} - {c} = {a * b - c}\n#### "
                          f"{a * b - c}"}) + "\n")
            m.write(json.dumps({
                "problem": f"Let $f(x) = {a}x^2 + {b}x + {c}$ (case {i}). Compute $f({c})$.",
                "solution": f"$f({c}) = {a}\\cdot{c * c} + {b}\\cdot{c} + {c} = "
                            f"\\boxed{{{a * c * c + b * c + c}}}$.",
                "level": f"Level {i % 5 + 1}", "type": SUBJECTS[i % 5]}) + "\n")
    return [gsm, math]


def measured(cmd: list[str], env: dict | None = None) -> tuple[str, float, float]:
    """(output, seconds, peak RSS GB) of one child process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env or os.environ.copy(), text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        out.seek(0)
        text = out.read()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{text[-4000:]}")
    return text, seconds, usage.ru_maxrss / 1024 ** 2  # KiB -> GiB


def child_ingest(db: str, files: list[str]) -> None:
    """(--child-ingest) the ingest step, in its own process; prints its timings as JSON."""
    from grpo_core.config import PipelineConfig
    from grpo_core.data.adapters import resolve_source
    from grpo_core.data.benchmarks import eval_split
    from grpo_core.data.pool import build_pool, training_sets
    from grpo_core.data.store import Store

    cfg = PipelineConfig.model_validate({"data": {"train": [{"source": f} for f in files]},
                                         "eval": {"benchmarks": BENCHMARKS}})
    out = {}
    with Store.open(db) as store:
        t0 = time.perf_counter()
        for b in BENCHMARKS:
            store.ingest(resolve_source(b, split=eval_split(b), data_dir=DATA_DIR))
        t1 = time.perf_counter()
        reports = [store.ingest(resolve_source(f)) for f in files]
        t2 = time.perf_counter()
        # peak so far: the ingest alone, before the pool build (other work, other memory)
        ingest_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
        pool = build_pool(cfg, store, training_sets(cfg, reports))
        t3 = time.perf_counter()
    out = {"eval_sets_s": t1 - t0, "train_ingest_s": t2 - t1, "pool_s": t3 - t2,
           "ingest_only_gb": ingest_gb,
           "pool_size": pool.size, "contaminated": sum(r.contaminated for r in reports),
           "duplicates": sum(r.duplicates for r in reports)}
    print("RESULT " + json.dumps(out))


def run_config(folder: Path, files: list[Path], n: int) -> Path:
    import yaml

    cfg = {"extends": str(ROOT / "configs/quickstart.yaml"),
           "project": {"name": f"scale-{n}", "recipe": "r1_zero"},
           "data": {"train": [{"source": str(f)} for f in files]},
           "filter": {"k": 4, "band": [0.3, 0.7], "max_problems": 64},
           # the SFT stage reads its 64 traces of the pool, not the pool (tasks/stage_data.py)
           "sft_stage": {"enabled": True, "max_examples": 64},
           "sft": {"max_steps": 4, "per_device_train_batch_size": 16},
           "grpo": {"max_steps": 2, "save_steps": 1},
           "eval": {"benchmarks": ["synthetic"], "limit": 20, "samples": 4}}
    path = folder / "scale.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def stage_seconds(log: str, how: str = r"computed|cached|reused from \S+") -> dict[str, float]:
    """{stage: seconds} of the stage end lines of a `grpo run` log; `how`: "cached" keeps
    the cache hits only ("model" only names the model's folder: never cached; an eval
    "reused from" another's is a cache hit too)."""
    return {s: float(t) for s, _, t in
            re.findall(rf" - (\S+): ({how}) in ([0-9.]+) s", log)}


def one_size(n: int, root: Path, run: bool, ingest: bool = True) -> dict:
    folder = root / f"n{n}"
    folder.mkdir()
    files = write_pool(folder, n)
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    py = [sys.executable]
    row = {"rows": n, "file_mb": round(size_mb, 1)}
    if ingest:
        row.update(ingest_steps(folder, files, py))
    if run:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
        env.update(GRPO_WORKDIR=str(folder / "ws"), PYTHONUNBUFFERED="1")
        cmd = py + ["-m", "flows.cli", "run", str(run_config(folder, files, n)), "--quiet"]
        log, run_s, run_gb = measured(cmd, env)
        again, rerun_s, rerun_gb = measured(cmd, env)
        row.update(run_s=run_s, run_gb=run_gb, rerun_s=rerun_s, rerun_gb=rerun_gb,
                   stages=stage_seconds(log), cached=stage_seconds(again, r"cached|reused from \S+"))
    print(f"[{n} rows done at load {load()}] {json.dumps(row)}", flush=True)
    return row


def ingest_steps(folder: Path, files: list[Path], py: list[str]) -> dict:
    text, ingest_s, ingest_gb = measured(py + [__file__, "--child-ingest", str(folder / "s.duckdb"),
                                               *map(str, files)])
    res = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    _, decontam_s, decontam_gb = measured(py + ["-m", "flows.cli", "data", "decontam", "--db",
                                                str(folder / "s.duckdb")])
    return {"ingest_s": ingest_s, "ingest_gb": ingest_gb, **res, "decontam_s": decontam_s,
            "decontam_gb": decontam_gb}


def table(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    lines = ["| | " + " | ".join(f"{r['rows']:,} rows" for r in rows)
             + f" | {last['rows'] // first['rows']}x rows: ratio |", "|---" * (len(rows) + 2) + "|"]

    def add(label, get, fmt="{:.2f}"):
        vals = [get(r) for r in rows]
        if any(v is None for v in vals):
            return
        ratio = f"{vals[-1] / vals[0]:.2f}x" if vals[0] else "-"
        lines.append(f"| {label} | " + " | ".join(fmt.format(v) for v in vals) + f" | {ratio} |")

    add("source files (MB)", lambda r: r.get("file_mb"), "{:.1f}")
    add("ingest + decontam + pool (s)", lambda r: r.get("ingest_s"))
    add("  of which training rows (s)", lambda r: r.get("train_ingest_s"))
    add("  of which pool build (s)", lambda r: r.get("pool_s"))
    add("ingest peak RSS, pool build included (GB)", lambda r: r.get("ingest_gb"))
    add("  peak before the pool build (GB)", lambda r: r.get("ingest_only_gb"))
    add("`grpo data decontam`, all flags again (s)", lambda r: r.get("decontam_s"))
    add("decontam peak RSS (GB)", lambda r: r.get("decontam_gb"))
    if "stages" in last:
        for stage in last["stages"]:
            add(f"run: {stage} (s)", lambda r, s=stage: r["stages"].get(s))
        add("run: whole `grpo run` (s)", lambda r: r["run_s"])
        add("run: peak RSS (GB)", lambda r: r["run_gb"])
        add("rerun: slowest cache hit (s)", lambda r: max(r["cached"].values()))
        for stage in last["cached"]:
            add(f"rerun: {stage} from the cache (s)", lambda r, s=stage: r["cached"].get(s))
        add("rerun: whole `grpo run` (s)", lambda r: r["rerun_s"])
        add("rerun: peak RSS (GB)", lambda r: r["rerun_gb"])
    return "\n".join(lines)


# The targets for the stages after ingest (largest size against the smallest).
STAGE_TARGETS = ("sft", "filter/round-1", "grpo/round-1", "eval/round-1")


def targets(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    if "stages" not in last:
        return ""
    out = [f"{s} {last['stages'][s] / first['stages'][s]:.2f}x (<= 1.2x)"
           for s in STAGE_TARGETS if s in last["stages"] and first["stages"].get(s)]
    out.append(f"cached-rerun peak RSS {last['rerun_gb'] / first['rerun_gb']:.2f}x (<= 1.2x)")
    stage, hit = max(last["cached"].items(), key=lambda kv: kv[1])
    out.append(f"slowest cache hit at {last['rows']:,} rows {hit:.2f} s, {stage} (< 1 s)")
    return f"targets, {last['rows']:,} vs {first['rows']:,} rows: " + "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--no-run", action="store_true", help="Ingest and decontam only.")
    ap.add_argument("--run-only", action="store_true",
                    help="The grpo runs only (their data stage ingests); no separate ingest step.")
    ap.add_argument("--child-ingest", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_ingest:
        return child_ingest(a.child_ingest[0], a.child_ingest[1:])
    print(f"load average at start {load()}, {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="grpo-data-scale-") as tmp:
        rows = [one_size(int(n), Path(tmp), not a.no_run, not a.run_only)
                for n in a.sizes.split(",")]
    print(f"\nload average at end {load()}\n")
    print(table(rows))
    print(targets(rows))


if __name__ == "__main__":
    main()
