"""Synthetic difficulty `levels` honoured everywhere a synthetic source is read (issue 24
item 5): `grpo filter --source synthetic:arith` (--levels, else the config's data.train
levels of that source), `grpo data ingest --levels`, and the `synthetic` benchmark
(eval.synthetic_levels, part of its problems and so of its protocol hash). Real DuckDB
files; the filter samples a tiny random model."""
from __future__ import annotations

import yaml
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.config import config_from_dict
from grpo_core.data.benchmarks import benchmark_problems, fingerprint
from grpo_core.data.store import Store

pytest_plugins = ["fixtures_models"]


def _levels(db, table: str) -> set[int]:
    with Store.open(db, read_only=True) as store:
        return {r[0] for r in store.con.execute(f"SELECT DISTINCT level FROM {table}").fetchall()}


def _filter(model: str, workdir, *extra: str):
    return CliRunner().invoke(app, ["filter", "--model", model, "--source", "synthetic:arith",
                                    "--limit", "6", "--k", "2", "--workdir", str(workdir),
                                    "--json", *extra])


def test_filter_honours_levels(tiny_model_path, tmp_path) -> None:
    res = _filter(tiny_model_path, tmp_path / "a", "--levels", "2")
    assert res.exit_code == 0, res.output
    assert _levels(tmp_path / "a" / "store.duckdb", "pass_rates") == {2}
    # no --levels: the config's data.train levels of the source named by --source
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"data": {"train": [{"source": "synthetic:arith", "levels": [3]}]}}))
    res = _filter(tiny_model_path, tmp_path / "b", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    assert _levels(tmp_path / "b" / "store.duckdb", "pass_rates") == {3}


def test_bad_levels_stop_before_any_work(tmp_path) -> None:
    runner = CliRunner()
    for argv in (["filter", "--source", "synthetic:arith", "--levels", "9"],
                 ["filter", "--source", "synthetic:arith", "--levels", "one"],
                 ["data", "ingest", "synthetic:arith", "--levels", "0,1"],
                 ["data", "ingest", "gsm8k", "--levels", "1"]):
        res = runner.invoke(app, [*argv, "--workdir", str(tmp_path)])
        assert res.exit_code == 2, (argv, res.output)
        assert res.output.count("\n") == 1 and "levels" in res.output
    assert not (tmp_path / "store.duckdb").exists()


def test_ingest_honours_levels(tmp_path) -> None:
    db = tmp_path / "store.duckdb"
    res = CliRunner().invoke(app, ["data", "ingest", "synthetic:arith", "--levels", "1,4",
                                   "--limit", "20", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert _levels(db, "problems") == {1, 4}


def test_synthetic_benchmark_levels_are_configurable() -> None:
    default = benchmark_problems("synthetic", config_from_dict({}), limit=20)
    low = benchmark_problems("synthetic", config_from_dict({"eval": {"synthetic_levels": [1, 2]}}),
                             limit=20)
    assert {p.level for p in default} == {1, 2, 3, 4, 5} and {p.level for p in low} == {1, 2}
    assert fingerprint(low) != fingerprint(default)  # another protocol hash
