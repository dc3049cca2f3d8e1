"""The multi-node examples, without a cluster:

- infra/k8s/grpo-multinode.yaml: read into the Kubernetes client's own models (V1Service,
  V1Job) and back, so a misspelt key (dropped by the models) fails; then the wiring: an
  indexed Job of train.num_machines pods all at once, a headless Service whose name is the
  pods' subdomain and whose selector matches the Job's pods, MASTER_ADDR naming pod 0
  through it, and what each pod's environment gives tasks.launch.rendezvous.
- infra/slurm/grpo-multinode.sbatch: run under bash with a fake Slurm environment and stub
  `scontrol` / `srun` / python on PATH; each "node" records its argv and environment, which
  must give ranks 0..N-1, the first host as address and port 29500.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import types
from pathlib import Path

import pytest
import yaml

from tasks.rendezvous import DEFAULT_PORT, rendezvous

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "infra" / "k8s" / "grpo-multinode.yaml"
SBATCH = ROOT / "infra" / "slurm" / "grpo-multinode.sbatch"


def _docs() -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all(K8S.read_text())}


def _scalars_as_str(node):
    if isinstance(node, dict):
        return {k: _scalars_as_str(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_scalars_as_str(v) for v in node]
    return str(node)


def test_k8s_example_reads_into_the_kubernetes_models_without_loss():
    from kubernetes_asyncio.client import ApiClient

    async def round_trip(doc: dict, klass: str) -> dict:
        async with ApiClient() as api:
            obj = api.deserialize(types.SimpleNamespace(data=json.dumps(doc)), klass)
            return api.sanitize_for_serialization(obj)

    docs = _docs()
    assert sorted(docs) == ["Job", "Service"]
    for kind, klass in (("Service", "V1Service"), ("Job", "V1Job")):
        back = asyncio.run(round_trip(docs[kind], klass))
        assert _scalars_as_str(back) == _scalars_as_str(docs[kind]), kind


def test_k8s_example_wires_an_indexed_job_to_a_headless_service():
    docs = _docs()
    svc, job = docs["Service"], docs["Job"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2  # every machine at once
    assert svc["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == svc["metadata"]["name"]
    # Kubernetes labels a Job's pods with batch.kubernetes.io/job-name=<job name>
    assert svc["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    # pod i of an indexed Job is named <job>-<i>; under the subdomain it resolves as <job>-<i>.<svc>
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    assert int(env["MASTER_PORT"]) == DEFAULT_PORT == svc["spec"]["ports"][0]["port"]
    assert container["command"][:4] == ["python", "-m", "tasks.launch", "node"]
    assert container["command"][4] == "$(GRPO_SPEC)" and env["GRPO_SPEC"].startswith("/shared/")
    assert any(m["mountPath"] == "/shared" for m in container["volumeMounts"])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    # what each pod's environment gives the launcher (Kubernetes sets JOB_COMPLETION_INDEX)
    for i in range(spec["completions"]):
        got = rendezvous(spec["completions"], None, {**env, "JOB_COMPLETION_INDEX": str(i)})
        assert got == (i, env["MASTER_ADDR"], DEFAULT_PORT)


_STUBS = {
    # scontrol show hostnames LIST: a fake expansion of the job's node list
    "scontrol": '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || exit 9\nprintf "gpu007\\ngpu008\\n"\n',
    # srun: one "task" per node, as Slurm would, each with its SLURM_NODEID
    "srun": ('#!/bin/sh\necho "$@" > "$RECORD/srun.args"\n'
             'while [ "${1#-}" != "$1" ]; do shift; done\n'
             'i=0; while [ $i -lt "$SLURM_NNODES" ]; do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; '
             'i=$((i+1)); done\n'),
    # the "python" each node runs: records its argv and the environment the launcher reads
    "python": ('#!/bin/sh\n{ echo "$@"; echo "$SLURM_NODEID $MASTER_ADDR $MASTER_PORT"; } '
               '> "$RECORD/node$SLURM_NODEID"\n'),
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_sbatch_dry_run_starts_one_launcher_per_node(tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in _STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    record = tmp_path / "record"
    record.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "NODE_RANK"))}
    env.update(PATH=f"{stubs}{os.pathsep}{env['PATH']}", RECORD=str(record), GRPO_PYTHON="python",
               SLURM_JOB_NODELIST="gpu[007-008]", SLURM_NNODES="2", SLURM_JOB_ID="42")
    out = subprocess.run(["bash", str(SBATCH), "/shared/stage/grpo-spec.json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    srun = (record / "srun.args").read_text().split()
    assert "--ntasks-per-node=1" in srun and "--nodes=2" in srun
    for i in range(2):
        argv, envline = (record / f"node{i}").read_text().splitlines()
        assert argv == "-m tasks.launch node /shared/stage/grpo-spec.json"
        node_id, addr, port = envline.split()
        assert rendezvous(2, None, {"SLURM_NODEID": node_id, "MASTER_ADDR": addr, "MASTER_PORT": port,
                                    "SLURM_JOB_NODELIST": "gpu[007-008]"}) == (i, "gpu007", DEFAULT_PORT)
    # the #SBATCH header asks for what the script assumes
    header = [ln.split(None, 1)[1] for ln in SBATCH.read_text().splitlines() if ln.startswith("#SBATCH")]
    assert "--nodes=2" in header and "--ntasks-per-node=1" in header


def test_slurm_sbatch_refuses_without_a_spec(tmp_path):
    out = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, timeout=30,
                         cwd=ROOT, check=False, env={**os.environ, "SLURM_JOB_NODELIST": "a"})
    assert out.returncode != 0 and "usage" in out.stderr
