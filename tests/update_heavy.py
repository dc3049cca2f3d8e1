"""Writes tests/heavy.txt from a durations report: every test of the default suite whose
setup, call or teardown took at least --threshold seconds (node ids without parameters).

    .venv/bin/python -m pytest -q --durations=0 > durations.log
    .venv/bin/python tests/update_heavy.py durations.log [--threshold 1.0]

`make test-fast` then leaves those tests out (the `heavy` marker, tests/conftest.py)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(tests/\S+)")
HEADER = ("# The default suite's tests taking seconds or more on a 2-core CPU (written by\n"
          "# tests/update_heavy.py from `pytest --durations=0`); `make test-fast` leaves them out.\n")


def heavy_from(report: str, threshold: float) -> list[str]:
    ids = {m[2].split("[")[0] for line in report.splitlines()
           if (m := LINE.match(line)) and float(m[1]) >= threshold}
    return sorted(ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--threshold", type=float, default=1.0)
    a = ap.parse_args(argv)
    ids = heavy_from(a.report.read_text(errors="replace"), a.threshold)
    Path(__file__).with_name("heavy.txt").write_text(HEADER + "".join(f"{i}\n" for i in ids))
    print(f"{len(ids)} heavy tests (>= {a.threshold} s) -> tests/heavy.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
