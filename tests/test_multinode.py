"""train.num_machines > 1: each machine's rank, the first machine's address and the port
come from the scheduler's environment (tasks.launch.rendezvous), and the command line each
machine runs carries them. The loopback test runs it for real: 2 "machines" x 1 process on
127.0.0.1 train 2 GRPO steps and end with the same weights as 2 processes on one machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_core.config import load_config
from tasks.launch import launch_command
from tasks.rendezvous import DEFAULT_PORT, first_slurm_host, rendezvous

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["fixtures_models"]


# ----------------------------------------------------------------------- env -> rendezvous

@pytest.mark.parametrize("env,expected", [
    ({"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}, (1, "10.0.0.1", 1234)),
    ({"NODE_RANK": "0", "MASTER_ADDR": "head"}, (0, "head", DEFAULT_PORT)),
    # Kubernetes indexed Job: the pod's index; the address of pod 0 through a headless Service
    ({"JOB_COMPLETION_INDEX": "3", "MASTER_ADDR": "grpo-0.grpo"}, (3, "grpo-0.grpo", DEFAULT_PORT)),
    # Slurm: the node's index in the job, the first host of the job's node list
    ({"SLURM_NODEID": "2", "SLURM_PROCID": "2", "SLURM_JOB_NODELIST": "gpu[007-010],cpu1"},
     (2, "gpu007", DEFAULT_PORT)),
    ({"SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "a,b", "MASTER_ADDR": "b"}, (1, "b", DEFAULT_PORT)),
    # torchrun's NODE_RANK wins over a scheduler's own
    ({"NODE_RANK": "0", "SLURM_NODEID": "3", "MASTER_ADDR": "h"}, (0, "h", DEFAULT_PORT)),
])
def test_rendezvous_from_the_schedulers_environment(env, expected):
    assert rendezvous(4, None, env) == expected


def test_rendezvous_port_from_the_config_when_the_environment_has_none():
    assert rendezvous(2, 31000, {"NODE_RANK": "1", "MASTER_ADDR": "h"}) == (1, "h", 31000)
    assert rendezvous(2, 31000, {"NODE_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "32000"})[2] == 32000


@pytest.mark.parametrize("env,names", [
    ({"MASTER_ADDR": "h"}, ["NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID"]),
    ({"NODE_RANK": "1"}, ["MASTER_ADDR", "SLURM_JOB_NODELIST"]),
    ({"NODE_RANK": "2", "MASTER_ADDR": "h"}, ["NODE_RANK=2", "0..1"]),
    ({"NODE_RANK": "x", "MASTER_ADDR": "h"}, ["NODE_RANK='x'"]),
    ({"NODE_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
])
def test_rendezvous_refuses_naming_what_is_missing(env, names):
    with pytest.raises(ValueError) as err:
        rendezvous(2, None, env)
    assert all(n in str(err.value) for n in names), str(err.value)


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("a,b,c", "a"), ("gpu[003-005,9]", "gpu003"),
    ("gpu[3,5-6],cpu[1-2]", "gpu3"), ("rack[2-3]-n[01-04]", "rack2-n01"),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


# ------------------------------------------------------------------------ the command line

def _cfg(**train):
    return load_config(ROOT / "configs/quickstart.yaml",
                       [f"train.{k}={v}" for k, v in train.items()])


def _opt(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_launch_command_on_more_machines_carries_the_rendezvous():
    cfg = _cfg(num_processes=16, num_machines=2,
               accelerate_config="infra/accelerate/multi_gpu.yaml")
    env = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "grpo-0.grpo"}
    cmd = launch_command(cfg, Path("/shared/spec.json"), on_gpu=True, env=env)
    assert _opt(cmd, "--num_processes") == "16" and _opt(cmd, "--num_machines") == "2"
    assert _opt(cmd, "--machine_rank") == "1"
    assert _opt(cmd, "--main_process_ip") == "grpo-0.grpo"
    assert _opt(cmd, "--main_process_port") == str(DEFAULT_PORT)
    assert cmd[-3:] == ["-m", "tasks.launch", "/shared/spec.json"]
    # accelerate's own parser reads it back the same way
    from accelerate.commands.launch import launch_command_parser

    args = launch_command_parser().parse_args(cmd[3:])
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (1, "grpo-0.grpo", DEFAULT_PORT)


def test_launch_command_on_more_machines_refuses_without_a_rank():
    cfg = _cfg(num_processes=2, num_machines=2)
    with pytest.raises(ValueError, match="NODE_RANK"):
        launch_command(cfg, Path("spec.json"), on_gpu=False, env={"MASTER_ADDR": "h"})


def test_launch_command_on_one_machine_takes_no_rank_and_a_free_port():
    cmd = launch_command(_cfg(num_processes=2), Path("spec.json"), on_gpu=False, env={})
    assert "--machine_rank" not in cmd and "--main_process_ip" not in cmd
    assert int(_opt(cmd, "--main_process_port")) > 0


# ------------------------------------------------------- 2 machines on loopback, for real

LOOPBACK_TIMEOUT_S = 420


def _spec(tmp_path: Path, name: str, model: str, num_machines: int) -> Path:
    from grpo_core.config import config_from_dict
    from grpo_core.data.synthetic import generate_problems

    cfg = config_from_dict({
        "model": {"name_or_path": model, "template": "r1_zero"},
        # 2 processes x 4 completions = 2 prompts x G 4 per step, 16 new tokens
        "grpo": {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4,
                 "max_completion_length": 16, "learning_rate": 1e-3, "save_steps": 2},
        # a random model never answers right, but it emits the tags (added tokens) now and
        # then: tag_count varies within groups, so the steps have gradients to compare
        "rewards": {"funcs": ["tag_count"], "weights": [1.0]},
        "train": {"num_processes": 2, "num_machines": num_machines,
                  "accelerate_config": "infra/accelerate/cpu_2proc.yaml"},
    })
    out = tmp_path / name
    out.mkdir()
    spec = {"stage": "grpo", "config": cfg.model_dump(mode="json"), "model_path": model,
            "problems": [p.to_row() for p in generate_problems("train", 8, levels=[1])],
            "output_dir": str(out), "template": "r1_zero", "mlflow_run": None,
            "tracking_uri": None, "workspace": None, "rollouts_file": str(out / "rollouts.jsonl"),
            "result_file": str(out / "grpo-result.json"), "round_no": 1}
    path = out / "grpo-spec.json"
    path.write_text(json.dumps(spec))
    return path


def _start(spec: Path, log: Path, **env: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items()
            if k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX")
            and not k.startswith("SLURM_")}
    full = {**base, "GRPO_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT), **env}
    with log.open("w") as fh:  # own process group: a timeout kills the ranks too
        return subprocess.Popen([sys.executable, "-m", "tasks.launch", "node", str(spec)], cwd=ROOT,
                                env=full, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + LOOPBACK_TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"{log.name} (exit {p.returncode}):\n{log.read_text()[-3000:]}"


def _final_weights(spec: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted((spec.parent / "final").glob("*.safetensors"))
    assert files, f"no final model under {spec.parent}"
    return {k: t for f in files for k, t in load_file(str(f)).items()}


@pytest.mark.slow  # ~3.5 min on 2 cores: 3 x 2 processes importing the stack, 2 GRPO steps
@pytest.mark.integration
def test_two_machines_on_loopback_train_like_two_processes_on_one(tiny_model_path, tmp_path):
    import socket

    import torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    two = _spec(tmp_path, "two-machines", tiny_model_path, num_machines=2)
    logs = [tmp_path / f"machine{i}.log" for i in range(2)]
    _wait([_start(two, logs[i], NODE_RANK=str(i), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
           for i in range(2)], logs)
    one = _spec(tmp_path, "one-machine", tiny_model_path, num_machines=1)
    _wait([_start(one, tmp_path / "one.log")], [tmp_path / "one.log"])

    result = json.loads((two.parent / "grpo-result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 2
    a, b = _final_weights(two), _final_weights(one)
    assert a.keys() == b.keys()
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert diff <= 1e-6, f"2 machines and 1 machine differ by {diff}"
    assert any(not torch.equal(a[k], t) for k, t in _start_weights(tiny_model_path).items()), \
        "training changed nothing"


def _start_weights(model: str) -> dict:
    from safetensors.torch import load_file

    return {k: t for f in sorted(Path(model).glob("*.safetensors")) for k, t in load_file(str(f)).items()}
