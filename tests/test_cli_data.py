"""`grpo data ...`: exit codes 0/1/2, printed counts, one-line errors, --help everywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import grpo_core.verify.answers  # noqa: F401 - the ingest parses golds: must import, not skip
from flows.cli import app

runner = CliRunner()
GOOD = [{"question": f"Tom has {i} apples and buys {i} more. How many apples now?",
         "answer": f"He has {i}+{i}={2 * i} apples.\n#### {2 * i}"} for i in range(1, 4)]


def _run(*args):
    result = runner.invoke(app, ["data", *map(str, args)])
    return result.exit_code, result.output


def _jsonl(path, rows):
    path.write_bytes(b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n"
                              for r in rows))
    return path


@pytest.mark.parametrize("cmd", [[], ["ingest"], ["stats"], ["quarantine"], ["decontam"]])
def test_help(cmd):
    code, out = _run(*cmd, "--help")
    assert code == 0 and "Usage" in out


def test_ingest_prints_counts_and_stats(tmp_path):
    db = tmp_path / "s.duckdb"
    src = _jsonl(tmp_path / "pool.jsonl", GOOD + [GOOD[0], b"{oops\n"])
    code, out = _run("ingest", src, "--db", db)
    assert code == 0, out
    for line in ("ingested:     3", "duplicates:   1 (0 already in the store)",
                 "quarantined:  1 (malformed_json 1)", "contaminated: 0",
                 "quarantined row 4: malformed_json: line 5"):
        assert line in out, out
    code, out = _run("ingest", src, "--db", db)
    assert code == 0 and "ingested:     0" in out and "4 already in the store" in out
    code, out = _run("stats", "--db", db)
    assert code == 0 and "pool" in out and "train" in out and "total" in out
    code, out = _run("stats", "--db", db, "--json")
    assert json.loads(out) == [{"source": "pool", "split": "train", "role": "train",
                                "problems": 3, "contaminated": 0, "quarantined": 1}]
    code, out = _run("quarantine", "--db", db)
    assert code == 0 and "pool/train row 4: malformed_json" in out
    code, out = _run("decontam", "--db", db)
    assert code == 0 and "contaminated training problems: 0" in out


def test_default_db_is_in_the_workdir(tmp_path, tmp_workdir):
    code, out = _run("ingest", _jsonl(tmp_path / "pool.jsonl", GOOD))
    assert code == 0, out
    assert (tmp_workdir / "store.duckdb").is_file()
    other = tmp_path / "elsewhere"
    assert _run("ingest", tmp_path / "pool.jsonl", "--workdir", other)[0] == 0
    assert (other / "store.duckdb").is_file()


def test_all_invalid_exits_1_naming_reasons(tmp_path):
    db = tmp_path / "s.duckdb"
    _run("ingest", _jsonl(tmp_path / "pool.jsonl", GOOD), "--db", db)
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "", "answer": "#### 1"},
                                          {"question": "Q?"}])
    code, out = _run("ingest", bad, "--db", db)
    assert code == 1
    assert f"error: {bad}: all 2 rows invalid" in out
    assert "row 0: empty_problem" in out and "row 1: missing_answer" in out
    code, out = _run("stats", "--db", db, "--json")
    assert {r["source"]: r["problems"] for r in json.loads(out)} == {"pool": 3, "bad": 0}


def test_empty_file_exits_1(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out = _run("ingest", empty, "--db", tmp_path / "s.duckdb")
    assert code == 1 and f"error: {empty}: no rows (empty source)" in out


@pytest.mark.parametrize("args,words", [
    (["nope.jsonl"], "nope.jsonl: no such file"),
    (["gsm9k"], "unknown source 'gsm9k'"),
    (["aime24", "--data-dir", "{tmp}"], "preset aime24 (test):"),
    (["{tmp}/pool.jsonl", "--columns", "problem=prompt,answer=answer"],
     "column 'prompt' (mapped to problem) not found"),
    (["{tmp}/pool.jsonl", "--columns", "nonsense"], "--columns must look like"),
])
def test_usage_errors_exit_2_in_one_line(tmp_path, args, words):
    _jsonl(tmp_path / "pool.jsonl", GOOD)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out = _run("ingest", *args, "--db", tmp_path / "s.duckdb")
    assert code == 2, out
    assert words in out and out.count("\n") == 1 and out.startswith("error: ")
    if "columns" in args and "prompt" in words:
        assert str(tmp_path / "pool.jsonl") in out


def test_stats_without_store_exits_2(tmp_path):
    code, out = _run("stats", "--db", tmp_path / "none.duckdb")
    assert code == 2 and "no store at" in out


def test_real_process_missing_path_has_no_traceback(tmp_path):
    env = {**os.environ, "GRPO_WORKDIR": str(tmp_path / "w")}
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "data", "ingest",
                           str(tmp_path / "missing.csv")], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {tmp_path / 'missing.csv'}: no such file\n"
    assert "Traceback" not in proc.stdout + proc.stderr


def test_shared_preset_ingest(shared_data, tmp_path):
    code, out = _run("ingest", "aime25", "--data-dir", shared_data, "--db", tmp_path / "s.db")
    assert code == 0, out
    assert "aime25/test from" in out and "ingested:     30" in out and "repaired:     2" in out
