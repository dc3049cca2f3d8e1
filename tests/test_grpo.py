"""Real TRL GRPO steps on a tiny random model: knobs reach TRL, completions are recorded,
checkpoints resume, the KL schedule and divergence guard work."""
import math
from pathlib import Path

import pytest
import torch

from grpo_core.config import config_from_dict, generation_batch, load_config
from grpo_core.data.stage_split import prompts_per_update
from grpo_core.data.synthetic import generate_problems
from grpo_core.train.grpo import last_checkpoint, run_grpo_round
from grpo_core.train.trl_args import checkpointing_field, kl_beta, trl_grpo_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_random_model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_core.modeling.tiny import build_tokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-random")
    texts = [p.problem + " " + p.solution for p in generate_problems("train", 200)]
    tok = build_tokenizer(texts, 300)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _cfg(rounds=None, **grpo):
    base = {"max_steps": 2, "save_steps": 1, "max_completion_length": 8,
            "per_device_train_batch_size": 8, "num_generations": 4, "learning_rate": 1e-3}
    return config_from_dict({"grpo": {**base, **grpo}, "rounds": rounds or {},
                             "rewards": {"funcs": ["accuracy", "format", "tag_count"],
                                         "weights": [1.0, 1.0, 0.5]}})


def test_every_knob_reaches_trl(tmp_path):
    cfg = config_from_dict({}, ["grpo.beta=0.03", "grpo.epsilon=0.15", "grpo.epsilon_high=0.28",
                                "grpo.loss_type=dr_grpo", "grpo.temperature=0.9", "grpo.num_generations=4",
                                "grpo.scale_rewards=batch", "grpo.num_iterations=2"])
    args = trl_grpo_args(cfg, str(tmp_path))
    assert (args.beta, args.epsilon, args.epsilon_high) == (0.03, 0.15, 0.28)
    assert (args.loss_type, args.temperature, args.num_generations) == ("dr_grpo", 0.9, 4)
    assert (args.scale_rewards, args.num_iterations, args.learning_rate) == ("batch", 2, 1e-6)
    assert args.per_device_train_batch_size == 32  # 4 prompts x 4 completions
    assert args.gradient_accumulation_steps == 1
    assert args.save_total_limit == 2 and getattr(args, checkpointing_field()) is False  # builtin model
    assert (args.bf16 or args.fp16) == torch.cuda.is_available()  # train.precision auto: fp32 on CPU


@pytest.mark.parametrize(("micro", "processes", "passes"), [(64, 1, 4), (8, 1, 32), (16, 2, 8)])
def test_batch_arithmetic_reaches_trl(micro, processes, passes, tmp_path):
    """The preset's optimizer step (256 completions = 32 prompts x G 8) carried by other
    micro-batches, passes and processes: TRL's generation batch and ours agree."""
    over = ["grpo.use_vllm=false", f"train.num_processes={processes}",
            f"grpo.per_device_train_batch_size={micro}", f"grpo.gradient_accumulation_steps={passes}"]
    cfg = load_config(ROOT / "configs/models/qwen2.5-0.5b-instruct.yaml", over)
    args = trl_grpo_args(cfg, str(tmp_path))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (micro, passes)
    # TRL derives its generation batch from these (world size 1 here: its own check)
    assert args.generation_batch_size == micro * passes
    assert generation_batch(cfg) == 256 and prompts_per_update(cfg) == 32


def test_kl_schedules():
    lin = config_from_dict({"rounds": {"kl_schedule": {"kind": "linear", "beta_start": 0.1, "beta_end": 0.01}}})
    cos = config_from_dict({"rounds": {"kl_schedule": {"kind": "cosine", "beta_start": 0.1, "beta_end": 0.01}}})
    for cfg in (lin, cos):
        assert math.isclose(kl_beta(0, 100, cfg), 0.1) and math.isclose(kl_beta(100, 100, cfg), 0.01)
        assert 0.01 < kl_beta(50, 100, cfg) < 0.1
    assert kl_beta(37, 100, config_from_dict({})) == 0.04


def test_kl_schedule_per_run_continues_across_rounds(tmp_path):
    """per: run spans rounds x max_steps: round 2 starts where round 1 ended (per: round
    restarts at beta_start), and TRL's initial beta is the round's first value."""
    sched = {"kind": "linear", "beta_start": 0.1, "beta_end": 0.0}
    per_round = config_from_dict({"grpo": {"max_steps": 10}, "rounds": {"count": 2, "kl_schedule": sched}})
    per_run = config_from_dict({"grpo": {"max_steps": 10},
                                "rounds": {"count": 2, "kl_schedule": {**sched, "per": "run"}}})
    assert [round(kl_beta(s, 10, per_round, r), 4) for r in (1, 2) for s in (0, 5, 10)] == [
        0.1, 0.05, 0.0, 0.1, 0.05, 0.0]
    assert [round(kl_beta(s, 10, per_run, r), 4) for r in (1, 2) for s in (0, 5, 10)] == [
        0.1, 0.075, 0.05, 0.05, 0.025, 0.0]
    assert trl_grpo_args(per_run, str(tmp_path), round_no=2).beta == pytest.approx(0.05)
    assert trl_grpo_args(per_round, str(tmp_path), round_no=2).beta == pytest.approx(0.1)
    with pytest.raises(ValueError, match="per"):
        config_from_dict({"rounds": {"kl_schedule": {"per": "epoch"}}})


def test_mask_truncated_completions_is_a_grpo_field(tmp_path):
    """TRL's mask_truncated_completions, by its TRL name; TRL's default (off) when unset."""
    cfg = config_from_dict({"grpo": {"mask_truncated_completions": True}})
    assert trl_grpo_args(cfg, str(tmp_path)).mask_truncated_completions is True
    assert trl_grpo_args(config_from_dict({}), str(tmp_path)).mask_truncated_completions is False


def test_round_records_completions_and_resumes(tiny_random_model, tmp_path):
    problems = generate_problems("train", 8, levels=[1])
    rows, steps = [], []

    def sink(step, batch):
        steps.append(step)
        rows.extend(batch)

    out = tmp_path / "round"
    cfg = _cfg(max_steps=2)
    result = run_grpo_round(tiny_random_model, problems, cfg, out, "r1_zero", rollout_sink=sink)
    # one step numbering: the rollouts' steps are the logs' and the checkpoints' (from 1)
    assert steps == [h["step"] for h in result.history] == [1, 2]
    assert result.steps == 2 and (out / "final" / "config.json").is_file()
    assert len(rows) == 2 * 2 * 4  # steps x prompts x G
    row = rows[0]
    assert set(row["rewards"]) == {"accuracy", "format", "tag_count"}
    assert row["problem_id"].startswith("synthetic:arith/train") and row["advantage"] is not None
    hist = result.history[-1]
    assert "frac_reward_zero_std" in hist and "kl" in hist and hist["beta"] == 0.04
    assert last_checkpoint(out).endswith("checkpoint-2")

    # A longer round over the same folder resumes at step 2 and runs only steps 3-4.
    rows.clear()
    steps.clear()
    more = run_grpo_round(tiny_random_model, problems, _cfg(max_steps=4), out, "r1_zero",
                          rollout_sink=sink, resume=True)
    assert more.steps == 4
    assert len(rows) == 2 * 2 * 4
    assert steps == [h["step"] for h in more.history] == [3, 4]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_bad_reward_stops_round_and_keeps_good_checkpoint(bad, tiny_random_model, tmp_path,
                                                          monkeypatch):
    from grpo_core.verify import rewards

    calls = {"n": 0}
    real = rewards.REWARDS["format"]

    def turns_bad(completions, **kw):  # registered as "format"; turns bad at the third step's scoring
        calls["n"] += 1
        out = real(completions, **kw)
        return [bad] * len(out) if calls["n"] >= 3 else out

    monkeypatch.setitem(rewards.REWARDS, "format", turns_bad)
    out = tmp_path / "diverge"
    problems = generate_problems("train", 8, levels=[1])
    result = run_grpo_round(tiny_random_model, problems, _cfg(max_steps=5), out, "r1_zero")
    assert result.stopped_early and result.steps == 3
    rule = "reward format returned nan" if math.isnan(bad) else "reward is inf"
    assert any(f.code == "nonfinite" and f.severity == "stop" and f.summary.startswith(rule)
               for f in result.findings), result.findings
    assert result.output_dir == last_checkpoint(out) and result.output_dir.endswith("checkpoint-2")
    # The next round starts from the good checkpoint: it is a complete model folder.
    monkeypatch.setitem(rewards.REWARDS, "format", real)
    nxt = run_grpo_round(result.output_dir, problems, _cfg(max_steps=1), tmp_path / "next",
                         "r1_zero")
    assert nxt.steps == 1 and not nxt.stopped_early


def test_rollouts_are_written_before_each_checkpoint(tiny_random_model, tmp_path):
    out = tmp_path / "r"

    class Sink:  # a buffering sink, like records.RolloutBuffer
        def __init__(self):
            self.pending, self.flushes = [], []

        def __call__(self, step, rows):
            self.pending.append(step)

        def flush(self):
            self.flushes.append((sorted(set(self.pending)), last_checkpoint(out)))
            self.pending = []

    sink = Sink()
    run_grpo_round(tiny_random_model, generate_problems("train", 8, levels=[1]), _cfg(max_steps=2),
                   out, "r1_zero", rollout_sink=sink)
    # Each step's rows are stored before the checkpoint that covers them exists: a kill
    # right after a checkpoint can never lose rows the resumed round will not regenerate.
    # (Step N's rows, numbered from 1 as the logs are, before checkpoint-N.)
    assert sink.flushes[0] == ([1], None)
    assert sink.flushes[1][0] == [2] and sink.flushes[1][1].endswith("checkpoint-1")


def test_kl_above_ceiling_stops_round(tiny_random_model, tmp_path):
    out = tmp_path / "kl"
    result = run_grpo_round(tiny_random_model, generate_problems("train", 8, levels=[1]),
                            _cfg(max_steps=4, beta=0.04, learning_rate=5e-2, rounds={"kl_ceiling": 1e-9}),
                            out, "r1_zero")
    assert result.stopped_early and result.steps < 4, result.history
    assert any(f.code == "kl_ceiling" and "kl_ceiling 1e-09" in f.summary
               for f in result.findings), result.findings
    assert result.output_dir == last_checkpoint(out)


def test_too_few_problems_for_a_step_is_an_error(tiny_random_model, tmp_path):
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        run_grpo_round(tiny_random_model, generate_problems("train", 1, levels=[1]),
                       _cfg(), tmp_path / "r", "r1_zero")


def _kept(kept_ids: list[str], signal_ids: list[str], need: int, considered: int = 10):
    """A filter stage's result holding only what training_prompts reads."""
    from tasks.stage_results import FilterResult

    return FilterResult(kept=len(kept_ids), considered=considered, kept_ids=kept_ids,
                        signal_ids=signal_ids, need=need)


def test_training_prompts_fall_back_when_the_band_keeps_too_few():
    from flows.pipeline import training_prompts

    pool = [f"p{i}" for i in range(10)]
    assert training_prompts(_kept(pool[:4], pool[:6], 4), pool) == (pool[:4], None)
    assert _kept(pool[:4], pool[:6], 4).key() == "kept 4 of 10 (40%)"
    few = _kept(pool[:1], pool[:5], 4)
    ids, note = training_prompts(few, pool)
    assert ids == pool[:5] and "pass rate in (0, 1)" in note
    # the filter's own line says what the round trains on, as the finding does
    assert few.key() == ("kept 1 of 10 (10%); too few for one step of 4: the round trains on "
                         "the 5 with pass rate in (0, 1)")
    none = _kept([], pool[:2], 4)
    ids, note = training_prompts(none, pool)
    assert ids == pool and "all the round's candidates" in note
    assert none.key().endswith("the round trains on all the round's candidates")
    with pytest.raises(ValueError, match="are 10 problems; one GRPO optimizer step needs 12"):
        training_prompts(_kept(pool, pool, 12), pool)


def test_qwen_preset_round_needs_one_optimizer_step_of_prompts(tiny_random_model, tmp_path):
    """The preset's generation batch: 8 completions x GA 32 = 256 = 32 prompts x G 8. A
    pool of 20 would train 0 steps (TRL drops the incomplete batch)."""
    from flows.pipeline import training_prompts

    cfg = load_config(ROOT / "configs/models/qwen2.5-math-1.5b.yaml",
                      ["grpo.use_vllm=false", "grpo.max_steps=2", "grpo.max_completion_length=4",
                       "grpo.save_steps=10"])
    g = cfg.grpo
    assert (g.per_device_train_batch_size, g.gradient_accumulation_steps, prompts_per_update(cfg)) == (8, 32, 32)
    short = generate_problems("train", 20, levels=[1])
    with pytest.raises(ValueError, match=r"has 20 problems; one generation batch needs 32 .* = 256 / 8"):
        run_grpo_round(tiny_random_model, short, cfg, tmp_path / "short", "r1_zero")
    assert not (tmp_path / "short" / "final").exists()
    ids = [p.id for p in short]
    with pytest.raises(ValueError, match="needs 32"):  # the pipeline's filter fallback refuses too
        training_prompts(_kept(ids[:4], ids, prompts_per_update(cfg), len(ids)), ids)

    # 40 prompts: one full generation batch per epoch (8 dropped), exactly max_steps steps
    result = run_grpo_round(tiny_random_model, generate_problems("train", 40, levels=[1]), cfg,
                            tmp_path / "ok", "r1_zero")
    assert result.steps == 2 and (tmp_path / "ok" / "final" / "config.json").is_file()


def test_skip_update_below_skips_the_optimizer_step(tiny_random_model, tmp_path, monkeypatch):
    """Step 1 trains; step 2's rewards are all below the threshold: its optimizer step does
    not happen, so neither Adam's momentum from step 1 nor the KL term moves the weights,
    and the optimizer state is unchanged."""
    from safetensors.torch import load_file

    from grpo_core.verify import rewards

    calls = {"n": 0}

    def score(completions, **kw):  # spread (a real advantage) above 5 first, then below
        calls["n"] += 1
        return [(10.0 if calls["n"] == 1 else 0.0) + 0.1 * i for i in range(len(completions))]

    monkeypatch.setitem(rewards.REWARDS, "score", score)
    out = tmp_path / "skip"
    cfg = config_from_dict({"grpo": {"max_steps": 2, "save_steps": 1, "max_completion_length": 8,
                                     "per_device_train_batch_size": 8, "num_generations": 4, "beta": 0.04,
                                     "learning_rate": 1e-2},
                            "rounds": {"skip_update_below": 5.0}, "rewards": {"funcs": ["score"]}})
    result = run_grpo_round(tiny_random_model, generate_problems("train", 8, levels=[1]), cfg, out,
                            "r1_zero")
    assert result.steps == 2 and calls["n"] == 2
    assert any(f.code == "skipped_updates" and f.summary.startswith("skipped 1 updates")
               for f in result.findings), result.findings
    start = load_file(f"{tiny_random_model}/model.safetensors")
    step1 = load_file(f"{out}/checkpoint-1/model.safetensors")
    final = load_file(f"{result.output_dir}/model.safetensors")
    assert any(not torch.equal(start[k], step1[k]) for k in start)  # step 1 trained
    assert all(torch.equal(step1[k], final[k]) for k in step1)  # step 2 did not move them
    opt1 = torch.load(out / "checkpoint-1" / "optimizer.pt", weights_only=False)["state"]
    opt2 = torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=False)["state"]
    assert opt1 and opt1.keys() == opt2.keys()
    for i in opt1:
        assert all(torch.equal(torch.as_tensor(opt1[i][k]), torch.as_tensor(opt2[i][k])) for k in opt1[i])


def test_last_checkpoint_skips_a_half_written_one(tmp_path):
    for n, complete in ((2, True), (3, False)):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        if complete:
            (d / "trainer_state.json").write_text("{}")
    assert last_checkpoint(tmp_path).endswith("checkpoint-2")
