"""vLLM server mode without a GPU: which GPUs the server and the trainer get, the server
command, and that a config in server mode trains through a launched process. The server
itself needs a GPU: tests/test_gpu.py."""
import pytest

from grpo_core.config import config_from_dict
from grpo_core.train.trl_args import trl_grpo_args
from tasks.preflight import launch_of
from tasks.vllm_server import server_command, split_gpus, visible_gpus

SERVER = ["grpo.use_vllm=true", "grpo.vllm_mode=server", "train.vllm_server_gpus=2",
          "grpo.vllm_server_port=8123"]


def _launched(cfg) -> bool:
    """Whether the run's preflight would start the trainer in processes of its own."""
    return launch_of(cfg).mode != "in-process"


def test_gpu_split_follows_cuda_visible_devices():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert split_gpus(gpus, 2) == (["4", "5"], ["6", "7"])
    assert visible_gpus({}, count=3) == ["0", "1", "2"]
    with pytest.raises(RuntimeError, match="vllm_server_gpus=1 leaves no GPU"):
        split_gpus(["0"], 1)


def test_server_mode_config_reaches_the_command_and_trl(tmp_path, monkeypatch):
    import torch

    # 4 simulated GPUs (only the device count is patched): 2 for the server, 2 to train on
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = config_from_dict({}, SERVER)
    cmd = server_command(cfg, "/models/m")
    assert cmd[cmd.index("--model") + 1] == "/models/m"
    assert cmd[cmd.index("--tensor_parallel_size") + 1] == "2"
    assert cmd[cmd.index("--port") + 1] == "8123"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # TRL's args on this CPU
    args = trl_grpo_args(cfg, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_port) == (True, "server", 8123)
    assert _launched(cfg)  # the trainer runs in a process that does not see the server's GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU, one process:
    here = "train.stage_process=never"  # (auto: its own process on CUDA, whatever the mode)
    assert not _launched(config_from_dict({}, ["grpo.use_vllm=true", here]))  # colocate: in-process
    assert not _launched(config_from_dict({}, [*SERVER, "train.vllm_server_launch=false", here]))
    assert _launched(config_from_dict({}, ["grpo.use_vllm=true"]))
