"""vLLM's CPU build running the pipeline's vLLM paths (grpo_core/generation/vllm_cpu.py):

    make setup-vllm && .venv-vllm/bin/python -m pytest -m vllm tests/      # .ci/run does this

Real engines, real TRL steps, no fakes: builtin:proxy-qwen2-hd32 (a Qwen2 with 32-wide
attention heads, the smallest vLLM's CPU attention takes) built in-process. What is pinned:
the one private vLLM member the CPU path uses; the CPU refusals (sleep mode, server-mode
weight sync, head size) before any engine starts; `rollout.backend: auto` choosing vLLM;
TRL's colocated engine sampling from the policy the trainer holds after each push (full
weights and LoRA's merged ones), with TRL's importance-sampling metrics; two pipeline rounds
with vLLM filter/eval and colocated training, the engines released between stages; one engine
kept for consecutive stages on the same model, sampling what a fresh one samples.

Skipped, with the reason, where vLLM is not installed (the default .venv) or cannot run.
"""
from __future__ import annotations

import importlib
import subprocess

import pytest

from grpo_core.generation import vllm_cpu
from grpo_core.generation.rollout import vllm_available


def _skip_reason() -> str | None:
    if vllm_cpu.vllm_build() is None:
        return "needs vLLM (`make setup-vllm`: its CPU build in .venv-vllm)"
    if not vllm_available():
        return "vLLM's CUDA build without a GPU: its CPU build runs here (`make setup-vllm`)"
    return None


_REASON = _skip_reason()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]



# ------------------------------------------------------------------ no engine: the contract


@pytest.mark.parametrize("owner,member", vllm_cpu.CPU_PRIVATE)
def test_each_private_vllm_member_the_cpu_path_uses_exists(owner, member):
    assert hasattr(importlib.import_module(owner), member), f"{owner}.{member} is gone"


def test_the_cpu_build_is_recognised_and_chosen_by_auto():
    from grpo_core.generation.rollout import resolve_backend_name
    from grpo_core.versions import doctor_lines, machine_lock

    assert vllm_cpu.vllm_build() == "cpu" and vllm_cpu.on_cpu()
    assert resolve_backend_name("auto") == "vllm"
    assert resolve_backend_name("hf") == "hf"
    assert machine_lock(gpu=False).name == "vllm-cpu.txt"
    assert any(s == "ok" and "(CPU build) in the range TRL" in t for s, t in doctor_lines(gpu=False))


def test_cpu_engine_arguments():
    kw = vllm_cpu.engine_kwargs({"model": "m", "gpu_memory_utilization": 0.3,
                                 "max_num_batched_tokens": 4096, "max_model_len": None})
    assert kw["enforce_eager"] and kw["enable_chunked_prefill"] is False
    assert kw["max_model_len"] == kw["max_num_batched_tokens"] == vllm_cpu.CPU_MAX_MODEL_LEN
    assert kw["dtype"] == "float32" and "gpu_memory_utilization" not in kw
    assert vllm_cpu.engine_kwargs({"max_model_len": 300, "dtype": "bfloat16"})["dtype"] == "bfloat16"


@pytest.mark.parametrize("override,says", [
    ("grpo.vllm_enable_sleep_mode=true", "sleep mode"),
    ("grpo.vllm_mode=server", "NCCL"),
])
def test_sleep_mode_and_server_weight_sync_are_refused_before_any_work(override, says):
    from grpo_core.config import config_from_dict
    from tasks.launch import stage_plan

    cfg = config_from_dict({}, ["grpo.use_vllm=true", override])
    plan = stage_plan(cfg)
    assert plan.mode == "refuse" and says in plan.message and "\n" not in plan.message
    assert stage_plan(config_from_dict({}, ["grpo.use_vllm=true"])).mode != "refuse"


def test_a_model_with_heads_too_small_is_refused_before_the_engine(tmp_path, vllm_model_path):
    from grpo_core.config import config_from_dict
    from grpo_core.generation.sampling import build_backend
    from grpo_core.modeling.loading import resolve_model_path

    tiny = resolve_model_path("builtin:tiny-arith", tmp_path)  # head_dim 16
    cfg = config_from_dict({"rollout": {"backend": "vllm"}})
    with pytest.raises(ValueError, match=r"head_dim >= 32; this llama model has 16"):
        build_backend(tiny, cfg)
    # auto takes the hf backend for it (the main job's model), vLLM for one it can run
    from grpo_core.generation.rollout import HFBackend, resolve_backend_name

    backend, _ = build_backend(tiny, config_from_dict({"rollout": {"backend": "auto"}}))
    assert isinstance(backend, HFBackend)
    assert resolve_backend_name("auto", vllm_model_path) == "vllm"


# ------------------------------------------------------------------ one engine, two stages


def test_consecutive_stages_on_one_model_share_one_engine(vllm_model_path, tmp_path):
    """Inside the flow's keep_warm block a stage's vLLM engine outlives the stage, and the
    next stage on the same model takes it without a start; what it samples equals a fresh
    engine's (every request carries its own seed); leaving the block stops it."""
    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.generation.rollout import SamplingParams
    from grpo_core.generation.sampling import build_backend, derive_seed, sample_seeded
    from grpo_core.generation.warm_engine import keep_warm, release_warm
    from grpo_core.modeling.gpu import stage_memory
    from grpo_core.prompts import render_prompt

    cfg = config_from_dict({"project": {"workdir": str(tmp_path)}, "rollout": {"backend": "vllm"}})
    problems = generate_problems("eval", n=4, seed=0)
    prompts = [render_prompt(p.problem, "r1_zero") for p in problems]
    seeds = [derive_seed(0, "warm-test", p.fingerprint) for p in problems]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)

    with keep_warm() as warm:
        with stage_memory() as eval_stage:  # an eval: greedy
            first, _ = build_backend(vllm_model_path, cfg)
            greedy_warm = [c[0].text for c in first.sample(prompts, 1, greedy)]
        assert eval_stage.released == 0  # parked, not stopped
        with stage_memory():  # the filter on the same model: seeded samples
            second, _ = build_backend(vllm_model_path, cfg)
            seeded_warm = [[c.text for c in g] for g in sample_seeded(second, prompts, 2, params, seeds)]
        assert second is first and (warm.starts, warm.reuses) == (1, 1)
        assert release_warm() and first.llm is None  # before a training stage: stopped
        assert not release_warm()
    with stage_memory() as fresh_stage:  # no block: the engine is the stage's own
        fresh, _ = build_backend(vllm_model_path, cfg)
        seeded_fresh = [[c.text for c in g] for g in sample_seeded(fresh, prompts, 2, params, seeds)]
        greedy_fresh = [c[0].text for c in fresh.sample(prompts, 1, greedy)]
    assert fresh_stage.released == 1
    assert seeded_warm == seeded_fresh
    assert greedy_warm == greedy_fresh


# ------------------------------------------------------------------ colocated training


def _logprobs_vllm(llm, ids: list[int]) -> list[float]:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    return [d[t].logprob for t, d in zip(ids[1:], out.prompt_logprobs[1:])]


def _logprobs_hf(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.float()
    lp = torch.log_softmax(logits[0, :-1], -1)
    return lp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def completion_length(completions, **kwargs) -> list[float]:
    """A reward that always varies within a group (the proxy's answers are noise: accuracy
    and format may not), so the round's advantages, and its update, are not zero."""
    return [len(str(c)) / 100 for c in completions]


def _colocate_round(model_path: str, tmp_path, extra: dict, check):
    """A 2-step GRPO round with TRL's colocated vLLM engine; `check(trainer, tokenizer)` runs
    at train end, before the engine is released."""
    from transformers import TrainerCallback

    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems
    from grpo_core.train.grpo import run_grpo_round

    tree = {"project": {"workdir": str(tmp_path / "work")},
            "grpo": {"use_vllm": True, "vllm_mode": "colocate", "max_steps": 2,
                     "num_generations": 4, "per_device_train_batch_size": 8,
                     "max_completion_length": 16, "save_steps": 1000, "learning_rate": 3e-2,
                     "beta": 0.0, "logging_steps": 1},
            "rewards": {"funcs": ["format"]}}
    for k, v in extra.items():
        tree.setdefault(k, {}).update(v)
    held: dict = {}

    class AtEnd(TrainerCallback):
        def on_train_end(self, args, state, control, **kw):
            held["checked"] = check(held["trainer"], held["trainer"].processing_class)

    result = run_grpo_round(model_path, generate_problems("train", n=16, levels=[1], seed=0),
                            config_from_dict(tree), tmp_path / "grpo", template="chat",
                            extra_callbacks=[AtEnd()], extra_rewards=[(completion_length, 1.0)],
                            trainer_hook=lambda t: held.update(trainer=t))
    assert result.steps == 2, result
    return result, held["checked"]


def _push_check(reference_model):
    """After TRL's push, vLLM's log-probs of a text equal the trained policy's (and no longer
    the input model's: the push moved them)."""
    def check(trainer, tok):
        gen = trainer.vllm_generation
        gen.sync_weights()  # what TRL does before each generation
        ids = tok("<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
                  "<think> 12 + 7 = 19 </think> <answer> 19 </answer>")["input_ids"]
        policy = trainer.model
        if hasattr(policy, "merge_and_unload"):  # LoRA: the adapters merged, as pushed
            import copy

            policy = copy.deepcopy(policy).merge_and_unload()
        pushed, trained = _logprobs_vllm(gen.llm, ids), _logprobs_hf(policy, ids)
        before = _logprobs_hf(reference_model, ids)
        return (max(abs(a - b) for a, b in zip(pushed, trained)),
                max(abs(a - b) for a, b in zip(trained, before)))
    return check


def _fp32(path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_colocated_engine_samples_from_the_policy_after_each_push(vllm_model_path, tmp_path,
                                                                  restore_dist_env):
    result, (pushed_vs_trained, trained_vs_input) = _colocate_round(
        vllm_model_path, tmp_path, {}, _push_check(_fp32(vllm_model_path)))
    print(f"max |logprob| vLLM vs trainer {pushed_vs_trained:.2e}; trainer vs input "
          f"{trained_vs_input:.2e}")
    assert trained_vs_input > 1e-2, "the round did not change the policy: nothing to compare"
    assert pushed_vs_trained < 1e-3
    keys = set().union(*(h.keys() for h in result.history))
    # TRL's importance-sampling correction (vLLM's sampler vs the trainer's log-probs)
    assert {k for k in keys if k.startswith("sampling/")} >= {
        "sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean"}, keys


def test_lora_with_vllm_pushes_the_merged_weights(vllm_model_path, tmp_path, restore_dist_env):
    result, (pushed_vs_merged, merged_vs_input) = _colocate_round(
        vllm_model_path, tmp_path, {"model": {"peft": {"enabled": True, "r": 4, "alpha": 8}}},
        _push_check(_fp32(vllm_model_path)))
    print(f"LoRA: max |logprob| vLLM vs merged policy {pushed_vs_merged:.2e}; merged vs input "
          f"{merged_vs_input:.2e}")
    assert merged_vs_input > 1e-3
    assert pushed_vs_merged < 1e-3


# ------------------------------------------------------------------ the pipeline, two rounds


def test_two_rounds_with_vllm_filter_eval_and_colocated_training(vllm_model_path, tmp_path):
    """`grpo run` on CPU: vLLM samples the filter and the evals, TRL's colocated engine the
    rounds; each round re-filters; after each round's training the pipeline process holds no
    engine process and its RSS does not grow with the rounds; an eval's engine serves the
    filter after it."""
    from pipeline_runs import GRPO, ROOT, run_env, write_config
    from test_stage_process import mlflow_runs

    workdir = tmp_path / "ws"
    cfg = write_config(tmp_path, vllm_model_path, max_steps=2,
                       model={"name_or_path": vllm_model_path, "template": "chat"},
                       rollout={"backend": "vllm"},
                       grpo={"use_vllm": True, "vllm_mode": "colocate", "max_steps": 2,
                             "save_steps": 1, "per_device_train_batch_size": 4,
                             "num_generations": 2, "max_completion_length": 8,
                             "learning_rate": 1e-3, "logging_steps": 1},
                       filter={"k": 2, "max_problems": 8, "band": [0.0, 1.0]})
    r = subprocess.run([GRPO, "run", str(cfg)], env=run_env(workdir), cwd=ROOT,
                       capture_output=True, text=True, timeout=1500, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for stage in ("filter/round-1", "grpo/round-1", "filter/round-2", "grpo/round-2"):
        assert stage in out, (stage, out[-3000:])
    client, runs = mlflow_runs(workdir)
    parent = next(x for x in runs if "mlflow.parentRunId" not in x.data.tags)
    history = lambda key: {m.step: m.value for m in client.get_metric_history(parent.info.run_id, key)}
    rss, procs = history("system/pipeline_rss_gb"), history("system/pipeline_child_processes")
    print(f"pipeline RSS after each round {rss}; child processes {procs}")
    assert set(rss) == {1, 2} and set(procs) == {0, 1, 2}, (rss, procs)
    # eval/base -> filter/round-1 and eval/round-1 -> filter/round-2: one engine each pair
    engines = {k: history(f"system/vllm_engine_{k}")[0] for k in ("starts", "reuses")}
    print(f"vLLM engines for the filter and evals: {engines}")
    assert engines["reuses"] >= 2, engines
    assert "taken again by the next stage on the same model" in out
    assert procs[1] == procs[2] == procs[0], procs  # no engine process outlives its stage
    assert rss[2] - rss[1] <= 0.5, rss  # a second round's engines are not added to the first's
    grpo_runs = [x for x in runs if "grpo/round-" in x.data.tags.get("mlflow.runName", "")]
    assert len(grpo_runs) == 2
    for run in grpo_runs:
        assert any(k.startswith("sampling/importance_sampling_ratio") for k in run.data.metrics), \
            sorted(run.data.metrics)
