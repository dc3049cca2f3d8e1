"""train.num_machines > 1: each machine's rank, the first machine's address and the port
come from the scheduler's environment (tasks.launch.rendezvous), and the command line each
machine runs carries them. The loopback test runs it for real: 2 "machines" x 1 process on
127.0.0.1 train 2 GRPO steps and end with the same weights as 2 processes on one machine."""
from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.config import load_config
from tasks.launch import DEFAULT_PORT, first_slurm_host, launch_command, rendezvous

ROOT = Path(__file__).resolve().parents[1]


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
