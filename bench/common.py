"""Shared by the bench scripts (run as `python bench/<name>.py`, so this folder is on
sys.path): the repository root on sys.path, a timer, the load average for the report."""
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())
