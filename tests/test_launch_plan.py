"""How a training stage starts on the hardware it finds (issue 23, item 1): the pure decision
tasks.launch.launch_plan over (device count, train.num_processes, CUDA_VISIBLE_DEVICES),
exhaustively; stage_plan reading torch; and `grpo sft` / `grpo train` routed through it.

No GPU exists here: GPUs are simulated only by monkeypatching torch.cuda.device_count and
torch.cuda.is_available where stage_plan reads them; the routing tests start real processes
(2 CPU ranks on gloo under `accelerate launch`, as tests/test_accelerate.py does)."""
import json
import subprocess

import pytest
from pipeline_runs import GRPO, ROOT, run_env, write_config

from grpo_core.config import config_from_dict
from tasks.launch import LaunchPlan, launch_plan, stage_plan
from tasks.preflight import PreflightError, launch_of

pytest_plugins = ["fixtures_models"]

def _launched(cfg) -> bool:
    """Whether the run's preflight would start the trainer in processes of its own."""
    return launch_of(cfg).mode != "in-process"



# (device_count, num_processes, CUDA_VISIBLE_DEVICES) -> (mode, devices)
CASES = [
    # CPU: one process in-process, more on gloo under accelerate launch; nothing to pin
    (0, 1, None, "in-process", ()),
    (0, 2, None, "launch", ()),
    (0, 4, "", "launch", ()),
    # exactly one device used and visible: in-process
    (1, 1, None, "in-process", ()),
    (1, 1, "3", "in-process", ()),
    # more GPUs visible than processes: pinned to the first N (never nn.DataParallel)
    (8, 1, None, "pinned", ("0",)),
    (2, 1, None, "pinned", ("0",)),
    (8, 2, None, "pinned", ("0", "1")),
    (8, 6, None, "pinned", ("0", "1", "2", "3", "4", "5")),
    (4, 1, "4,5,6,7", "pinned", ("4",)),
    (4, 3, "7,6,5,4", "pinned", ("7", "6", "5")),
    (2, 1, "0,1,99", "pinned", ("0",)),  # torch stops counting at an invalid entry
    # as many processes as GPUs: accelerate launch on all of them, as they are
    (2, 2, None, "launch", ()),
    (8, 8, None, "launch", ()),
    (2, 2, "1,3", "launch", ()),
    # more processes than GPUs: refused, with the fix
    (1, 2, None, "refuse", ()),
    (4, 8, None, "refuse", ()),
    (2, 3, "0,1", "refuse", ()),
]


@pytest.mark.parametrize("count,nproc,visible,mode,devices", CASES)
def test_launch_plan_table(count, nproc, visible, mode, devices):
    plan = launch_plan(count, nproc, visible)
    assert (plan.mode, plan.devices) == (mode, devices)
    assert plan.env == ({"CUDA_VISIBLE_DEVICES": ",".join(devices)} if devices else {})
    if mode == "refuse":
        assert f"train.num_processes={nproc}" in plan.message
        assert f"set train.num_processes: {count}" in plan.message  # the fix
    if mode == "pinned":  # says so
        assert f"GPU {','.join(devices)}" in plan.message and "CUDA_VISIBLE_DEVICES" in plan.message


def test_launch_plan_exhaustive_invariants():
    """Every combination up to 8 GPUs and 9 processes: one process never sees more than
    one GPU, a launch never asks for more GPUs than are visible, refusals only then."""
    for count in range(0, 9):
        for nproc in range(1, 10):
            for visible in (None, ",".join(str(7 - i) for i in range(count))):
                plan = launch_plan(count, nproc, visible)
                gpus = visible.split(",") if visible else [str(i) for i in range(count)]
                if count == 0:
                    assert plan.mode == ("in-process" if nproc == 1 else "launch")
                elif nproc > count:
                    assert plan.mode == "refuse"
                elif plan.mode == "in-process":
                    assert count == 1 and nproc == 1
                elif plan.mode == "pinned":
                    assert nproc < count and list(plan.devices) == gpus[:nproc]
                else:
                    assert plan.mode == "launch" and nproc == count > 1 and not plan.devices


def test_launch_plan_with_a_vllm_server_and_machines():
    # the server takes the first GPUs; training is pinned to the next num_processes
    assert launch_plan(8, 6, None, server_gpus=2) == LaunchPlan("launch", tuple("234567"))
    plan = launch_plan(8, 4, "0,1,2,3,4,5,6,7", server_gpus=2)
    assert (plan.mode, plan.devices) == ("pinned", ("2", "3", "4", "5"))
    assert launch_plan(2, 1, None, server_gpus=1) == LaunchPlan("launch", ("1",))
    plan = launch_plan(1, 1, None, server_gpus=1)
    assert plan.mode == "refuse" and "vllm_server_gpus=1 leaves no GPU" in plan.message
    plan = launch_plan(8, 8, None, server_gpus=2)
    assert plan.mode == "refuse" and "set train.num_processes: 6" in plan.message
    assert launch_plan(0, 1, None, server_gpus=1).mode == "refuse"
    # two machines of 8: 16 ranks, 8 here; one GPU each on two machines is a launch
    assert launch_plan(8, 16, None, num_machines=2).mode == "launch"
    assert launch_plan(1, 2, None, num_machines=2).mode == "launch"
    assert launch_plan(0, 1, None, num_machines=2).mode == "launch"


def _gpus(monkeypatch, n: int) -> None:
    """Simulated GPUs: only torch's device count and availability are patched."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)


def test_stage_plan_reads_torch_and_the_environment(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    every_preset = config_from_dict({}, [])  # train.num_processes: 1
    _gpus(monkeypatch, 8)
    assert stage_plan(every_preset).devices == ("0",) and _launched(every_preset)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    _gpus(monkeypatch, 2)
    assert stage_plan(every_preset).devices == ("2",)
    two = config_from_dict({}, ["train.num_processes=2"])
    assert stage_plan(two) == LaunchPlan("launch", own_process=True)  # auto on CUDA
    _gpus(monkeypatch, 1)
    # one GPU: train.stage_process auto gives the stage its own process on CUDA; never keeps it here
    assert _launched(every_preset)
    assert stage_plan(every_preset) == LaunchPlan("launch", own_process=True)
    never = config_from_dict({}, ["train.stage_process=never"])
    assert not _launched(never) and not stage_plan(never).own_process
    with pytest.raises(PreflightError, match="set train.num_processes: 1"):
        _launched(two)
    _gpus(monkeypatch, 0)
    assert not _launched(every_preset) and _launched(two)
    assert not stage_plan(two).own_process  # auto: no CUDA, the workers stay in this process


def test_cli_refuses_before_any_work(monkeypatch, tmp_path):
    """`grpo train` with more processes than GPUs: exit 2 naming the field, nothing written."""
    from typer.testing import CliRunner

    from flows.cli import app

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _gpus(monkeypatch, 2)
    wd = tmp_path / "ws"
    for cmd in ("train", "sft"):
        res = CliRunner().invoke(app, [cmd, "configs/quickstart.yaml", "--workdir", str(wd),
                                       "--set", "train.num_processes=4"])
        assert res.exit_code == 2, res.output
        assert "train.num_processes=4" in res.output and "set train.num_processes: 2" in res.output
    assert not wd.exists()


@pytest.mark.integration
def test_grpo_sft_with_two_processes_goes_through_accelerate_launch(tiny_model_path, tmp_path):
    """Real processes: `grpo sft` with train.num_processes=2 on CPU runs 2 gloo ranks."""
    cfg = write_config(tmp_path, tiny_model_path)
    out = tmp_path / "sft-out"
    proc = subprocess.run([GRPO, "sft", str(cfg), "--out", str(out),
                           "--set", "train.num_processes=2", "--set", "sft.max_steps=2"],
                          env=run_env(tmp_path / "ws"), cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((out / "sft-result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 2
    assert (out / "sft-launch.log").is_file() and "sft: 2 steps" in proc.stdout


def test_grpo_train_routes_through_the_plan(monkeypatch, tmp_path, tiny_model_path):
    """`grpo train` hands the round to tasks.stage_run.launched_round (its processes) whenever
    the plan is not in-process: 2 CPU processes, or 1 process with 8 simulated GPUs (pinned
    to GPU 0). The launch itself is replaced by a recorder here; the real 2-rank launch is
    the `grpo sft` test above and tests/test_accelerate.py."""
    from typer.testing import CliRunner

    import tasks.stage_run
    from flows.cli import app
    from grpo_core.train.grpo import RoundResult

    calls = []

    def recorder(cfg, workspace, run_id, mlflow_run, store, sink, model_path, problems, out,
                 template, resume_step, round_no, plan):
        calls.append((plan, run_id, resume_step))
        return RoundResult(str(out), 0)

    monkeypatch.setattr(tasks.stage_run, "launched_round", recorder)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = write_config(tmp_path, tiny_model_path)
    wd, out = tmp_path / "ws", tmp_path / "out"
    base = ["train", str(cfg), "--workdir", str(wd), "--out", str(out)]
    _gpus(monkeypatch, 0)
    res = CliRunner().invoke(app, [*base, "--set", "train.num_processes=2"])
    assert res.exit_code == 0, res.output
    _gpus(monkeypatch, 8)
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 0, res.output
    assert "the stage runs on GPU 0 (CUDA_VISIBLE_DEVICES)" in res.output
    assert calls == [(LaunchPlan("launch"), str(out), 0),
                     (launch_plan(8, 1, own_process=True), str(out), 0)]  # auto on CUDA
