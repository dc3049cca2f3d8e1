"""Evaluation: metric values and shape, the protocol hash, stored rows, and the CLI."""
from __future__ import annotations

import json
import os

import pytest
import typer
from typer.testing import CliRunner

from flows.cli_stages import register
from grpo_core.config import PipelineConfig
from grpo_core.data.adapters import resolve_source
from grpo_core.data.benchmarks import benchmark_problems
from grpo_core.data.records import read_eval_results, read_eval_runs
from grpo_core.data.source import SourceError
from grpo_core.data.store import Store
from grpo_core.data.synthetic import generate_problems
from grpo_core.eval.evaluation import evaluate_benchmark, protocol_for, protocol_hash, score
from grpo_core.generation.rollout import Completion
from grpo_core.prompts import render_prompt

os.environ.setdefault("GRPO_TORCH_THREADS", "1")
pytest_plugins = ["fixtures_models"]  # tiny_model_path

SAMPLE_OK = {1: 4, 2: 3, 3: 2, 4: 1, 5: 0}  # correct samples of k=4, per level


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)


class FakeBackend:
    """Greedy: right for levels 1-2, unformatted at level 5. Samples: the first
    SAMPLE_OK[level] right, the others all answer -1."""

    def __init__(self, problems):
        self.by_prompt = {render_prompt(p.problem, "r1_zero"): p for p in problems}

    def sample(self, prompts, n, params):
        out = []
        for prompt in prompts:
            p = self.by_prompt[prompt]
            if params.greedy:
                ans = p.answer if p.level <= 2 else "-1"
                text = (f"so \\boxed{{{ans}}}" if p.level == 5
                        else f"steps</think> <answer>{ans}</answer>")
                out.append([Completion(text, 4, "length" if p.level == 4 else "stop")] * n)
            else:
                out.append([Completion(f"s</think> <answer>"
                                       f"{p.answer if j < SAMPLE_OK[p.level] else -1}</answer>",
                                       4, "stop") for j in range(n)])
        return out


def _cfg(**eval_kw) -> PipelineConfig:
    cfg = PipelineConfig()
    cfg.model.template = "r1_zero"
    cfg.eval.samples = 4
    cfg.eval.bootstrap = 50
    for k, v in eval_kw.items():
        setattr(cfg.eval, k, v)
    return cfg


def _fake_eval(cfg, store=None, limit=10):
    problems = generate_problems("eval", limit, seed=0)
    return evaluate_benchmark("fake-model", "synthetic", cfg, store=store, limit=limit,
                    backend=FakeBackend(problems), tokenizer=None)


def test_metric_values_from_known_answers():
    m = _fake_eval(_cfg()).metrics
    assert m["n_problems"] == 10 and m["k"] == 4 and m["ks"] == [1, 2, 4]
    assert m["greedy_accuracy"]["mean"] == pytest.approx(0.4)
    assert m["avg@4"]["mean"] == pytest.approx(0.5)
    assert m["pass@1"]["mean"] == pytest.approx(0.5)
    assert m["pass@4"]["mean"] == pytest.approx(0.8)
    # maj@4: 4/4, 3/4 right win; 2/4 ties and the first-seen (right) answer wins; 1/4 loses.
    assert m["maj@4"]["mean"] == pytest.approx(0.6)
    assert m["format_adherence"]["mean"] == pytest.approx(0.8)
    assert m["format_adherence_samples"] == 1.0
    assert m["truncation_rate"]["greedy"] == pytest.approx(0.2)
    assert m["truncation_rate"]["samples"] == 0.0
    assert set(m["by_level"]) == {"1", "2", "3", "4", "5"}
    assert m["by_level"]["3"]["avg@4"]["mean"] == pytest.approx(0.5)
    for name in ("greedy_accuracy", "avg@4", "maj@4", "pass@2"):
        block = m[name]
        assert set(block) == {"mean", "lo", "hi", "n"} and block["lo"] <= block["mean"] <= \
            block["hi"]
    json.dumps(m)  # JSON-ready as returned


def test_no_greedy_skips_greedy_metrics():
    m = _fake_eval(_cfg(greedy=False)).metrics
    assert m["greedy_accuracy"] is None and m["avg@4"]["mean"] == pytest.approx(0.5)
    assert m["format_adherence"]["mean"] == 1.0  # from the samples when there is no greedy


def test_protocol_hash_tracks_what_numbers_mean():
    problems = generate_problems("eval", 5, seed=0)
    base = protocol_hash(protocol_for(_cfg(), "synthetic", "r1_zero", problems))
    assert base == protocol_hash(protocol_for(_cfg(), "synthetic", "r1_zero", problems))
    assert base != protocol_hash(protocol_for(_cfg(temperature=1.0), "synthetic", "r1_zero",
                                              problems))

    class Tok:
        chat_template = "{{ messages }}"

    assert base != protocol_hash(protocol_for(_cfg(), "synthetic", "chat", problems, Tok()))
    for changed in (_cfg(samples=8), _cfg(top_p=0.9), _cfg(max_new_tokens=32)):
        assert base != protocol_hash(protocol_for(changed, "synthetic", "r1_zero", problems))
    assert base != protocol_hash(protocol_for(_cfg(), "synthetic", "r1_zero", problems[:4]))
    seeded = _cfg()
    seeded.project.seed = 7  # the seed is not part of the protocol
    assert base == protocol_hash(protocol_for(seeded, "synthetic", "r1_zero", problems))


def test_rows_and_run_written_under_the_protocol_hash(tmp_path):
    cfg = _cfg()
    with Store.open(tmp_path / "s.duckdb") as store:
        result = _fake_eval(cfg, store=store)
        runs = read_eval_runs(store, protocol_hash=result.protocol_hash)
        rows = read_eval_results(store, protocol_hash=result.protocol_hash)
    assert len(runs) == 1 and runs[0]["run_id"] == result.run_id
    assert runs[0]["metrics"] == json.loads(json.dumps(result.metrics))
    assert runs[0]["protocol"] == result.protocol and runs[0]["n_problems"] == 10
    assert len(rows) == 10 and {r["run_id"] for r in rows} == {result.run_id}
    assert sum(r["greedy_correct"] for r in rows) == 4
    assert all(len(r["sample_correct"]) == 4 for r in rows)
    # Stored rows re-score to the same numbers.
    assert score(rows, cfg)["maj@4"] == result.metrics["maj@4"]


def test_real_model_eval_shape(tiny_model_path, tmp_path):
    cfg = _cfg(samples=2, max_new_tokens=8, bootstrap=20)
    cfg.project.workdir = str(tmp_path)
    cfg.rollout.backend = "hf"
    result = evaluate_benchmark(tiny_model_path, "synthetic", cfg, limit=4)
    m = result.metrics
    for name in ("greedy_accuracy", "avg@2", "maj@1", "maj@2", "pass@1", "pass@2",
                 "format_adherence", "truncation_rate", "by_level"):
        assert m.get(name) is not None, name
    assert len(result.per_problem) == 4 and result.protocol["n_problems"] == 4
    assert result.protocol["template"] == "r1_zero" and result.model_fingerprint
    again = evaluate_benchmark(tiny_model_path, "synthetic", cfg, limit=4)
    assert [r["sample_completions"] for r in again.per_problem] == \
        [r["sample_completions"] for r in result.per_problem]  # seeded per problem


def test_benchmarks_from_store_and_unknown(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)})
                            + "\n" for i in range(1, 6)))
    cfg = _cfg()
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(resolve_source(str(pool)))  # a training split: not a benchmark
        with pytest.raises(SourceError, match="'pool': no evaluation split"):
            benchmark_problems("pool", cfg, store)
        store.ingest(resolve_source(str(pool), split="test"))
        got = benchmark_problems("pool", cfg, store, limit=3)
        assert [p.answer for p in got] == ["2", "4", "6"]
        with pytest.raises(SourceError, match="'nope': no evaluation split"):
            benchmark_problems("nope", cfg, store)
    assert len(benchmark_problems("synthetic", cfg, None)) == 200
    assert benchmark_problems("synthetic", cfg, None, 5) == \
        benchmark_problems("synthetic", cfg, None)[:5]


def test_preset_benchmark_from_data_dir(shared_data):
    cfg = _cfg()
    cfg.data.data_dir = str(shared_data)
    problems = benchmark_problems("aime24", cfg)
    assert len(problems) == 30 and all(p.answer for p in problems)


# ----------------------------------------------------------------------------- CLI

runner = CliRunner()


def _app():
    app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
    register(app)
    return app


def _run(*args):
    result = runner.invoke(_app(), [str(a) for a in args])
    return result.exit_code, result.output, result


@pytest.mark.parametrize("cmd", ["filter", "eval"])
def test_help(cmd):
    code, out, _ = _run(cmd, "--help")
    assert code == 0 and "Usage" in out and "--model" in out


def test_cli_filter_then_reuse(tiny_model_path, tmp_path):
    args = ["filter", "--model", tiny_model_path, "--source", "synthetic:arith", "--k", 2,
            "--limit", 4, "--workdir", tmp_path / "w", "--set", "rollout.max_new_tokens=6"]
    code, out, _ = _run(*args)
    assert code == 0, out
    assert "filtered 4 problems with k=2" in out and "(4 estimated, 0 reused" in out
    assert "too easy:" in out and "0.000 |" in out and "1.000 |" in out
    code, out, _ = _run(*args, "--json")
    assert code == 0, out
    summary = json.loads(out)
    assert summary["reused"] == 4 and summary["estimated"] == 0 and summary["considered"] == 4


def test_cli_eval_json_and_table(tiny_model_path, tmp_path):
    args = ["eval", "--model", tiny_model_path, "--benchmark", "synthetic", "--limit", 3,
            "--samples", 2, "--workdir", tmp_path / "w", "--set", "eval.max_new_tokens=6",
            "--set", "eval.bootstrap=20"]
    code, _, result = _run(*args, "--json")
    assert code == 0, result.output
    data = json.loads(result.stdout)
    assert data["benchmark"] == "synthetic" and data["protocol"]["k"] == 2
    m = data["metrics"]
    assert m["n_problems"] == 3 and "lo" in m["avg@2"]
    # G-Pass@k beside pass@k, from the same samples: with n = k = 2 samples, tau 1.0 is
    # "both right" and tau 0.5 is pass@2
    for tau in ("gpass50", "gpass75", "gpass100"):
        assert {"mean", "lo", "hi", "n"} <= set(m[f"{tau}@2"]) and f"flexible/{tau}@2" in m
    assert m["gpass50@2"]["mean"] == pytest.approx(m["pass@2"]["mean"])
    assert m["gpass100@2"]["mean"] <= m["gpass75@2"]["mean"] <= m["gpass50@2"]["mean"]
    code, out, _ = _run(*args)
    assert code == 0, out
    assert "greedy_accuracy" in out and "95% CI" in out and "protocol:" in out
    assert "gpass75@2" in out
    with Store.open(tmp_path / "w" / "store.duckdb", read_only=True) as store:
        assert len(read_eval_runs(store)) == 2


@pytest.mark.parametrize("args,words", [
    (["filter", "--band", "0.8,0.2"], "filter.band"),
    (["filter", "--band", "half"], "--band must look like"),
    (["filter", "--k", "0"], "filter.k"),
    (["eval", "--samples", "0"], "eval.samples"),
    (["eval", "--set", "eval.nope=1"], "eval.nope: unknown field"),
])
def test_cli_config_errors_exit_2_in_one_line(args, words, tmp_path):
    code, out, _ = _run(*args, "--workdir", tmp_path)
    assert code == 2, out
    assert out.startswith("error: config error:") and words in out and out.count("\n") == 1


def test_cli_unknown_benchmark_exits_2(tiny_model_path, tmp_path):
    code, out, _ = _run("eval", "--model", tiny_model_path, "--benchmark", "nope",
                        "--workdir", tmp_path)
    assert code == 2 and "benchmark 'nope': no evaluation split" in out


class PlainBackend(FakeBackend):
    """Answers the way instruct models write: "#### n" greedy, "The answer is n." samples."""

    def sample(self, prompts, n, params):
        out = []
        for prompt in prompts:
            p = self.by_prompt[prompt]
            text = (f"First 3 then 5.\n#### {p.answer}" if params.greedy
                    else f"Adding 2 and 7 gives it. The answer is {p.answer}.")
            out.append([Completion(text, 4, "stop")] * n)
        return out


def test_both_extractions_reported_and_stored(tmp_path):
    problems = generate_problems("eval", 6, seed=0)
    cfg = _cfg()
    with Store.open(tmp_path / "s.duckdb") as store:
        result = evaluate_benchmark("fake-model", "synthetic", cfg, store=store, limit=6,
                          backend=PlainBackend(problems), tokenizer=None)
        rows = read_eval_results(store, run_id=result.run_id)
    m = result.metrics
    assert m["greedy_accuracy"]["mean"] == 0.0 and m["avg@4"]["mean"] == 0.0  # strict
    assert m["flexible/greedy_accuracy"]["mean"] == 1.0
    assert m["flexible/avg@4"]["mean"] == 1.0 and m["flexible/maj@4"]["mean"] == 1.0
    assert m["scorer_errors"] == 0
    assert result.protocol["split"] == "eval" and result.protocol["problems_hash"]
    assert result.protocol["extractions"] == ["strict", "flexible"]
    assert all(r["greedy_correct_flexible"] and not r["greedy_correct"] for r in rows)
    assert score(rows, cfg)["flexible/avg@4"] == m["flexible/avg@4"]  # re-scored from the store


def test_planted_scorer_exception_is_counted_not_wrong(monkeypatch):
    """A scorer bug on one problem's greedy answer: scorer_errors 1, that problem left out
    of greedy accuracy (n 9, not a 10th wrong answer), the rest scored as usual."""
    from grpo_core.verify import answers

    problems = generate_problems("eval", 10, seed=0)
    victim = problems[0].answer
    real = answers.check

    def planted(gold, predicted, seconds=None):
        if predicted == victim and gold is not None and gold.text == victim:
            raise answers.ScorerError("planted", input_hash="0" * 12)
        return real(gold, predicted, seconds)

    monkeypatch.setattr("grpo_core.eval.evaluation.check", planted)
    greedy_only = _cfg(samples=1)
    m = evaluate_benchmark("fake-model", "synthetic", greedy_only, limit=10,
                 backend=PlainBackend(problems), tokenizer=None).metrics
    # Strict extraction finds no answer in "#### n" (nothing to score); flexible does, and
    # its scoring of the victim raised: counted, not wrong. Samples ("The answer is n.")
    # hit the plant too under flexible: 1 more.
    hit = sum(p.answer == victim for p in problems)
    assert m["scorer_errors"] == 2 * hit
    assert m["flexible/greedy_accuracy"]["n"] == 10 - hit
    assert m["flexible/greedy_accuracy"]["mean"] == 1.0
