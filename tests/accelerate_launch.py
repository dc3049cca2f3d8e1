"""What `accelerate launch --config_file FILE train.py` resolves to, through accelerate's own
launcher code, without starting a process (tests of infra/accelerate/*.yaml)."""
from __future__ import annotations

from pathlib import Path


def resolved_launch(config_file: Path):
    """(launcher, its parsed arguments, the environment each rank gets): launcher is
    "deepspeed", "torchrun" or "simple"."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = [*defaults.deepspeed_config, *(["mixed_precision"] if mp_from_config else [])]
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return "deepspeed", args, prepare_deepspeed_cmd_env(args)[1]
    if args.use_fsdp or args.multi_gpu:
        return "torchrun", args, prepare_multi_gpu_env(args)
    return "simple", args, prepare_simple_launcher_cmd_env(args)[1]
