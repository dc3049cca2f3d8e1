"""`prefect worker start` that stops when told to: `python -m flows.worker --pool grpo-cpu`
(any `prefect worker start` option after it).

Why a wrapper: on SIGTERM (docker stop, systemd, Kubernetes, `kill`) a Prefect 3.9 worker
sends itself SIGINT, stops polling and then *waits for its flow runs to finish*
(prefect.utilities.processutils.setup_signal_handlers_worker: "the signal is not forwarded
to subprocesses"); each flow run is a `python -m prefect.engine` process in a session of
its own, so no signal to the worker's process group reaches it either. A pipeline's run
takes minutes to hours: measured, a worker was alive 90 s after SIGTERM mid-run, and a
second SIGTERM SIGKILLs the worker alone, leaving its flow run orphaned and still training.

Here SIGTERM ends the flow runs first: SIGTERM to each run's process group (Prefect's
engine turns it into a crashed run; the pipeline marks its MLflow runs FAILED and a re-run
resumes from the cached stages), repeated while it lives, SIGKILL after --grace seconds
(12); then SIGINT to the worker, whose drain finds nothing left. Ctrl-C (SIGINT) keeps
Prefect's meaning, finish the runs then stop; a second Ctrl-C stops them as SIGTERM does.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

GRACE_S = 12.0  # a flow run's time to stop after the first SIGTERM
RESEND_S = 4.0  # SIGTERM again this often while it has not
WORKER_GRACE_S = 15.0  # the worker's, after its runs


def _prefect() -> str:
    here = Path(sys.executable).parent / "prefect"
    return str(here) if here.exists() else (shutil.which("prefect") or "prefect")


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_group(proc: psutil.Process, signum: int) -> None:
    """`signum` to `proc`'s process group (a flow run and what it started), else to it."""
    try:
        pgid = os.getpgid(proc.pid)
        if pgid == proc.pid:
            os.killpg(pgid, signum)
        else:
            proc.send_signal(signum)
    except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
        pass


def stop(worker: subprocess.Popen, grace_s: float = GRACE_S,
         seen: dict[int, psutil.Process] | None = None) -> int:
    """End `worker`'s flow runs, then the worker. `seen`: its flow runs as last seen (a
    worker that died already has no children left).

    SIGTERM to each run's process group, again every RESEND_S while it lives: Prefect's
    engine raises TerminationSignal from its handler, and one raised while the run's main
    thread is in a finaliser is lost ("Exception ignored in ... __del__": measured, the run
    went on training). What lives after `grace_s` is SIGKILLed. The worker is still up
    meanwhile, so it sees each run end and reports it crashed; then SIGINT (its drain finds
    nothing left), SIGKILL after WORKER_GRACE_S."""
    runs = {**(seen or {}), **_runs(worker.pid)}
    family = list({p.pid: p for r in runs.values() for p in (r, *_descendants(r.pid))}.values())
    deadline, resend = time.monotonic() + grace_s, 0.0
    while (alive := [r for r in runs.values() if _alive(r)]) and time.monotonic() < deadline:
        if time.monotonic() >= resend:
            for run in alive:
                _signal_group(run, signal.SIGTERM)
            resend = time.monotonic() + RESEND_S
        time.sleep(0.2)
    for p in [*runs.values(), *family]:
        if _alive(p):
            _signal_group(p, signal.SIGKILL)  # its group if it leads one, else itself
    if worker.poll() is None:
        time.sleep(1.0)  # the worker sees its runs' ends (and reports them) before it drains
        worker.send_signal(signal.SIGINT)
    try:
        return worker.wait(timeout=WORKER_GRACE_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _runs(pid: int) -> dict[int, psutil.Process]:
    """The worker's children: its flow runs (`python -m prefect.engine`, one each)."""
    try:
        return {p.pid: p for p in psutil.Process(pid).children()}
    except psutil.NoSuchProcess:
        return {}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    grace = GRACE_S
    if "--grace" in args:
        i = args.index("--grace")
        grace = float(args[i + 1])
        del args[i:i + 2]
    worker = subprocess.Popen([_prefect(), "worker", "start", *args])
    asked: list[int] = []

    def on_signal(signum, frame) -> None:
        asked.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # the terminal's Ctrl-C reaches the worker too
    seen: dict[int, psutil.Process] = {}
    while True:
        if signal.SIGTERM in asked or asked.count(signal.SIGINT) >= 2:
            print(f"flows.worker: stopping the worker's flow runs, then the worker "
                  f"(SIGKILL after {grace:.0f} s)", file=sys.stderr, flush=True)
            code = stop(worker, grace, seen)
            return 128 + signal.SIGTERM if signal.SIGTERM in asked else code
        if worker.poll() is not None:
            return worker.returncode
        seen = {pid: p for pid, p in {**seen, **_runs(worker.pid)}.items() if p.is_running()}
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
