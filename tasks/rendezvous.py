"""Where the machines of a launched stage meet (train.num_machines > 1): this machine's rank,
the first machine's address and the port, from the environment the scheduler sets
(torchrun's, a Kubernetes indexed Job's, Slurm's); on one machine a free port."""
from __future__ import annotations

import socket
from collections.abc import Mapping


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEFAULT_PORT = 29500  # torchrun's: every machine must agree on it without talking first
# Where a machine's rank comes from, first found wins: torchrun's convention, a Kubernetes
# indexed Job's pod index, Slurm's node index within the job.
RANK_VARS = ("NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID")


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: "gpu[003-005,9],cpu1" -> "gpu003"."""
    head, depth, i = "", 0, 0
    for i, ch in enumerate(nodelist):  # the first entry: up to a comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            break
        head += ch
    while "[" in head:  # each bracket group -> its first index (zero padding kept)
        pre, rest = head.split("[", 1)
        inner, post = rest.split("]", 1)
        head = pre + inner.split(",")[0].split("-")[0] + post
    return head


def rendezvous(num_machines: int, port: int | None, env: Mapping[str, str]) -> tuple[int, str, int]:
    """(machine_rank, main_process_ip, main_process_port) of this machine, for
    num_machines > 1, from the scheduler's environment: the rank from NODE_RANK, else
    JOB_COMPLETION_INDEX (Kubernetes indexed Job), else SLURM_NODEID; the first machine's
    address from MASTER_ADDR, else the first host of SLURM_JOB_NODELIST; the port from
    MASTER_PORT, else train.main_process_port, else 29500 (never a random one: each machine
    would pick its own). Raises ValueError naming what is missing."""
    rank_var = next((v for v in RANK_VARS if env.get(v, "").strip()), None)
    if rank_var is None:
        raise ValueError(f"train.num_machines={num_machines} needs this machine's rank: set "
                         f"{' or '.join(RANK_VARS)} (torchrun's NODE_RANK, a Kubernetes "
                         "indexed Job's JOB_COMPLETION_INDEX, Slurm's SLURM_NODEID)")
    try:
        rank = int(env[rank_var])
    except ValueError:
        raise ValueError(f"{rank_var}={env[rank_var]!r} is not a machine rank") from None
    if not 0 <= rank < num_machines:
        raise ValueError(f"{rank_var}={rank}: machine ranks run 0..{num_machines - 1} "
                         f"for train.num_machines={num_machines}")
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr and env.get("SLURM_JOB_NODELIST", "").strip():
        addr = first_slurm_host(env["SLURM_JOB_NODELIST"].strip())
    if not addr:
        raise ValueError(f"train.num_machines={num_machines} needs the first machine's address: "
                         "set MASTER_ADDR (under Slurm, SLURM_JOB_NODELIST is used when it is unset)")
    raw_port = env.get("MASTER_PORT", "").strip()
    try:
        main_port = int(raw_port) if raw_port else (port or DEFAULT_PORT)
    except ValueError:
        raise ValueError(f"MASTER_PORT={raw_port!r} is not a port") from None
    return rank, addr, main_port


def machine_args(num_machines: int, port: int | None, env: Mapping[str, str]) -> list[str]:
    """`accelerate launch`'s rendezvous arguments: on one machine a free port unless one is
    set; on more, `rendezvous` from the environment."""
    if num_machines == 1:
        return ["--main_process_port", str(port or _free_port())]
    rank, addr, main_port = rendezvous(num_machines, port, env)
    return ["--machine_rank", str(rank), "--main_process_ip", addr,
            "--main_process_port", str(main_port)]
