"""Scoring's two slow cases, right answers and unreadable ones, for this checkout and,
side by side in one run, another checkout's code (`--against`).

    .venv/bin/python bench/scoring_paths.py [--against /path/to/other/checkout]
                                            [--golds 5000] [--hostile 64]

Each row runs each side in a fresh process (sympy's caches would otherwise let the second
side reuse the first one's work):

- right answers: every MATH test gold (bench/math_pairs.py, ../shared/data) against itself,
  `answers.is_correct(completion, gold)` one pair per call, the completion written
  `... $\\boxed{gold}$.`; pairs per CPU second (time.process_time: a busy machine slows
  both sides alike), after `answers.warm_up()` (math-verify's import and first-use costs).
- right + wrong: the same pairs plus each gold against a deranged other gold (gold i+7);
  pairs per CPU second (target >= 2,000).
- unreadable: a batch of `--hostile` completions
  `<answer>__import__('os').system('touch x<i>')</answer>` against gold 7 through the
  accuracy reward (grpo_core.verify.rewards.accuracy), seconds per completion: the first
  completion of a fresh process (imports of grpo_core paid before the clock starts, the
  scorer's own first-use costs inside it) and the rest of the batch, one call each.

The ratio column is the other side's time over this checkout's; "agree" compares the two
sides' verdicts pair by pair.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from math_pairs import completion, math_golds  # noqa: E402


def _pairs(golds: list[str], wrong: bool) -> list[tuple[str, str]]:
    out = []
    for i, g in enumerate(golds):
        out.append((g, completion(g)))
        if wrong:
            out.append((g, completion(golds[(i + 7) % len(golds)])))
    return out


def measure_pairs(n_golds: int, wrong: bool) -> dict:
    from grpo_core.verify import answers

    answers.warm_up()
    answers.clear_caches()
    pairs = _pairs(math_golds()[:n_golds], wrong)
    start = time.process_time()
    verdicts = [bool(answers.is_correct(c, g)) for g, c in pairs]
    return {"seconds": time.process_time() - start, "verdicts": verdicts}


def measure_hostile(n: int) -> dict:
    from grpo_core.verify.rewards import accuracy

    batch = [f"<answer>__import__('os').system('touch x{i}')</answer>" for i in range(n)]
    start = time.perf_counter()
    first = accuracy(batch[:1], answer=["7"])
    first_s = time.perf_counter() - start
    verdicts, start = list(first), time.perf_counter()
    for c in batch[1:]:
        verdicts += accuracy([c], answer=["7"])
    rest_s = (time.perf_counter() - start) / max(1, n - 1)
    return {"first": first_s, "rest": rest_s, "verdicts": verdicts}


def _run(code: str, kind: str, n: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", code, kind, str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=code)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="another checkout whose code to measure beside this one")
    ap.add_argument("--golds", type=int, default=5000, help="MATH golds scored (at most 5,000)")
    ap.add_argument("--hostile", type=int, default=64, help="unreadable completions in the batch")
    ap.add_argument("--worker", nargs=3, metavar=("CODE", "KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        code, kind, n = args.worker
        sys.path.insert(0, code)
        out = (measure_hostile(int(n)) if kind == "hostile"
               else measure_pairs(int(n), wrong=kind == "right+wrong"))
        print(json.dumps(out))
        return
    sides = [("this checkout", str(ROOT))]
    if args.against:
        sides.append(("--against", str(Path(args.against).resolve())))
    n_golds = min(args.golds, len(math_golds()))
    print(f"{'row':14} {'code':14} {'n':>6} {'pairs/s':>9} {'ratio':>7} {'agree':>7}")
    for kind in ("right", "right+wrong"):
        if not n_golds:
            print(f"{kind:14} skipped (no MATH golds under ../shared/data)")
            continue
        res = [_run(code, kind, n_golds) for _, code in sides]
        for (name, _), r in zip(sides, res):
            n = len(r["verdicts"])
            ratio = r["seconds"] / res[0]["seconds"]
            agree = sum(a == b for a, b in zip(r["verdicts"], res[0]["verdicts"])) / n
            print(f"{kind:14} {name:14} {n:6d} {n / r['seconds']:9.0f} {ratio:6.1f}x {agree:7.4f}")
    print(f"\n{'unreadable':14} {'code':14} {'n':>6} {'first s':>9} {'rest ms':>9} {'ratio':>7}"
          f" {'rewards':>8}")
    res = [_run(code, "hostile", args.hostile) for _, code in sides]
    for (name, _), r in zip(sides, res):
        ratio = r["rest"] / res[0]["rest"]
        print(f"{'accuracy':14} {name:14} {len(r['verdicts']):6d} {r['first']:9.3f} "
              f"{1000 * r['rest']:9.3f} {ratio:6.1f}x {sorted(set(r['verdicts']))!s:>8}")


if __name__ == "__main__":
    main()
