"""The one harness of the A/B benches: arms x seeds, each cell one `grpo` command in a
workspace of its own, resumable by content, the machine and load in one line, one table
printer, JSON out.

    cells = [Cell(arm, seed, ["run", CONFIG, "--set", f"project.seed={seed}", ...]), ...]
    results = run_cells(cells, root)          # a finished cell is read back, not run again
    print(markdown_table(["arm", "seed", ...], rows))

A cell's workspace is named by its arm, seed and the hash of its command, so an edited
command is a new cell and a killed bench resumes: finished cells are read back and a
killed cell's `grpo` command resumes from the stage cache. Each cell keeps its output in
`cell.log` beside the store; `stage_seconds` reads the stage lines back from it."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Every bench runs as `python bench/<name>.py`, so this folder is on sys.path: importing
# this module also puts the repository root there (grpo_core, tasks, flows).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
GRPO = str(Path(sys.executable).with_name("grpo"))
STAGE_LINE = re.compile(r"(?P<stage>[\w/-]+): (?:computed|cached|reused from \S+) in "
                        r"(?P<seconds>[\d.]+) s")


@dataclass(frozen=True)
class Cell:
    """One arm at one seed: the `grpo` arguments that run it (GRPO_WORKDIR is the cell's)."""

    arm: str
    seed: int
    args: tuple[str, ...]

    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.arm, self.seed, self.args]).encode()).hexdigest()[:10]

    def workspace(self, root: Path) -> Path:
        return root / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.arm)}-s{self.seed}-{self.key()}"


def timed(fn):
    """(fn(), its wall seconds)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def load() -> str:
    """The load average, `1m/5m/15m`, for the report."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def resolved_model(name: str, workdir: str | None = None) -> str:
    """A model as `grpo run` resolves it: a fetched name to its folder in the workspace
    (`workdir`, else $GRPO_WORKDIR or .grpo), a built-in to its build, a folder or hub id as
    it is. A fetchable name not fetched yet stops the bench in one line naming `grpo model
    fetch` (exit 2), before any load could wait on the hub."""
    from grpo_core.modeling.fetch import NotFetchedError
    from grpo_core.modeling.loading import resolve_model_path
    from grpo_core.workspace import Workspace

    try:
        return resolve_model_path(name, Workspace.at(workdir).models, progress=True)
    except NotFetchedError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None


def machine_line() -> str:
    """The CPU, cores, torch threads and load average the figures were taken under."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"machine: {cpu}, {os.cpu_count()} cores; GRPO_TORCH_THREADS="
            f"{os.environ.get('GRPO_TORCH_THREADS', '-')}; load {load()}")


def run_cell(cell: Cell, root: Path) -> dict:
    """The cell's result: read back when its workspace finished, else run its command
    first. A failing command stops the bench with its output's tail (the cell resumes)."""
    ws = cell.workspace(root)
    done = ws / "cell.json"
    if done.exists():
        return json.loads(done.read_text())
    ws.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(ws / "cell.log", "w") as log:
        rc = subprocess.run([GRPO, *cell.args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "GRPO_WORKDIR": str(ws)}, check=False).returncode
    if rc != 0:
        tail = (ws / "cell.log").read_text()[-3000:]
        sys.exit(f"{cell.arm} seed {cell.seed}: grpo exited {rc} ({ws / 'cell.log'}):\n{tail}")
    result = {"arm": cell.arm, "seed": cell.seed, "args": list(cell.args),
              "wall_s": round(time.time() - t0), "load_after": load(), "workspace": str(ws)}
    done.write_text(json.dumps(result, indent=1))
    return result


def run_cells(cells: list[Cell], root: Path, measure=None) -> list[dict]:
    """Every cell in order, each result with `measure(result)`'s keys added when given; a
    line per cell as it finishes."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for cell in cells:
        res = run_cell(cell, root)
        if measure is not None:
            res = {**res, **measure(res)}
        print(f"{cell.arm} seed {cell.seed}: {res['wall_s']} s (load {load()})", flush=True)
        out.append(res)
    return out


def stage_seconds(workspace: str | Path) -> dict[str, float]:
    """Stage -> seconds, from the stage lines of the cell's log (`filter/round-1: computed
    in 57.3 s: ...`)."""
    text = (Path(workspace) / "cell.log").read_text(errors="replace")
    return {m["stage"]: float(m["seconds"]) for m in STAGE_LINE.finditer(text)}


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A markdown table; cells as they are (format numbers before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ci(d: dict | None) -> str:
    """A paired delta `{delta, lo, hi}` as `+0.012 [-0.003, +0.027]`."""
    if not d:
        return "-"
    return f"{d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


def write_json(path: Path | None, obj) -> None:
    if path is not None:
        path.write_text(json.dumps(obj, indent=1, default=float))
        print(f"json: {path}")


def finish(path: Path | None, pooled: dict, name: str, results: list[dict]) -> None:
    """A bench's last lines: the machine and load again, then `--json` (the pooled figures and
    every cell's result but its per-problem records)."""
    print(machine_line())
    write_json(path, {"machine": machine_line(), "pooled": pooled,
                      name: [{k: v for k, v in r.items() if k != "records"} for r in results]})


def add_grid_args(ap, root_name: str, seeds=(0, 1, 2)) -> None:
    """--seeds, --root (default .bench/<root_name>) and --json, the same in every bench."""
    ap.add_argument("--seeds", type=int, nargs="+", default=list(seeds))
    ap.add_argument("--root", type=Path, default=ROOT / ".bench" / root_name)
    ap.add_argument("--json", type=Path)
