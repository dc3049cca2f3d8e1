"""The deployment infrastructure under infra/, checked by the tools that consume it:

- infra/accelerate/*.yaml: accelerate's own config loader, its launcher's argument
  resolution and the DeepSpeed/FSDP plugins each rank would build; cpu_2proc.yaml is
  launched for real (two processes, one all-reduce over gloo).
- infra/compose.yaml: `docker compose config` where Compose v2 is installed, and always
  structural checks (services, depends_on, wiring between services, GPU reservation,
  images built from infra/docker/) and the lock-down: every port on loopback unless
  GRPO_BIND_ADDR / MINIO_BIND_ADDR say otherwise, no secret with a default, both servers
  behind authentication; infra/make_secrets.py (`make secrets`) writes what it requires.
- infra/docker/Dockerfile.*: each installs exactly its lock (infra/setup.sh), the GPU image's
  CUDA base is the locked torch's CUDA, the base's Python the lock's; every COPY source exists.
- infra/k8s/base-job-template.json: Prefect's work-pool validation, then the Kubernetes
  worker's own rendering of a flow run's Job (GPU limit, node selector, tolerations).
- infra/prefect.yaml, infra/k8s/prefect.yaml: Prefect's prefect.yaml model, entrypoints
  that import as flows, parameters the flows take, configs that load, cron schedules, and
  work pools that compose or the k8s files define.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from functools import cache
from pathlib import Path
from unittest import mock

import pytest
import yaml
from accelerate.utils import DistributedType

from grpo_core.versions import parse_lock

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
ACCEL = INFRA / "accelerate"
COMPOSE = INFRA / "compose.yaml"
K8S_TEMPLATE = INFRA / "k8s" / "base-job-template.json"
DEPLOY_FILES = [INFRA / "prefect.yaml", INFRA / "k8s" / "prefect.yaml"]
IMAGE_WORKDIR = "/opt/grpo"  # where both images install the project


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- accelerate

# file -> (distributed_type, num_processes, use_cpu). cpu_2proc is MULTI_GPU on purpose:
# see its header (accelerate launches MULTI_CPU configs only through mpirun).
ACCEL_EXPECTED = {
    "single_gpu.yaml": (DistributedType.NO, 1, False),
    "multi_gpu.yaml": (DistributedType.MULTI_GPU, 8, False),
    "zero2.yaml": (DistributedType.DEEPSPEED, 8, False),
    "zero3.yaml": (DistributedType.DEEPSPEED, 8, False),
    "fsdp.yaml": (DistributedType.FSDP, 8, False),
    "cpu_2proc.yaml": (DistributedType.MULTI_GPU, 2, True),
}


def test_accelerate_folder_holds_exactly_the_documented_configs():
    assert sorted(p.name for p in ACCEL.glob("*.yaml")) == sorted(ACCEL_EXPECTED)


@pytest.mark.parametrize("name", sorted(ACCEL_EXPECTED))
def test_accelerate_config_loads_with_accelerates_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    cfg = load_config_from_file(str(ACCEL / name))  # raises on unknown top-level keys
    dist, nproc, use_cpu = ACCEL_EXPECTED[name]
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type == dist
    assert cfg.num_processes == nproc
    assert cfg.num_machines == 1 and cfg.machine_rank == 0
    assert cfg.use_cpu is use_cpu
    assert cfg.mixed_precision == ("no" if use_cpu else "bf16")
    # Nested keys are copied onto the launcher's arguments (fsdp_config.x -> fsdp_x) without
    # any check: a misspelt one would be silently ignored, so check them against the parser.
    known = {a.dest for a in launch_command_parser()._actions}
    nested = [*cfg.deepspeed_config, *cfg.fsdp_config]
    assert nested or dist not in (DistributedType.DEEPSPEED, DistributedType.FSDP)
    unknown = [k for k in nested if k not in known]
    assert not unknown, f"{name}: keys accelerate launch does not know: {unknown}"


def _resolved_launch(name: str):
    """What `accelerate launch --config_file infra/accelerate/NAME train.py` resolves to, and
    the environment its launcher gives each rank (no process is started)."""
    from accelerate_launch import resolved_launch

    return resolved_launch(ACCEL / name)


@pytest.mark.parametrize("name,launcher", [
    ("single_gpu.yaml", "simple"), ("multi_gpu.yaml", "torchrun"), ("cpu_2proc.yaml", "torchrun"),
    ("zero2.yaml", "deepspeed"), ("zero3.yaml", "deepspeed"), ("fsdp.yaml", "torchrun"),
])
def test_accelerate_launch_resolves_each_config(name, launcher):
    """The launcher accelerate picks, and the plugin each rank would build from its env."""
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    got, args, env = _resolved_launch(name)
    assert got == launcher
    assert args.num_processes == ACCEL_EXPECTED[name][1]
    assert env["ACCELERATE_MIXED_PRECISION"] == ("no" if name == "cpu_2proc.yaml" else "bf16")
    with mock.patch.dict(os.environ, env):
        if name.startswith("zero"):
            plugin = DeepSpeedPlugin()
            stage = int(name[4])
            assert plugin.zero_stage == stage
            assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
            assert plugin.zero3_init_flag is (stage == 3)
            # ZeRO-3 shards weights: without gathering them on save, checkpoints are shards.
            assert plugin.deepspeed_config["zero_optimization"][
                "stage3_gather_16bit_weights_on_model_save"] is (stage == 3)
        elif name == "fsdp.yaml":
            plugin = FullyShardedDataParallelPlugin()
            assert plugin.fsdp_version == 2
            assert plugin.auto_wrap_policy is not None
            # Full state dicts: checkpoints reload with from_pretrained (eval, vLLM).
            assert plugin.state_dict_type.name == "FULL_STATE_DICT"
        else:
            assert env.get("ACCELERATE_USE_DEEPSPEED") is None and env.get("ACCELERATE_USE_FSDP") is None


_PROBE = """
import torch, torch.distributed as dist
from accelerate import PartialState
state = PartialState(cpu=True)  # what transformers does for TrainingArguments(use_cpu=True)
t = torch.tensor([state.process_index + 1.0])
dist.all_reduce(t)
# one file per rank: two ranks printing to one pipe interleave their lines
with open(f"rank{state.process_index}.txt", "w") as fh:
    print(state.process_index, state.num_processes, state.distributed_type.value,
          dist.get_backend(), int(t.item()), file=fh)
# a clean shutdown: a gloo rank exiting with its group alive can abort in teardown
# ("terminate called without an active exception"), failing the launch after the work
dist.barrier()
dist.destroy_process_group()
"""


def test_cpu_2proc_launches_two_ranks_that_all_reduce_over_gloo(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ACCEL / "cpu_2proc.yaml"), "--main_process_port", str(_free_port()), str(probe)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = sorted(f.read_text().split() for f in tmp_path.glob("rank*.txt"))
    # ranks 0 and 1 of 2, on gloo; all_reduce of (1, 2) gives 3 on both
    assert lines == [["0", "2", "MULTI_CPU", "gloo", "3"], ["1", "2", "MULTI_CPU", "gloo", "3"]], out.stdout


# --------------------------------------------------------------------------- compose

COMPOSE_SERVICES = {"prefect-db", "mlflow-db", "minio", "minio-init", "mlflow", "mlflow-users",
                    "prefect-server", "worker-cpu", "worker-gpu"}
_BRACED = re.compile(r"\$\{([^}]*)\}")
_BARE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_WITH_DEFAULT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(:?-)(.+)$")
_REQUIRED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):\?(.+)$")  # ${VAR:?message}
# Names of what must never have a default: passwords, keys, secrets, tokens, auth strings
# (not AWS_ACCESS_KEY_ID: MinIO's root user name).
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH_STRING|(^|_)KEY(?!_ID)(_|$)")


@cache
def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


def _interpolate(text: str) -> str:
    """Compose's interpolation with only the required variables set, each to "<VAR>":
    ${VAR:-default} -> default, ${VAR:?message} -> <VAR>, $$ -> $."""
    def one(m: re.Match) -> str:
        ref = m.group(1)
        required = _REQUIRED.match(ref)
        return f"<{required.group(1)}>" if required else _WITH_DEFAULT.match(ref).group(3)

    return _BRACED.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def _service_env(name: str) -> dict[str, str]:
    env = _compose()["services"][name].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _interpolate(str(v)) for k, v in env.items()}


def _command(name: str) -> list[str]:
    cmd = _compose()["services"][name]["command"]
    return [_interpolate(c) for c in (cmd if isinstance(cmd, list) else cmd.split())]


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or a standalone v2 `docker-compose`; None if neither."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], check=False,
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    exe = shutil.which("docker-compose")
    if exe:
        out = subprocess.run([exe, "version", "--short"], check=False, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2"):
            return [exe]
    return None


def _make_secrets(env_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(INFRA / "make_secrets.py"), "--env-file", str(env_file)],
                          check=True, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("profile", [[], ["--profile", "gpu"]], ids=["default", "gpu"])
def test_compose_file_passes_docker_compose_config(profile, tmp_path):
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no Compose v2 here (`docker compose` / `docker-compose`); structural checks below")
    # None of the file's variables from the environment (nor a developer's infra/.env: --env-file)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POSTGRES_", "MINIO_", "MLFLOW_", "PREFECT_", "GRPO_"))}

    def config(env_file: Path) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, "-f", str(COMPOSE), "--env-file", str(env_file), *profile,
                               "config", "-q"], check=False, capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=60)

    # With what `make secrets` writes: valid, and no variable left unset.
    _make_secrets(tmp_path / "full.env")
    out = config(tmp_path / "full.env")
    assert out.returncode == 0, out.stderr
    assert "is not set" not in out.stderr, out.stderr
    # Without it: refused, naming a missing secret, instead of a stack with known passwords.
    (tmp_path / "empty.env").write_text("")
    out = config(tmp_path / "empty.env")
    assert out.returncode != 0 and "make secrets" in out.stderr, out.stderr


def test_compose_services_and_dependencies():
    services = _compose()["services"]
    assert COMPOSE_SERVICES <= set(services), COMPOSE_SERVICES - set(services)
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in services, f"{name} depends on undefined service {dep}"
        assert "image" in svc or "build" in svc, f"{name}: neither image nor build"
    # The servers wait for their databases; MLflow also for its bucket.
    assert services["prefect-server"]["depends_on"]["prefect-db"]["condition"] == "service_healthy"
    assert services["mlflow"]["depends_on"]["mlflow-db"]["condition"] == "service_healthy"
    assert services["mlflow"]["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    for worker in ("worker-cpu", "worker-gpu"):
        assert set(services[worker]["depends_on"]) >= {"prefect-server", "mlflow"}
        # ... and for their MLflow user to exist
        assert services[worker]["depends_on"]["mlflow-users"]["condition"] == "service_completed_successfully"
    assert services["mlflow-users"]["depends_on"]["mlflow"]["condition"] == "service_healthy"


def test_compose_wiring_between_services():
    services = _compose()["services"]
    prefect_db, mlflow_db, minio = (_service_env(s) for s in ("prefect-db", "mlflow-db", "minio"))
    # Prefect server on its PostgreSQL, with the database's own credentials
    url = _service_env("prefect-server")["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert url == (f"postgresql+asyncpg://{prefect_db['POSTGRES_USER']}:{prefect_db['POSTGRES_PASSWORD']}"
                   f"@prefect-db:5432/{prefect_db['POSTGRES_DB']}")
    # MLflow on its PostgreSQL, artifacts in the bucket that minio-init creates, through MinIO
    cmd = _command("mlflow")
    assert cmd[:2] == ["mlflow", "server"] and "--serve-artifacts" in cmd
    opts = dict(c.split("=", 1) for c in cmd if c.startswith("--") and "=" in c)
    assert opts["--backend-store-uri"] == (
        f"postgresql://{mlflow_db['POSTGRES_USER']}:{mlflow_db['POSTGRES_PASSWORD']}"
        f"@mlflow-db:5432/{mlflow_db['POSTGRES_DB']}")
    init_env = _service_env("minio-init")
    assert opts["--artifacts-destination"] == f"s3://{init_env['MLFLOW_BUCKET']}"
    init_cmd = " ".join(_command("minio-init"))
    assert "mc mb" in init_cmd and "$MLFLOW_BUCKET" in init_cmd and "http://minio:9000" in init_cmd
    assert (init_env["MINIO_ROOT_USER"], init_env["MINIO_ROOT_PASSWORD"]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    ml = _service_env("mlflow")
    assert ml["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert (ml["AWS_ACCESS_KEY_ID"], ml["AWS_SECRET_ACCESS_KEY"]) == (
        minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert "mlflow:*" in ml["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")  # workers call http://mlflow:5000
    # Ports the clients use are the ones the servers listen on
    assert "--port=5000" in cmd and _published(services["mlflow"]) == [("127.0.0.1", "5000", "5000")]
    assert _command("prefect-server")[-2:] == ["--port", "4200"]
    for worker in ("worker-cpu", "worker-gpu"):
        env = _service_env(worker)
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert env["GRPO_REPO_DIR"] == IMAGE_WORKDIR  # the pull step of infra/prefect.yaml


def _compose_pools() -> dict[str, str]:
    """Work pools the compose workers create and poll: {pool: service}."""
    pools = {}
    for name, svc in _compose()["services"].items():
        cmd = _command(name) if "command" in svc else []
        if cmd[:3] in (["prefect", "worker", "start"], ["python", "-m", "flows.worker"]):
            pools[cmd[cmd.index("--pool") + 1]] = name
            assert cmd[cmd.index("--type") + 1] == "process", f"{name}: --type creates the pool"
    return pools


def test_compose_workers_and_gpu_reservation():
    assert _compose_pools() == {"grpo-cpu": "worker-cpu", "grpo-gpu": "worker-gpu"}
    gpu = _compose()["services"]["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"]
               and (d.get("count") == "all" or int(d.get("count", 0)) >= 1) for d in devices), devices
    assert "gpu" in gpu.get("profiles", []), "a CPU-only host must be able to `up` without it"
    assert "deploy" not in _compose()["services"]["worker-cpu"]


def test_compose_images_are_built_from_infra_docker():
    services = _compose()["services"]
    built = {}
    for name, svc in services.items():
        if "build" in svc:
            context = (INFRA / svc["build"]["context"]).resolve()
            dockerfile = context / svc["build"]["dockerfile"]
            assert context == ROOT, f"{name}: build context must be the repository root"
            assert dockerfile.is_file() and dockerfile.parent == INFRA / "docker", dockerfile
            built[svc["image"]] = dockerfile.name
    assert built == {"grpo-pipeline:cpu": "Dockerfile.cpu", "grpo-pipeline:gpu": "Dockerfile.gpu"}
    for name in ("mlflow", "prefect-server", "worker-cpu"):
        assert services[name]["image"] == "grpo-pipeline:cpu"
    assert services["worker-gpu"]["image"] == "grpo-pipeline:gpu"


def _published(svc: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each published port, no variable set."""
    out = []
    for port in svc.get("ports", []):
        if isinstance(port, dict):  # long syntax
            out.append((str(port.get("host_ip", "")), str(port.get("published", "")), str(port["target"])))
            continue
        parts = _interpolate(str(port)).split("/")[0].rsplit(":", 2)
        out.append(tuple(parts) if len(parts) == 3 else ("", *([""] * (2 - len(parts))), *parts))
    return out


def test_compose_publishes_every_port_on_loopback_only():
    services = _compose()["services"]
    published = {name: _published(svc) for name, svc in services.items() if svc.get("ports")}
    assert set(published) == {"mlflow", "prefect-server", "minio"}, published  # no database
    for name, ports in published.items():
        for addr, host_port, container_port in ports:
            # "5000:5000" (or "" / 0.0.0.0 / ::) would publish on every interface of the host
            assert addr == "127.0.0.1", f"{name}: {(addr, host_port, container_port)} not on loopback"
            assert host_port == container_port, name
    # ... unless the one variable of each says otherwise: the two servers, and MinIO apart.
    raw = {name: [str(p) for p in services[name]["ports"]] for name in published}
    for name, var in [("mlflow", "GRPO_BIND_ADDR"), ("prefect-server", "GRPO_BIND_ADDR"),
                      ("minio", "MINIO_BIND_ADDR")]:
        assert all(p.startswith(f"${{{var}:-127.0.0.1}}:") for p in raw[name]), raw[name]
    for name, svc in services.items():
        assert svc.get("network_mode") != "host", f"{name}: host networking publishes every port"


def test_compose_has_no_secret_with_a_default():
    refs = []
    for text in _strings(_compose()):
        text = text.replace("$$", "")  # an escaped $, passed to the container's shell
        assert not _BARE.search(text), f"unbraced variable: {text!r}"
        refs += _BRACED.findall(text)
    assert refs, "no ${VAR} found: the parser or the file changed"
    required = set()
    for ref in refs:
        req, dflt = _REQUIRED.match(ref), _WITH_DEFAULT.match(ref)
        assert req or dflt, f"${{{ref}}}: write ${{VAR:-default}} or, for a secret, ${{VAR:?message}}"
        name = (req or dflt).group(1)
        if _SECRET_NAME.search(name):
            assert req, f"${{{ref}}}: a secret must be required, never defaulted"
            assert "make secrets" in req.group(2), f"${{{ref}}}: the message should say how to fix it"
            required.add(name)
        else:
            assert dflt, f"${{{ref}}}: only secrets are required; give it a default"
    # Every secret-named setting of every service comes whole from a required variable ...
    for name, svc in _compose()["services"].items():
        env = svc.get("environment", {})
        for key, value in (env.items() if isinstance(env, dict) else []):
            if _SECRET_NAME.search(key):
                m = re.fullmatch(r"\$\{([A-Za-z_]\w*):\?[^}]+\}", str(value))
                assert m, f"{name}.{key} = {value!r}: must be ${{VAR:?...}}, no literal, no default"
    # ... and so does every password inside a URL (scheme://user:password@host).
    for text in _strings(_compose()):
        for pw in re.findall(r"://[^:/@\s]+:([^@\s]+)@", text):
            assert re.fullmatch(r"\$\{[A-Za-z_]\w*:\?[^}]+\}", pw), f"literal or defaulted password in {text!r}"
    assert required >= {"POSTGRES_PREFECT_PASSWORD", "POSTGRES_MLFLOW_PASSWORD", "MINIO_ROOT_PASSWORD",
                        "MLFLOW_ADMIN_PASSWORD", "MLFLOW_FLASK_SECRET_KEY", "MLFLOW_PIPELINE_PASSWORD",
                        "PREFECT_AUTH_STRING"}, required


def _required_variables() -> set[str]:
    return {m.group(1) for text in _strings(_compose()) for ref in _BRACED.findall(text)
            if (m := _REQUIRED.match(ref))}


def test_compose_servers_require_authentication():
    import configparser

    services = _compose()["services"]
    raw_env = lambda name: {k: str(v) for k, v in services[name]["environment"].items()}
    # MLflow: the basic-auth app, an admin from required variables, MLflow's CSRF key, and our
    # settings file (from the image: infra/ is copied to IMAGE_WORKDIR) with no password in it.
    cmd = _command("mlflow")
    assert "--app-name=basic-auth" in cmd or cmd[cmd.index("--app-name") + 1] == "basic-auth"
    ml, ml_raw = _service_env("mlflow"), raw_env("mlflow")
    assert ml_raw["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_ADMIN_PASSWORD:?")
    assert ml_raw["MLFLOW_FLASK_SERVER_SECRET_KEY"].startswith("${MLFLOW_FLASK_SECRET_KEY:?")
    ini_path = ml["MLFLOW_AUTH_CONFIG_PATH"]
    assert ini_path.startswith(IMAGE_WORKDIR + "/")
    ini = configparser.ConfigParser()
    assert ini.read(ROOT / ini_path.removeprefix(IMAGE_WORKDIR + "/"))
    auth = ini["mlflow"]
    assert "admin_password" not in auth, "the admin password comes from the environment only"
    assert auth["default_permission"] in ("READ", "NO_PERMISSIONS")
    # the user store survives a container's re-creation: it lives on a named volume
    db_path = auth["database_uri"].removeprefix("sqlite:///")
    mounts = dict(v.split(":", 1) for v in services["mlflow"]["volumes"])
    assert any(db_path.startswith(m.rstrip("/") + "/") and vol in _compose()["volumes"]
               for vol, m in mounts.items()), (db_path, mounts)
    # Prefect: every API call but /api/health needs the auth string
    prefect_raw = raw_env("prefect-server")
    assert prefect_raw["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_AUTH_STRING:?")
    # Healthchecks call the endpoints both servers answer without credentials
    assert "5000/health" in " ".join(services["mlflow"]["healthcheck"]["test"])
    assert "4200/api/health" in " ".join(services["prefect-server"]["healthcheck"]["test"])
    # Workers: the same Prefect auth string; MLflow as the pipeline's user, which mlflow-users
    # creates (with the same password) using the admin's credentials.
    users, users_raw = _service_env("mlflow-users"), raw_env("mlflow-users")
    users_cmd = _command("mlflow-users")
    assert users_cmd[:2] == ["python", "infra/mlflow_users.py"] and (INFRA / "mlflow_users.py").is_file()
    assert users_raw["MLFLOW_TRACKING_PASSWORD"] == ml_raw["MLFLOW_AUTH_ADMIN_PASSWORD"]
    assert users["MLFLOW_TRACKING_USERNAME"] == ml["MLFLOW_AUTH_ADMIN_USERNAME"]
    assert users["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    password_var = users_cmd[users_cmd.index("--password-env") + 1]
    for worker in ("worker-cpu", "worker-gpu"):
        env, env_raw = _service_env(worker), raw_env(worker)
        assert env_raw["PREFECT_API_AUTH_STRING"] == prefect_raw["PREFECT_SERVER_API_AUTH_STRING"]
        assert env["MLFLOW_TRACKING_USERNAME"] == users_cmd[2] != ml["MLFLOW_AUTH_ADMIN_USERNAME"]
        assert env_raw["MLFLOW_TRACKING_PASSWORD"] == users_raw[password_var]
        assert env_raw["MLFLOW_TRACKING_PASSWORD"].startswith("${MLFLOW_PIPELINE_PASSWORD:?")


def test_make_secrets_writes_every_required_variable(tmp_path):
    env_file = tmp_path / ".env"
    first = _make_secrets(env_file)
    assert oct(env_file.stat().st_mode & 0o777) == oct(0o600)
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines()
                  if line and not line.startswith("#"))
    assert _required_variables() <= set(values), _required_variables() - set(values)
    for name in _required_variables():
        # random, long enough for MinIO (>= 8), and safe inside a connection URL and a .env line
        assert re.fullmatch(r"[A-Za-z0-9_:-]{24,}", values[name]), name
        assert values[name] not in first.stdout  # names are printed, never values
    _make_secrets(tmp_path / "other.env")
    other = dict(line.split("=", 1) for line in (tmp_path / "other.env").read_text().splitlines()
                 if line and not line.startswith("#"))
    assert all(values[n] != other[n] for n in _required_variables())
    # An existing file is never overwritten: complete -> untouched; partial -> its values kept,
    # the missing ones appended; too open -> made private.
    before = env_file.read_bytes()
    assert "nothing written" in _make_secrets(env_file).stdout
    assert env_file.read_bytes() == before
    partial = tmp_path / "partial.env"
    partial.write_text("POSTGRES_MLFLOW_PASSWORD=kept-as-it-is-0123456789\n")
    partial.chmod(0o644)
    out = _make_secrets(partial).stdout
    assert "POSTGRES_PREFECT_PASSWORD" in out and "POSTGRES_MLFLOW_PASSWORD" not in out.split("added:")[-1]
    text = partial.read_text()
    assert text.startswith("POSTGRES_MLFLOW_PASSWORD=kept-as-it-is-0123456789\n")
    assert text.count("POSTGRES_MLFLOW_PASSWORD=") == 1 and partial.stat().st_mode & 0o777 == 0o600
    # where `make secrets` writes it, git never takes it
    assert "infra/.env" in (ROOT / ".gitignore").read_text().splitlines()
    assert re.search(r"^secrets:\n\t.*infra/make_secrets\.py", (ROOT / "Makefile").read_text(), re.M)


# --------------------------------------------------------------------------- Dockerfiles


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in path.read_text().splitlines():
        if raw.strip().startswith("#") and not current:
            continue
        current += raw.rstrip().removesuffix("\\") + " "
        if not raw.rstrip().endswith("\\"):
            if current.strip():
                lines.append(current.strip())
            current = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _package_roots() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return {p.rstrip("*") for p in include} | {project["project"]["readme"], "pyproject.toml", "configs"}


# Base image -> the Python it brings: the lock's target Python must be that one (infra/setup.sh
# refuses another, exit 2, in the build).
IMAGE_PYTHON = {"python:3.11-slim": "3.11", "ubuntu24.04": "3.12", "ubuntu22.04": "3.10"}


@pytest.mark.parametrize("name,lock", [("Dockerfile.cpu", "cpu.txt"), ("Dockerfile.gpu", "gpu.txt")])
def test_dockerfile_installs_exactly_its_lock(name, lock):
    """One install of the lock, by infra/setup.sh as `make setup` does (LOCK= given: no GPU
    at build time), never the ranges (`pip install -e ".[...]"`); anything else installed is
    constrained by the lock; the base image brings the lock's Python."""
    ins = _instructions(INFRA / "docker" / name)
    runs = [a for i, a in ins if i == "RUN"]
    setup = [a for a in runs if "infra/setup.sh" in a]
    assert len(setup) == 1 and re.search(rf"\bLOCK=locks/{re.escape(lock)}\b", setup[0]), setup
    ranges = [a for a in runs if re.search(r"pip install[^&]*(\s-e\s|--editable|\.\[)", a)]
    assert not ranges, f"{name}: installs pyproject's ranges: {ranges}"
    others = [a for a in runs if re.search(r"pip install", a)]
    assert all(f"-c locks/{lock}" in a for a in others), f"{name}: unconstrained installs {others}"
    (base,) = [a for i, a in ins if i == "FROM"]
    flavour = base if base.startswith("python:") else base.rsplit("-", 1)[-1]
    assert IMAGE_PYTHON[flavour] == parse_lock(ROOT / "locks" / lock).python, (base, lock)
    copied = set()
    for i, args in ins:
        if i == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"{name}: COPY {src} does not exist"
                copied.add(src.rstrip("/"))
    assert _package_roots() | {"locks", "infra"} <= copied, \
        f"{name} misses {_package_roots() | {'locks', 'infra'} - copied}"
    assert ("WORKDIR", IMAGE_WORKDIR) in ins


def test_gpu_image_cuda_is_the_locks_torch_cuda():
    """The GPU image's CUDA base (nvidia/cuda:X.Y.Z-runtime-...) is the CUDA of the locked torch:
    the major.minor of the locked CUDA runtime wheel, and the major grpo_core/driver.py reads
    from the lock (the one the driver check uses)."""
    from grpo_core.driver import cuda_major

    (base,) = [a for i, a in _instructions(INFRA / "docker" / "Dockerfile.gpu") if i == "FROM"]
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-(?:cudnn-)?runtime-ubuntu\d+\.\d+", base)
    assert m, base
    pins = parse_lock(ROOT / "locks" / "gpu.txt").pins
    runtime = pins["nvidia-cuda-runtime"].split(".")[:2]
    assert [m.group(1), m.group(2)] == runtime, (base, pins["nvidia-cuda-runtime"])
    assert int(m.group(1)) == cuda_major(pins), (base, cuda_major(pins))


# --------------------------------------------------------------------------- Kubernetes


class _NoServer:
    """A Prefect client that fails if used: rendering a job must not need the API."""

    def __getattr__(self, name):
        raise AssertionError(f"unexpected Prefect API call: {name}")


@cache
def _template() -> dict:
    return json.loads(K8S_TEMPLATE.read_text())


def _render(values: dict) -> dict:
    """The Job manifest the Kubernetes worker would submit for a flow run with `values`."""
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    cfg = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        _template(), values, client=_NoServer()))
    cfg.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="infra-test"))
    return cfg.job_manifest


def _validate_job_variables(values: dict) -> None:
    """The server's check of deployment job variables against the pool's schema."""
    from prefect.utilities.schema_tools import validate

    validate(values, _template()["variables"], raise_on_error=True, preprocess=True, ignore_required=True)


def test_k8s_template_passes_prefect_work_pool_validation():
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import is_valid_schema
    from prefect_kubernetes.worker import KubernetesWorker

    # job_configuration placeholders must all be declared variables
    WorkPoolCreate(name="grpo-k8s", type="kubernetes", base_job_template=_template())
    is_valid_schema(_template()["variables"], preprocess=False)
    props = _template()["variables"]["properties"]
    assert {"gpu_count", "node_selector", "tolerations"} <= set(props)
    # Still a superset of the installed worker's default variables (image, env, cpu/memory...)
    default = KubernetesWorker.get_default_base_job_template()
    assert set(default["variables"]["properties"]) <= set(props)
    assert set(default["job_configuration"]) <= set(_template()["job_configuration"])


def test_k8s_template_renders_gpus_node_selector_and_tolerations():
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    values = {"gpu_count": 2, "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
              "tolerations": tolerations, "image": "grpo-pipeline:gpu"}
    _validate_job_variables(values)
    pod = _render(values)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["image"] == "grpo-pipeline:gpu"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == tolerations
    # NCCL needs more shared memory than a container's default 64 MiB
    shm = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm and shm[0]["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["args"] == ["prefect", "flow-run", "execute"]


def test_k8s_template_defaults_request_no_gpu_and_place_anywhere():
    pod = _render({})["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"].get("limits", {})
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_k8s_jobs_take_mlflow_credentials_from_a_secret_not_from_prefect():
    # The Job reads the pipeline's MLflow user from a Kubernetes Secret (envFrom) ...
    container = _render({})["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "grpo-credentials", "optional": True}}]
    container = _render({"credentials_secret": "team-a"})["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"][0]["secretRef"]["name"] == "team-a"
    # ... never from job variables, which Prefect keeps in its database in plain text.
    text = (INFRA / "k8s" / "prefect.yaml").read_text()
    assert "kubectl create secret generic grpo-credentials" in text
    for d in _deployments(INFRA / "k8s" / "prefect.yaml"):
        env = d["work_pool"].get("job_variables", {}).get("env", {})
        assert not [k for k in env if _SECRET_NAME.search(k)], (d["name"], env)
    # No Service, Ingress or host port: the Jobs publish nothing.
    assert not re.search(r'"(hostPort|hostNetwork|containerPort)"', K8S_TEMPLATE.read_text())


@pytest.mark.parametrize("bad", [
    {"gpu_count": -1}, {"gpu_count": "two"}, {"node_selector": {"pool": 3}},
    {"tolerations": [{"key": "x", "operator": "Sometimes"}]}, {"tolerations": {"key": "x"}},
])
def test_k8s_template_rejects_bad_job_variables(bad):
    from prefect.utilities.schema_tools.validation import ValidationError

    with pytest.raises(ValidationError):
        _validate_job_variables(bad)


# --------------------------------------------------------------------------- deployments


def _k8s_pools() -> set[str]:
    """Pools infra/k8s defines: the `prefect work-pool create` of infra/k8s/prefect.yaml."""
    text = (INFRA / "k8s" / "prefect.yaml").read_text()
    return set(re.findall(r"prefect work-pool create (\S+) --type kubernetes "
                          r"--base-job-template infra/k8s/base-job-template\.json", text))


POOLS_BY_FILE = {"prefect.yaml": _compose_pools, "k8s/prefect.yaml": _k8s_pools}


@cache
def _flow(entrypoint: str):
    from prefect.flows import Flow, load_flow_from_entrypoint

    path, func = entrypoint.split(":")
    flow = load_flow_from_entrypoint(f"{ROOT / path}:{func}")
    assert isinstance(flow, Flow), f"{entrypoint} is not a Prefect flow"
    return flow


def _deployments(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["deployments"]


def _id(path: Path) -> str:
    return str(path.relative_to(INFRA))


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=_id)
def test_deployment_file_parses_as_prefect_deploy_does(path):
    from prefect.cli.deploy._models import PrefectYamlModel

    raw = yaml.safe_load(path.read_text())
    model = PrefectYamlModel.model_validate(raw)
    assert model.deployments and len(model.deployments) == len(raw["deployments"])
    for d in model.deployments:
        assert d.name and d.entrypoint and d.work_pool and d.work_pool.name, d


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=_id)
def test_deployment_entrypoints_are_flows_taking_the_given_parameters(path):
    for d in _deployments(path):
        flow = _flow(d["entrypoint"])
        inspect.signature(flow.fn).bind(**d.get("parameters", {}))  # TypeError on unknown names


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=_id)
def test_deployment_configs_exist_and_load(path):
    from grpo_core.config import PipelineConfig, load_config

    checked = 0
    for d in _deployments(path):
        params = d.get("parameters", {})
        overrides = params.get("overrides") or []
        for item in overrides:
            value = item.split("=", 1)[1]
            if value.startswith("infra/"):
                assert (ROOT / value).is_file(), f"{d['name']}: {item}: no such file"
        if "config_path" not in params:
            continue
        sections = {o.split(".", 1)[0] for o in overrides}
        missing = sections - set(PipelineConfig.model_fields)
        if missing:  # the multi-process `train.*` fields land separately (issue #6)
            assert missing == {"train"}, f"{d['name']}: unknown config sections {missing}"
            overrides = [o for o in overrides if not o.startswith("train.")]
        load_config(ROOT / params["config_path"], overrides)
        checked += 1
    assert checked


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=_id)
def test_deployment_work_pools_are_defined_by_compose_or_k8s(path):
    own = POOLS_BY_FILE[_id(path)]()
    assert own, f"no pool defined for {_id(path)}"
    everywhere = set(_compose_pools()) | _k8s_pools()
    for d in _deployments(path):
        pool = d["work_pool"]["name"]
        assert pool in everywhere, f"{d['name']}: pool {pool} is defined nowhere"
        assert pool in own, f"{d['name']}: pool {pool} is not one {_id(path)} is meant for"


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=_id)
def test_deployment_schedules_are_valid_crons(path):
    from prefect.client.schemas.schedules import CronSchedule

    for d in _deployments(path):
        for s in d.get("schedules", []):
            CronSchedule(cron=s["cron"], timezone=s.get("timezone"))


def test_deployment_names_do_not_collide_across_files():
    seen = {}
    for path in DEPLOY_FILES:
        for d in _deployments(path):
            key = (_flow(d["entrypoint"]).name, d["name"])
            assert key not in seen, f"{key} in both {seen.get(key)} and {_id(path)}: one overwrites the other"
            seen[key] = _id(path)


def test_k8s_deployments_render_their_jobs():
    pull = yaml.safe_load((INFRA / "k8s" / "prefect.yaml").read_text())["pull"]
    assert pull[0]["prefect.deployments.steps.set_working_directory"]["directory"] == IMAGE_WORKDIR
    gpu_counts = []
    for d in _deployments(INFRA / "k8s" / "prefect.yaml"):
        values = d["work_pool"].get("job_variables", {})
        _validate_job_variables(values)
        container = _render(values)["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == values["image"]
        assert container["image"].split(":")[-1] == ("gpu" if values.get("gpu_count") else "cpu"), d["name"]
        limits = container["resources"].get("limits", {})
        assert limits.get("nvidia.com/gpu") == values.get("gpu_count"), d["name"]
        if "train.num_processes=8" in d.get("parameters", {}).get("overrides", []):
            assert values["gpu_count"] == 8, f"{d['name']}: one process per GPU"
        gpu_counts.append(values.get("gpu_count"))
    assert {None, 1, 8} <= set(gpu_counts)  # CPU jobs, one GPU, a node of 8
