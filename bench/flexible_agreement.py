"""Flexible-extraction agreement: how often `is_correct(..., extraction="flexible")` gives the
right verdict on completions with no box, tag or answer marker (its last-resort fallback),
for this checkout and, side by side in one run, another checkout's code (`--against`).

    .venv/bin/python bench/flexible_agreement.py [--against /path/to/other/checkout]

Rows (inputs from ../shared/data; a row is skipped when its file is absent):
- GSM8K: each test solution as a completion (calculator annotations `<<..>>` and the
  `#### n` line removed, so its last sentence states the answer in prose, `$` signs and
  all), against its own gold (right) and the next row's gold (wrong).
- MATH raw answers: each MATH test gold (MATH-500 + the other 4,500) written bare inside a
  sentence, "So the result is <gold>.", against itself (right) and the next distinct gold
  (wrong). This is where the last number alone splits `\\frac{3}{4}` into 4.
- MATH bare answers: the same pairs, the completion being the answer alone (`14 \\pi`,
  `0,1`), as raw answers are graded.
- MATH boxed, strict: the same pairs written "So the result is $\\boxed{<gold>}$." and read by
  the strict extraction: the reference the flexible rows are held to (within 1 point).
Agreement is the share of right verdicts; false rejections / acceptances are counted.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from math_pairs import math_golds, shared_data  # noqa: E402


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def gsm8k_cases() -> list[tuple[str, str, bool]]:
    path = shared_data() / "gsm8k" / "test.jsonl"
    if not path.is_file():
        return []
    rows = _rows(path)
    out = []
    for i, r in enumerate(rows):
        body, gold = r["answer"].rsplit("####", 1)
        text = re.sub(r"<<[^>]*>>", "", body).strip()
        other = rows[(i + 1) % len(rows)]["answer"].rsplit("####", 1)[1]
        out.append((text, gold.strip().replace(",", ""), True))
        if other.strip() != gold.strip():
            out.append((text, other.strip().replace(",", ""), False))
    return out


def math_raw_cases(form: str = "So the result is {}.") -> list[tuple[str, str, bool]]:
    golds = math_golds()
    out = []
    for i, g in enumerate(golds):
        other = next((h for h in golds[i + 1 :] + golds[:i] if h != g), None)
        out.append((form.format(g), g, True))
        if other is not None:
            out.append((form.format(other), g, False))
    return out


# kind -> (row label, completions, extraction)
ROWS = {
    "gsm8k": ("GSM8K solutions", gsm8k_cases, "flexible"),
    "math": ("MATH raw answers", math_raw_cases, "flexible"),
    "math-bare": ("MATH bare answers", lambda: math_raw_cases("{}"), "flexible"),
    "math-strict": ("MATH boxed, strict",
                    lambda: math_raw_cases("So the result is $\\boxed{{{}}}$."), "strict"),
}


def worker(code: str, kind: str) -> None:
    sys.path.insert(0, code)
    from grpo_core.verify import answers

    _, cases, extraction = ROWS[kind]
    cases = cases()
    answers.warm_up()
    verdicts = [answers.is_correct(c, g, extraction=extraction) for c, g, _ in cases]
    print(json.dumps([bool(v) for v in verdicts]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="another checkout whose code to measure beside this one")
    ap.add_argument("--worker", nargs=2, metavar=("CODE", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    sides = [("this checkout", str(ROOT))]
    if args.against:
        sides.append((f"--against {args.against}", str(Path(args.against).resolve())))
    print(f"{'completions':28} {'code':34} {'n':>6} {'agree':>7} {'false rej':>10} {'false acc':>10}")
    agreement = {}
    for kind, (label, cases, _) in ROWS.items():
        cases = cases()
        if not cases:
            print(f"{label:28} skipped (no data under {shared_data()})")
            continue
        for name, code in sides:
            proc = subprocess.run([sys.executable, __file__, "--worker", code, kind],
                                  capture_output=True, text=True, check=True, cwd=code)
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            want = [w for _, _, w in cases]
            agree = sum(g == w for g, w in zip(got, want)) / len(want)
            rej = sum(w and not g for g, w in zip(got, want))
            acc = sum(g and not w for g, w in zip(got, want))
            agreement[kind, name] = agree
            print(f"{label:28} {name:34} {len(want):6d} {agree:7.4f} {rej:10d} {acc:10d}")
    for name, _ in sides:
        strict = agreement.get(("math-strict", name))
        if strict is not None:
            gaps = [strict - agreement[kind, name] for kind in ("math", "math-bare")]
            met = "met" if max(gaps) <= 0.01 else "NOT met"
            print(f"target, {name}: flexible on raw answers within 1 point of strict: {met} "
                  f"(raw {100 * gaps[0]:+.2f}, bare {100 * gaps[1]:+.2f} points below)")


if __name__ == "__main__":
    main()
