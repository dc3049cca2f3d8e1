"""The quick tier (`make test-fast`): tests/heavy.txt names tests that exist (a renamed
test would silently come back into the quick tier otherwise), and tests/update_heavy.py
reads pytest's durations report."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_heavy_id_names_a_test_that_exists():
    from conftest import heavy_ids

    ids = heavy_ids()
    assert len(ids) > 50
    missing = []
    for node in sorted(ids):
        path, _, name = node.partition("::")
        file = ROOT / path
        funcs = ({n.name for n in ast.walk(ast.parse(file.read_text()))
                  if isinstance(n, ast.FunctionDef)} if file.is_file() else set())
        if name.split("::")[-1] not in funcs:
            missing.append(node)
    assert missing == []


def test_update_heavy_reads_a_durations_report():
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from update_heavy import heavy_from
    finally:
        sys.path.remove(str(ROOT / "tests"))
    report = """============================= slowest durations ==============================
12.50s call     tests/test_a.py::test_slow[x-1]
1.00s setup    tests/test_b.py::test_fixture_heavy
0.99s call     tests/test_c.py::test_quick
0.20s teardown tests/test_a.py::test_slow[x-2]
"""
    assert heavy_from(report, 1.0) == ["tests/test_a.py::test_slow", "tests/test_b.py::test_fixture_heavy"]
