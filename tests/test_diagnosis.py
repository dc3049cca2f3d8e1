"""The diagnosis rules (grpo_core/train/diagnosis.py), `grpo diagnose` and the GRPO stage's
use of them. Each rule fires on a history built for it and stays silent on a healthy one;
tests/data/tiny_round_history.jsonl is a real 20-step quickstart round on the built-in
model (format never hit: its one true finding is reward_fn_constant)."""
from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_core.config import ConfigError, PipelineConfig, config_from_dict
from grpo_core.findings import ACTIONS, Finding, codes_tag, step_ranges
from grpo_core.train.diagnosis import RoundMonitor, diagnose, parse_history

DATA = Path(__file__).resolve().parent / "data"
STEPS = list(range(1, 21))


def healthy(n: int = 20, seed: int = 0) -> list[dict]:
    """A healthy round in the shape of the real one (same keys): accuracy mid-band and
    slowly rising, varied groups, format being learned, few truncations, small KL."""
    rng = random.Random(seed)
    real = parse_history((DATA / "tiny_round_history.jsonl").read_text().splitlines())
    rows = []
    for i in range(n):
        t = i / max(n - 1, 1)
        row = dict(real[i % len(real)])
        acc = 0.35 + 0.15 * t + rng.uniform(-0.05, 0.05)
        fmt = -0.2 + 0.3 * t + rng.uniform(-0.05, 0.05)
        row.update({
            "step": i + 1, "loss": 0.001 + rng.uniform(-1e-3, 1e-3),
            "rewards/accuracy/mean": acc, "rewards/accuracy/std": 0.45 + rng.uniform(-0.03, 0.03),
            "rewards/format/mean": fmt, "rewards/format/std": 0.4 + rng.uniform(-0.05, 0.05),
            "rewards/tag_count/mean": 0.4 + 0.1 * t, "rewards/tag_count/std": 0.2,
            "reward": acc + fmt + 0.5 * (0.4 + 0.1 * t), "reward_std": 0.7,
            "frac_reward_zero_std": rng.choice([0.25, 0.5, 0.5, 0.75]),
            "completions/mean_length": 30 + rng.uniform(-3, 3),
            "completions/clipped_ratio": rng.uniform(0.0, 0.15),
            "kl": 0.02 * t + rng.uniform(0, 0.005),
        })
        rows.append(row)
    return rows


def with_(rows: list[dict], **series) -> list[dict]:
    """rows with key -> f(step) (keys spelled with __ for /)."""
    out = [dict(r) for r in rows]
    for key, f in series.items():
        for r in out:
            r[key.replace("__", "/")] = f(r["step"])
    return out


def codes(found) -> list[str]:
    return [f.code for f in found]


def lin(a: float, b: float, n: int = 20):
    return lambda s: a + (b - a) * (s - 1) / (n - 1)


# ------------------------------------------------------------------------------ silence

def test_healthy_round_is_silent():
    for seed in range(5):
        assert diagnose(healthy(seed=seed)) == [], seed


def test_missing_keys_are_silent():
    assert diagnose([{"step": s} for s in STEPS]) == []
    assert diagnose([]) == []
    assert diagnose([{"step": s, "reward": 0.5, "loss": 0.0} for s in STEPS]) == []


def test_real_quickstart_round_finds_only_the_constant_format_rewards():
    rows = parse_history((DATA / "tiny_round_history.jsonl").read_text().splitlines())
    found = diagnose(rows)
    assert [(f.code, f.evidence["reward"]) for f in found] == [
        ("reward_fn_constant", "format"), ("reward_fn_constant", "tag_count")]
    assert found[0].steps == STEPS and found[0].evidence["mean"] == -0.5


# ------------------------------------------------------------------------------ each rule

@pytest.mark.parametrize(("acc", "code"), [(0.0, "reward_collapse_zero"), (1.0, "reward_collapse_one"),
                                           (0.5, "no_diversity")])
def test_collapse_rules(acc, code):
    fmt = lambda s: 0.5 if acc == 1.0 else 0.0  # the shaping rewards flat (else: hacking)
    rows = with_(healthy(), frac_reward_zero_std=lambda s: 1.0 if s >= 6 else 0.5,
                 rewards__accuracy__mean=lambda s: acc if s >= 6 else 0.4,
                 rewards__accuracy__std=lambda s: 0.0 if s >= 6 else 0.4,
                 rewards__format__mean=fmt, rewards__tag_count__mean=fmt)
    found = diagnose(rows)  # no reward_fn_constant for accuracy: the collapse covers it
    assert codes(found) == [code]
    f = found[0]
    assert f.severity == "warn" and f.steps == list(range(6, 21))
    assert f.evidence["frac_reward_zero_std"] == 1.0 and f.evidence["rewards/accuracy/mean"] == acc
    assert f.action == ACTIONS[code]


@pytest.mark.parametrize(("rates", "code"), [
    ([0.0] * 5, "reward_collapse_zero"), ([1.0] * 4, "reward_collapse_one"),
    ([0.0, 1.0, 0.0, 1.0], "no_diversity"), ([0.0] * 5 + [0.125], None), ([], None)])
def test_start_collapse_reads_the_filter_before_a_round(rates, code):
    from grpo_core.train.diagnosis import start_collapse

    f = start_collapse(rates, config_from_dict({}), round_no=2)
    assert (f.code if f else None) == code
    if f:
        assert f.severity == "warn" and f.steps == [] and f.evidence["round"] == 2
        assert f.evidence["never_solved"] + f.evidence["always_solved"] == len(rates)
        assert "before round 2" in f.line() and f.action == ACTIONS[code]
        on = config_from_dict({"diagnosis": {"stop_on_collapsed_start": True}})
        assert start_collapse(rates, on).severity == "stop"


def test_collapse_is_a_window_mean_not_every_step():
    """With 8 prompts a step's frac_reward_zero_std is k/8: one group of eight that varies
    now and then (0.875) must not hide a collapse (the temperature-0.05 round of
    bench/diagnose.py alternated 1.0 and 0.875 for 20 steps)."""
    seven = {3, 5, 8, 10, 12, 13, 18}
    rows = with_(healthy(), frac_reward_zero_std=lambda s: 0.875 if s in seven else 1.0,
                 rewards__accuracy__mean=lambda s: 0.4, rewards__format__mean=lambda s: 0.0,
                 rewards__tag_count__mean=lambda s: 0.5)
    found = diagnose(rows)
    assert codes(found) == ["no_diversity"] and found[0].steps == STEPS
    # a window of 5 needs its mean above the threshold: one 0.5 among four 1.0 is not
    rows = with_(healthy(), frac_reward_zero_std=lambda s: 0.5 if s % 5 == 0 else 1.0,
                 rewards__accuracy__mean=lambda s: 0.4)
    assert "no_diversity" not in codes(diagnose(rows))
    # a run starts and ends at a collapsed step, not at a window's milder edge
    rows = with_(healthy(), frac_reward_zero_std=lambda s: 1.0 if 6 <= s <= 15 else 0.75,
                 rewards__accuracy__mean=lambda s: 0.4)
    assert [f.steps for f in diagnose(rows) if f.code == "no_diversity"] == [list(range(6, 16))]


def test_accuracy_constant_collapses_even_while_a_shaping_reward_varies():
    """Every completion wrong (or right) for collapse_patience steps: no group learns the
    task, though tag_count's variance keeps frac_reward_zero_std below the threshold."""
    for acc, code in [(0.0, "reward_collapse_zero"), (1.0, "reward_collapse_one")]:
        rows = with_(healthy(), frac_reward_zero_std=lambda s: 0.75 if s >= 4 else 0.25,
                     rewards__accuracy__mean=lambda s, a=acc: a if s >= 4 else 0.4,
                     rewards__accuracy__std=lambda s: 0.0 if s >= 4 else 0.45,
                     rewards__format__mean=lambda s: 0.0, rewards__tag_count__mean=lambda s: 0.5)
        found = diagnose(rows)  # no reward_fn_constant for accuracy: the collapse names it
        assert codes(found) == [code], found
        assert found[0].steps == list(range(4, 21)) and "the same for every completion" in found[0].line()


def test_accuracy_at_the_ceiling_is_collapse_one_but_the_floor_needs_collapsed_groups():
    """A learned pool at temperature 1 (bench/diagnose.py's too-easy fault): 97% right,
    the misses keep frac_reward_zero_std ~0.75, below the threshold. At the floor a few
    percent right with varied groups is how R1-Zero starts: no finding by level alone."""
    ceiling = with_(healthy(), frac_reward_zero_std=lambda s: 0.75, rewards__accuracy__mean=lambda s: 0.97,
                    rewards__accuracy__std=lambda s: 0.17, rewards__format__mean=lambda s: 0.5,
                    rewards__tag_count__mean=lambda s: 1.0)
    found = diagnose(ceiling)
    assert codes(found) == ["reward_collapse_one"] and found[0].steps == STEPS
    assert "accuracy within 5% of its ceiling (frac_reward_zero_std 0.75)" in found[0].line()
    assert diagnose(with_(ceiling, rewards__accuracy__mean=lambda s: 0.9)) == []
    floor = with_(ceiling, rewards__accuracy__mean=lambda s: 0.03)
    assert diagnose(floor) == []


def test_collapse_needs_patience_and_uses_the_grpo_fields():
    rows = with_(healthy(), frac_reward_zero_std=lambda s: 1.0 if 6 <= s <= 9 else 0.5,
                 rewards__accuracy__mean=lambda s: 0.0)
    assert "reward_collapse_zero" not in codes(diagnose(rows))  # 4 steps < patience 5
    grpo = config_from_dict({"diagnosis": {"collapse_patience": 4}})
    assert "reward_collapse_zero" in codes(diagnose(rows, grpo))


def test_collapse_without_accuracy_reads_the_reward_in_reward_range():
    rows = [{"step": s, "loss": 0.0, "reward": -1.0, "frac_reward_zero_std": 1.0} for s in STEPS]
    found = diagnose(rows)  # default reward_range [0, 1]: -1 is at (below) the floor
    assert codes(found) == ["reward_collapse_zero"] and found[0].evidence["reward"] == -1.0
    grpo = config_from_dict({"diagnosis": {"reward_range": [-2.0, 0.0]}})
    assert codes(diagnose(rows, grpo)) == ["no_diversity"]  # mid-range: mixed groups


def test_reward_fn_constant():
    rows = with_(healthy(), rewards__format__std=lambda s: 0.0 if s >= 5 else 0.3,
                 rewards__format__mean=lambda s: 0.5)
    found = diagnose(rows)
    assert codes(found) == ["reward_fn_constant"]
    assert found[0].steps == list(range(5, 21)) and found[0].evidence["reward"] == "format"
    assert found[0].evidence["mean"] == 0.5
    short = with_(healthy(), rewards__format__std=lambda s: 0.0 if s >= 14 else 0.3)
    assert diagnose(short) == []  # 7 steps < constant_patience 8


def test_reward_fn_constant_is_info_while_the_round_learns_the_task():
    """The shipped R1-Zero recipe on the built-in base model: format never hit (-0.5 for
    every completion) while accuracy varies and rises. Costs nothing (the same added to
    every advantage): info. With accuracy not logged, or constant too, it is a warn."""
    rows = with_(healthy(), rewards__format__std=lambda s: 0.0, rewards__format__mean=lambda s: -0.5)
    found = diagnose(rows)
    assert [(f.code, f.severity) for f in found] == [("reward_fn_constant", "info")]
    blind = [{k: v for k, v in r.items() if not k.startswith("rewards/accuracy")} for r in rows]
    assert [(f.code, f.severity) for f in diagnose(blind)] == [("reward_fn_constant", "warn")]


@pytest.mark.parametrize(("a", "b", "code"), [(60, 20, "length_shrinking"), (20, 60, "length_exploding")])
def test_length_trends(a, b, code):
    rows = with_(healthy(), completions__mean_length=lin(a, b), rewards__accuracy__mean=lambda s: 0.4)
    found = diagnose(rows)
    assert codes(found) == [code] and found[0].severity == "warn" and found[0].steps == STEPS
    assert found[0].evidence["length_first"] == a and found[0].evidence["length_last"] == b
    improving = with_(rows, rewards__accuracy__mean=lin(0.3, 0.6))
    assert diagnose(improving) == []  # shorter (or longer) while accuracy rises: fine


def test_truncation():
    rows = with_(healthy(), completions__clipped_ratio=lambda s: 0.83 if s >= 5 else 0.1)
    found = diagnose(rows)
    assert codes(found) == ["truncation"]
    f = found[0]
    assert f.steps == list(range(5, 21)) and f.evidence["clipped_ratio"] == 0.83
    assert f.line().startswith("truncation [warn] steps 5-20: clipped_ratio 0.83 > 0.3")
    assert "grpo.max_completion_length" in f.line() and "grpo.mask_truncated_completions" in f.line()
    early = with_(healthy(), completions__clipped_ratio=lambda s: 0.9 if s <= 10 else 0.1)
    assert diagnose(early) == []  # the tail decides
    assert diagnose(rows[4:8]) == [] and codes(diagnose(rows[4:9])) == ["truncation"]  # a full window


def test_format_dropping():
    rows = with_(healthy(), rewards__format__mean=lin(0.4, -0.4))
    found = diagnose(rows)
    assert codes(found) == ["format_dropping"] and found[0].steps == STEPS
    assert found[0].evidence["format_change"] == pytest.approx(-0.8)


def test_kl_rising_needs_a_trend_still_rising_above_the_floor():
    rows = with_(healthy(), kl=lin(0.0, 0.5))
    found = diagnose(rows)
    assert codes(found) == ["kl_rising"] and found[0].steps == STEPS
    assert found[0].evidence["kl_end"] > 0.1
    plateau = with_(healthy(), kl=lambda s: min(s, 10) * 0.03)  # rose, now flat at 0.3
    assert diagnose(plateau) == []
    low = with_(healthy(), kl=lin(0.0, 0.05))  # rising, but small
    assert diagnose(low) == []


def test_kl_far_above_kl_high_fires_even_when_falling():
    """lr 100x with beta 0.04 (bench/diagnose.py): KL jumps to ~7 in a few steps, then the
    beta term pulls it back to ~3.5: not rising at the end, but diverged."""
    rows = with_(healthy(), kl=lambda s: 0.0 if s == 1 else 7.0 - 0.2 * s)
    found = diagnose(rows)
    assert codes(found) == ["kl_rising"] and found[0].steps == list(range(2, 21))
    assert found[0].evidence["kl_high"] == 1.0 and "> 1.0 (peak 6.6 at step 2)" in found[0].line()
    high = config_from_dict({"diagnosis": {"kl_high": 5.0}})
    assert diagnose(rows, high) == []


def test_reward_hacking_suspect():
    rows = with_(healthy(), rewards__tag_count__mean=lin(0.0, 0.75), rewards__accuracy__mean=lin(0.5, 0.2),
                 rewards__format__mean=lambda s: 0.0)
    found = diagnose(rows)
    assert codes(found) == ["reward_hacking_suspect"]
    assert found[0].evidence["reward"] == "tag_count" and found[0].steps == STEPS


@pytest.mark.parametrize("key", ["loss", "reward", "rewards/format/mean"])
def test_nonfinite_is_a_stop(key):
    rows = healthy()
    rows[6][key] = math.nan
    rows[9][key] = math.inf
    found = diagnose(rows)
    assert codes(found) == ["nonfinite"]
    assert found[0].severity == "stop" and found[0].steps == [7, 10]
    assert found[0].evidence == {"first_step": 7, "keys": [key]}


def test_kl_ceiling_is_a_stop():
    rows = with_(healthy(), kl=lambda s: 0.5 if s == 12 else 0.01)
    assert diagnose(rows) == []
    found = diagnose(rows, config_from_dict({"rounds": {"kl_ceiling": 0.2}}))
    assert codes(found) == ["kl_ceiling"] and found[0].severity == "stop" and found[0].steps == [12]


# ------------------------------------------------------------------------------ in-round

def test_round_monitor_keeps_the_in_round_rules():
    mon = RoundMonitor(config_from_dict({"diagnosis": {"collapse_patience": 2}, "rounds": {"kl_ceiling": 0.5}}))
    assert mon.observe({"frac_reward_zero_std": 1.0}, 1) == ([], None)
    notes, stop = mon.observe({"frac_reward_zero_std": 1.0}, 2)
    assert [(n.code, n.severity, n.steps) for n in notes] == [("collapse", "info", [2])]
    assert notes[0].line() == ("collapse [info] steps 2: frac_reward_zero_std > 0.9 for 2 steps "
                               "(step 2) -> " + ACTIONS["collapse"]) and stop is None
    assert mon.observe({"frac_reward_zero_std": 1.0}, 3) == ([], None)  # once per run
    nan = mon.observe({"loss": math.nan, "kl": 9.0}, 4)[1]
    assert (nan.code, nan.severity, nan.steps, nan.summary) == ("nonfinite", "stop", [4],
                                                                "loss is nan at step 4")
    kl = mon.observe({"kl": 0.75}, 5)[1]
    assert (kl.code, kl.severity, kl.summary) == ("kl_ceiling", "stop",
                                                  "kl 0.75 above kl_ceiling 0.5 at step 5")
    reward = RoundMonitor.reward_stop("format", math.inf, 6)
    assert (reward.code, reward.steps, reward.summary) == ("nonfinite", [6],
                                                           "reward format returned inf at step 6")


# ------------------------------------------------------------------------------ helpers, config

def test_step_ranges_and_tag():
    assert step_ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    assert step_ranges([]) == "-"
    rows = with_(healthy(), completions__clipped_ratio=lambda s: 0.9, kl=lin(0, 0.5))
    assert codes_tag(diagnose(rows)) == "truncation,kl_rising"
    assert codes_tag([]) == "none"


def test_parse_history_names_the_bad_line():
    assert parse_history(['{"step": 1}', "", '{"step": 2, "kl": NaN}'])[1]["step"] == 2
    with pytest.raises(ValueError, match="line 3: not JSON"):
        parse_history(['{"step": 1}', '{"step": 2}', "{oops"])
    with pytest.raises(ValueError, match="line 1: expected a JSON object"):
        parse_history(["[1, 2]"])


def test_diagnosis_config():
    d = PipelineConfig().diagnosis
    assert (d.window, d.truncation_ratio, d.kl_floor, d.constant_patience) == (5, 0.3, 0.1, 8)
    assert (d.collapse_threshold, d.collapse_patience) == (0.9, 5)
    with pytest.raises(ConfigError, match="diagnosis.windw"):
        config_from_dict({"diagnosis": {"windw": 3}})
    with pytest.raises(ConfigError, match="reward_range"):
        config_from_dict({"diagnosis": {"reward_range": [1, 0]}})


def test_every_action_is_documented_in_the_troubleshooting_doc():
    doc = (DATA.parents[1] / "docs" / "troubleshooting.md").read_text()
    assert [c for c in ACTIONS if f"`{c}`" not in doc] == []


# ------------------------------------------------------------------------------ stage wiring

def test_stage_logs_diagnosis_and_returns_the_findings(monkeypatch):
    from tasks import stages, tracking

    logged, tags = {}, {}
    monkeypatch.setattr(tracking, "log_json", lambda run, obj, path: logged.update({(run, path): obj}))
    monkeypatch.setattr(tracking, "set_tags", lambda run, t: tags.update(t))
    rows = with_(healthy(), completions__clipped_ratio=lambda s: 0.9)
    rows[3]["loss"] = math.nan
    lines, codes = stages.diagnose_round("run-1", rows, config_from_dict({}))
    assert [d["code"] for d in logged[("run-1", "diagnosis.json")]] == ["nonfinite", "truncation"]
    assert set(logged[("run-1", "diagnosis.json")][0]) == {"code", "severity", "steps", "evidence", "action"}
    assert tags["diagnosis"] == codes == "nonfinite,truncation"
    # every finding, the stop one too, on the run's page (its description)
    assert "- nonfinite [stop]" in tags["mlflow.note.content"]
    assert "- truncation [warn] steps 1-20" in tags["mlflow.note.content"]
    # the round's findings: every line but the stop (an in-round finding already), counted
    # the same on its page and its tags (issue 27)
    assert len(lines) == 1 and lines[0].line().startswith("truncation [warn] steps 1-20")
    assert tags["findings.count"] == "1 finding (1 warn)"
    assert tags["mlflow.note.content"].startswith("**Diagnosis of this round**: 1 finding (1 warn)")
    info = with_(healthy(), rewards__format__std=lambda s: 0.0, rewards__format__mean=lambda s: -0.5)
    kl = Finding.note("kl_ceiling", "kl 9 above kl_ceiling 0.5 at step 3", "stop", steps=[3])
    lines, _ = stages.diagnose_round("run-3", info, config_from_dict({}), [kl], "grpo/round-2")
    assert lines[0] == kl.at("grpo/round-2") and lines[1].code == "reward_fn_constant"
    assert lines[1].severity == "info" and lines[1].stage == "grpo/round-2"  # said of its round
    assert "- grpo/round-2: reward_fn_constant [info]" in tags["mlflow.note.content"]
    assert tags["findings.count"] == "2 findings (1 stop, 1 info)"  # severity read, not parsed
    assert stages.diagnose_round("run-2", healthy(), config_from_dict({}))[1] == "none"
    assert logged[("run-2", "diagnosis.json")] == [] and tags["diagnosis"] == "none"
    assert tags["mlflow.note.content"].endswith("- none\n")


# ------------------------------------------------------------------------------ CLI

def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(*args):
    from flows.cli import app

    return CliRunner().invoke(app, ["diagnose", *args])


def test_cli_text_and_json(tmp_path):
    bad = _jsonl(tmp_path / "h.jsonl", with_(healthy(), completions__clipped_ratio=lambda s: 0.83))
    res = _cli("--history", str(bad))
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].startswith(
        "truncation [warn] steps 1-20: clipped_ratio 0.83 > 0.3 (mean of the last 5 steps) -> raise")
    res = _cli("--history", str(bad), "--json")
    assert res.exit_code == 0
    out = json.loads(res.output)
    assert [(f["code"], f["severity"], f["steps"]) for f in out] == [("truncation", "warn", STEPS)]
    assert set(out[0]) == {"code", "severity", "steps", "evidence", "action"}
    ok = _cli("--history", str(_jsonl(tmp_path / "ok.jsonl", healthy())))
    assert ok.exit_code == 0 and ok.output.strip() == "no findings over 20 steps"
    assert json.loads(_cli("--history", str(tmp_path / "ok.jsonl"), "--json").output) == []
    # thresholds from --set
    res = _cli("--history", str(bad), "--set", "diagnosis.truncation_ratio=0.9")
    assert res.exit_code == 0 and res.output.startswith("no findings")


def test_cli_exit_codes(tmp_path):
    res = _cli("--history", str(tmp_path / "missing.jsonl"))
    assert res.exit_code == 1 and "cannot read" in res.output
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"step": 1}\n{"step": 2}\n{"step": 3,\n')
    res = _cli("--history", str(broken))
    assert res.exit_code == 1 and "line 3" in res.output
    assert _cli().exit_code == 2
    assert _cli("--history", str(broken), "--run", "abc").exit_code == 2
    assert _cli("--history", str(broken), "--set", "diagnosis.nope=1").exit_code == 2
    res = _cli("--run", "abc", "--workdir", str(tmp_path / "nowhere"))
    assert res.exit_code == 1 and "no MLflow store" in res.output


def test_cli_reads_an_mlflow_run(tmp_path, template_db, monkeypatch):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wd = tmp_path / "wd"
    wd.mkdir()
    shutil.copy(template_db, wd / "mlflow.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("diag")).info.run_id
    rows = with_(healthy(), completions__clipped_ratio=lambda s: 0.83)
    client.log_batch(run, metrics=[Metric(k, v, 0, r["step"]) for r in rows for k, v in r.items()
                                   if k != "step" and isinstance(v, float)])
    client.log_batch(run, metrics=[Metric("grpo/steps", 20.0, 0, 0)])  # a stage metric, not a step
    res = _cli("--run", run, "--workdir", str(wd), "--json")
    assert res.exit_code == 0, res.output
    assert [(f["code"], f["steps"]) for f in json.loads(res.output)] == [("truncation", STEPS)]
    res = _cli("--run", "0" * 32, "--workdir", str(wd))
    assert res.exit_code == 1 and "error:" in res.output


def test_findings_stay_findings_through_json(tmp_path):
    """A launched stage's result (grpo_core.train.saved) and the stage cache (a pydantic
    result as JSON) hand findings back as Findings, severity and stage intact: nothing
    parses a rendered line back."""
    from grpo_core.train import saved
    from grpo_core.train.grpo import RoundResult
    from grpo_core.train.saved import RankInfo
    from tasks.stage_results import GrpoStageResult

    stop = Finding.note("kl_ceiling", "kl 9 above kl_ceiling 0.5 at step 3", "stop", steps=[3],
                        kl=9.0).at("grpo/round-2")
    info = Finding.note("mlflow_unsent", "MLflow unreachable", "info")
    path = tmp_path / "result.json"
    saved.save(path, RoundResult("out", 3, findings=[stop]), RankInfo(notes=[info]))
    assert saved.load(path, RoundResult).findings == [stop]
    assert saved.load(path, RankInfo).notes == [info]
    back = GrpoStageResult.model_validate_json(
        GrpoStageResult(model_dir="m", steps=3, findings=[stop, info]).model_dump_json())
    assert back.findings == [stop, info] and back.findings[0].stage == "grpo/round-2"
    assert [f.severity for f in back.findings] == ["stop", "info"]
    assert back.summary().endswith("2 findings (1 stop, 1 info)")
