"""Stages in processes of their own: SFT and GRPO under `accelerate launch` when
train.num_processes > 1, and any stage that holds a model or an engine (filter, eval, SFT,
a GRPO round) in one process of its own under train.stage_process (`python -m tasks.launch
SPEC`; the process exits with the stage, so no memory of it crosses a stage or a round).

The pipeline process stays the only DuckDB writer: it writes a JSON spec, starts
`accelerate launch ... -m tasks.launch SPEC` and waits. Every rank trains; only rank 0
streams per-step metrics into the stage's MLflow run (run id and tracking URI come in
the spec) and appends the round's rollouts (all ranks' rows: TRL gathers them) to a
JSONL file beside the checkpoints, which the stage ingests into DuckDB when the launch
has ended. A killed launch resumes like a single-process round: from the newest
complete checkpoint, with the JSONL cut back to the rows before it.

More machines (train.num_machines > 1): every machine runs `python -m tasks.launch node SPEC`
on a spec all of them read (shared storage); each takes its machine rank, the first
machine's address and the port from the scheduler's environment (`rendezvous`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_core.config import PipelineConfig
from grpo_core.data.problems import Problem
from grpo_core.modeling.gpu import process_peak_gb, report_child_peak
from grpo_core.train import saved
from grpo_core.train.saved import RankInfo, ShardDone

# Where the machines meet (tasks/rendezvous.py), named here too: the launch path's own parts.
from tasks.rendezvous import (
    machine_args,
)

if TYPE_CHECKING:
    from grpo_core.train.grpo import RoundResult
    from grpo_core.train.sft import SFTResult

ROOT = Path(__file__).resolve().parents[1]
# CPU ranks on gloo (see the file for why it says MULTI_GPU): CI, laptops.
CPU_CONFIG = "infra/accelerate/cpu_2proc.yaml"


# --- How a training stage starts (process count and device pinning) -----------------------
# One decision for `grpo run`, `grpo train`, `grpo sft` and the deployments: in the calling
# process only when exactly one device (or the CPU) is used and nothing else is visible;
# otherwise a subprocess under `accelerate launch`, pinned with CUDA_VISIBLE_DEVICES to the
# GPUs it uses. Never one process that sees several GPUs: transformers would wrap the model
# in nn.DataParallel, which TRL's trainers refuse.


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    mode: str  # "in-process" | "pinned" | "launch" | "refuse"
    devices: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES of the stage's processes; () = as is
    message: str = ""  # why pinned (logged), or the refusal with its fix
    # train.stage_process resolved on this machine: every stage's work (the filter's and
    # eval's workers too) in a process of its own. Read from here, never re-derived.
    own_process: bool = False

    @property
    def env(self) -> dict:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)} if self.devices else {}


def launch_plan(device_count: int, num_processes: int, cuda_visible: str | None = None,
                num_machines: int = 1, server_gpus: int = 0, own_process: bool = False) -> LaunchPlan:
    """Pure: how a stage runs on this machine. device_count: GPUs torch sees (0 on CPU);
    cuda_visible: $CUDA_VISIBLE_DEVICES as set (names the GPUs; None: 0..device_count-1);
    server_gpus: GPUs the round's own vLLM server takes first (0: none); own_process: a
    stage that could run in this process gets one of its own (train.stage_process)."""
    plan = _hardware_plan(device_count, num_processes, cuda_visible, num_machines, server_gpus)
    if plan.mode == "in-process" and own_process:
        return LaunchPlan("launch", own_process=True)
    return dataclasses.replace(plan, own_process=own_process)


def _hardware_plan(device_count: int, num_processes: int, cuda_visible: str | None,
                   num_machines: int, server_gpus: int) -> LaunchPlan:
    if device_count == 0:  # CPU: processes on gloo, no device to pin
        if server_gpus:
            return LaunchPlan("refuse", message="a launched vLLM server (grpo.vllm_mode=server, "
                              "train.vllm_server_launch) needs GPUs and none is visible; use "
                              "vllm_mode=colocate, or train.vllm_server_launch=false")
        one = num_processes == 1 and num_machines == 1
        return LaunchPlan("in-process" if one else "launch")
    listed = [d.strip() for d in (cuda_visible or "").split(",") if d.strip()]
    # torch counts the listed GPUs up to the first it cannot use
    gpus = listed[:device_count] if len(listed) >= device_count \
        else [str(i) for i in range(device_count)]
    train_gpus = gpus[server_gpus:]
    local = -(-num_processes // num_machines)  # ranks on this machine
    if not train_gpus:
        return LaunchPlan("refuse", message=(
            f"train.vllm_server_gpus={server_gpus} leaves no GPU for training ({device_count} "
            f"visible); use grpo.vllm_mode=colocate on a single GPU"))
    if local > len(train_gpus):
        fix = f"set train.num_processes: {len(train_gpus) * num_machines}"
        return LaunchPlan("refuse", message=(
            f"train.num_processes={num_processes} needs {local} GPUs on this machine but "
            f"{len(train_gpus)} are free for training ({device_count} visible"
            f"{f', {server_gpus} for the vLLM server' if server_gpus else ''}); {fix}, or "
            f"make more GPUs visible"))
    used = tuple(train_gpus[:local])
    if local == len(gpus) == 1 and num_machines == 1:
        return LaunchPlan("in-process")
    if local < len(train_gpus):
        return LaunchPlan("pinned", used, (
            f"{device_count} GPUs visible, train.num_processes={num_processes}: the stage runs on "
            f"GPU {','.join(used)} (CUDA_VISIBLE_DEVICES); raise train.num_processes to use more"))
    return LaunchPlan("launch", used if server_gpus else ())


def own_process(cfg: PipelineConfig) -> bool:
    """train.stage_process resolved on this machine: auto = own process when CUDA is in use.
    A run's plan carries it (LaunchPlan.own_process); only a command without a plan (`grpo
    filter`, `grpo eval`) asks here, once."""
    mode = cfg.train.stage_process
    if mode == "auto":
        import torch

        return torch.cuda.is_available()
    return mode == "always"


def stage_plan(cfg: PipelineConfig) -> LaunchPlan:
    """launch_plan for this config on this machine (torch's device count, the environment)."""
    import torch

    from grpo_core.generation.vllm_cpu import cpu_refusal
    from tasks.vllm_server import launches_server

    g = cfg.grpo
    refusal = cpu_refusal(g.use_vllm, g.vllm_mode, bool(getattr(g, "vllm_enable_sleep_mode", False)))
    if refusal:
        return LaunchPlan("refuse", message=refusal)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    t = cfg.train
    return launch_plan(count, t.num_processes, os.environ.get("CUDA_VISIBLE_DEVICES"),
                       t.num_machines, t.vllm_server_gpus if launches_server(cfg) else 0,
                       own_process(cfg))


# --- end of the stage-start decision ------------------------------------------------------


def launch_command(cfg: PipelineConfig, spec_path: Path, on_gpu: bool,
                   env: Mapping[str, str] | None = None) -> list[str]:
    t = cfg.train
    if t.num_processes == 1 and t.num_machines == 1 and not t.accelerate_config:
        # One process, nothing to distribute: the stage's own process without a launcher.
        return [sys.executable, "-m", "tasks.launch", str(spec_path)]
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    config = t.accelerate_config or (None if on_gpu else CPU_CONFIG)
    if config:
        path = Path(config)
        cmd += ["--config_file", str(path if path.is_absolute() else ROOT / path)]
    elif t.num_processes > 1:
        cmd += ["--multi_gpu"]
    cmd += ["--num_processes", str(t.num_processes), "--num_machines", str(t.num_machines),
            *machine_args(t.num_machines, t.main_process_port, os.environ if env is None else env)]
    return [*cmd, "-m", "tasks.launch", str(spec_path)]


def keep_rows_through(path: Path, step: int) -> None:
    """Keep the rows of steps up to `step` (from 1, as checkpoints count)."""
    if path.is_file():
        steps = ((line, _step(line)) for line in path.read_text(encoding="utf-8").splitlines())
        rows = [line for line, k in steps if k is not None and k <= step]
        path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by the kill


def read_rollouts_file(path: Path) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        if _step(line) is None:
            continue
        row = json.loads(line)
        by_step.setdefault(int(row.pop("step")), []).append(row)
    return by_step


def run_launched(stage: str, cfg: PipelineConfig, model_path: str, problems: list[Problem],
                 output_dir: Path, template: str, mlflow_run: str | None = None,
                 tracking_uri: str | None = None, workspace: str | None = None,
                 resume_step: int | None = None, extra_env: dict | None = None,
                 round_no: int = 1) -> tuple[RoundResult | SFTResult, RankInfo]:
    """Run `stage` ("grpo" or "sft") on train.num_processes ranks; rank 0's result, typed
    as it saved it (grpo_core.train.saved), and its process. A GRPO round's rollouts are in
    rollouts_file(output_dir)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rollouts = rollouts_file(out)
    if stage == "grpo":  # rows past the checkpoint we resume from are generated again
        keep_rows_through(rollouts, resume_step or 0)
    spec = {"stage": stage, "config": cfg.model_dump(mode="json"), "model_path": model_path,
            "problems": [p.to_row() for p in problems], "output_dir": str(out),
            "template": template, "mlflow_run": mlflow_run, "tracking_uri": tracking_uri,
            "workspace": workspace, "rollouts_file": str(rollouts), "round_no": round_no}
    from grpo_core.train.grpo import RoundResult
    from grpo_core.train.sft import SFTResult

    path = run_stage_process(spec, cfg, out, extra_env)
    return saved.load(path, RoundResult if stage == "grpo" else SFTResult), saved.load(path, RankInfo)


def rollouts_file(output_dir: str | Path) -> Path:
    """Where rank 0 of a launched GRPO round appends its rollouts (one JSON line each)."""
    return Path(output_dir) / "rollouts.jsonl"


def run_shard_process(kind: str, cfg: PipelineConfig, cfg_dump: dict, model_path: str,
                      template: str, problems_file: str, out_path: str,
                      model_fp: str | None = None, workspace: str | None = None) -> str:
    """One shard of the filter (kind "filter": pass-rate estimates) or of an evaluation
    ("eval": per-problem records) in a process of its own (train.stage_process): the
    Parquet file it wrote (flows/shards.py ingests it, in this process, the one writer)."""
    out = Path(out_path).parent
    spec = {"stage": kind, "config": cfg_dump, "model_path": model_path, "template": template,
            "problems_file": problems_file, "out_path": out_path, "model_fp": model_fp,
            "workspace": workspace, "name": f"{kind}-{Path(out_path).stem}"}
    # Sees what this process sees: a vLLM engine with tensor parallelism takes several GPUs.
    return saved.load(run_stage_process(spec, cfg, out), ShardDone).path


PROCESS_LOG = "stage-processes.jsonl"  # under the workspace: one line per stage process


def run_stage_process(spec: dict, cfg: PipelineConfig, out: Path,
                      extra_env: dict | None = None) -> Path:
    """The one way a stage starts outside this process: write `spec` beside the stage's
    files, run launch_command on it (accelerate launch, or one plain process), wait. Returns
    the file rank 0 saved its result in (grpo_core.train.saved); {launcher_pid, rank0_pid,
    exit_code} goes to <workspace>/logs/stage-processes.jsonl. Raises RuntimeError with the
    log's tail when the process failed."""
    import torch

    name = spec.get("name") or spec["stage"]
    spec = {**spec, "result_file": str(out / f"{name}-result.json")}
    spec_path = out / f"{name}-spec.json"
    spec_path.write_text(json.dumps(spec))
    Path(spec["result_file"]).unlink(missing_ok=True)
    env = {**os.environ, **(extra_env or {})}
    cores = os.cpu_count() or 1
    env.setdefault("GRPO_TORCH_THREADS", str(max(1, cores // cfg.train.num_processes)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = out / f"{name}-launch.log"
    with log.open("a") as fh:
        proc = subprocess.Popen(launch_command(cfg, spec_path, torch.cuda.is_available()),
                                env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        code = proc.wait()
    result_file = Path(spec["result_file"])
    done = result_file.is_file()
    rank0 = saved.load(result_file, RankInfo) if done else RankInfo()
    record = {"stage": spec["stage"], "name": name, "launcher_pid": proc.pid,
              "rank0_pid": rank0.pid, "exit_code": code}
    if spec.get("workspace"):
        path = Path(spec["workspace"]) / "logs" / PROCESS_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({**record, "output_dir": str(out)}) + "\n")
    report_child_peak(rank0.gpu_peak_gb)  # the stage's peak, in this stage's record
    if code != 0 or not done:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"the {name} stage's process failed (exit {code}); log {log}:\n{tail}")
    return result_file


class _JsonlSink:
    """Rank 0's rollout sink: one JSON line per completion, flushed as it goes."""

    def __init__(self, path: str):
        self.fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def __call__(self, step: int, rows: list[dict]) -> None:
        for r in rows:
            self.fh.write(json.dumps({"step": step, **r}, default=str) + "\n")
        self.fh.flush()

    def flush(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


def _shard_main(spec: dict) -> None:
    """A filter or eval shard (run_shard_process): grpo_core.eval.shards does the work."""
    from grpo_core.eval import shards

    problems = shards.read_problems(spec["problems_file"])
    if spec["stage"] == "filter":
        priors = shards.read_priors(shards.priors_path(spec["problems_file"]))
        path = shards.estimate_shard(spec["model_path"], spec["config"], spec["template"],
                                     spec["model_fp"], problems, spec["out_path"], None, priors)
    else:
        path = shards.score_shard(spec["model_path"], spec["config"], spec["template"],
                                  problems, spec["out_path"], None)
    saved.save(spec["result_file"], ShardDone(str(path), os.getpid(), process_peak_gb()))


def _rank_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec["stage"] in ("filter", "eval"):
        _shard_main(spec)
        return
    cfg = PipelineConfig.model_validate(spec["config"])
    problems = [Problem(**row) for row in spec["problems"]]
    rank0 = int(os.environ.get("RANK", "0")) == 0
    logger = None
    if rank0 and spec.get("mlflow_run"):
        from tasks import tracking
        from tasks.tracking.step_logger import StepLogger

        tracking.connect(spec["tracking_uri"])
        logger = StepLogger(spec["mlflow_run"], workspace=spec["workspace"],
                            close_timeout_s=cfg.tracking.flush_timeout_s)
    callbacks = [logger] if logger else []
    try:
        if spec["stage"] == "grpo":
            from grpo_core.train.grpo import run_grpo_round

            # Every rank needs a sink (gathering the rows is collective); rank 0 keeps them.
            sink = _JsonlSink(spec["rollouts_file"]) if rank0 else (lambda step, rows: None)
            result = run_grpo_round(spec["model_path"], problems, cfg, spec["output_dir"],
                                    spec["template"], rollout_sink=sink, resume=True,
                                    extra_callbacks=callbacks, round_no=spec.get("round_no", 1))
            if rank0:
                sink.close()
        else:
            from grpo_core.train.sft import run_sft

            result = run_sft(spec["model_path"], problems, cfg, spec["output_dir"],
                             spec["template"], extra_callbacks=callbacks)
    finally:
        if logger:
            logger.close()
    if rank0:
        note = logger.finding() if logger else None
        # rank 0's peak GPU memory: the pipeline's stage record keeps it
        saved.save(spec["result_file"], result, RankInfo(
            os.getpid(), int(os.environ.get("WORLD_SIZE", "1")), process_peak_gb(),
            [note] if note else []))


def _node_main(spec_path: str) -> int:
    """One machine's part of a launched stage (`python -m tasks.launch node SPEC`, what the
    Kubernetes and Slurm examples run on every machine): `accelerate launch` of SPEC's
    stage with this machine's rank, the first machine's address and the port from the
    environment. Machine 0's rank 0 writes the result file beside the spec's checkpoints."""
    import torch

    cfg = PipelineConfig.model_validate(json.loads(Path(spec_path).read_text())["config"])
    t = cfg.train
    env = dict(os.environ)
    local = max(1, t.num_processes // t.num_machines)
    env.setdefault("GRPO_TORCH_THREADS", str(max(1, (os.cpu_count() or 1) // local)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = launch_command(cfg, Path(spec_path).resolve(), torch.cuda.is_available(), env)
    return subprocess.run(cmd, env=env, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    if sys.argv[1] == "node":
        sys.exit(_node_main(sys.argv[2]))
    _rank_main(sys.argv[1])
