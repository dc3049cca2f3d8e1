"""Presets and documented examples that validate (issue 23, item 7; issue 34, item 6): every
fenced command of the README and of docs/*.md is checked. A `grpo ...` command names a real
command and only its options, and one that takes a config passes `grpo config show` with its
`--set`s; a `make` target is the Makefile's; a `prefect deployment run` names a deployment
the docs deploy; every repository path a command names exists; every relative link resolves,
anchor included. Also: the vLLM server's own memory share and data parallelism; the offline
engine's data parallel on a dense model refused naming the field; project.seed reaching
every sampler's arguments."""
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from flows.cli import app
from grpo_core.config import ConfigError, config_from_dict, load_config
from grpo_core.generation.rollout import check_offline_data_parallel
from tasks.launch import launch_plan
from tasks.vllm_server import server_command

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TAKES_CONFIG = {("run",), ("sft",), ("train",), ("config", "show")}


def fenced_lines(path: Path) -> list[str]:
    """The lines of a markdown file's fenced blocks, continuations (`\\` at the end) joined."""
    text = path.read_text(encoding="utf-8")
    return [line for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
            for line in re.sub(r"\\\n\s*", " ", block).splitlines()]


def grpo_lines(path: Path) -> list[str]:
    """What follows `grpo` on each fenced `grpo ...` line (also `.venv/bin/grpo ...`)."""
    return [m.group(1) for line in fenced_lines(path)
            if (m := re.match(r"\s*(?:\S*/)?grpo\s+(.*)", line))]


def readme_commands(path: Path) -> list[list[str]]:
    """Each fenced `grpo ...` line of a doc (comments and `[optional]` placeholders dropped),
    as argv after `grpo`."""
    cmds = []
    for rest in grpo_lines(path):
        argv = shlex.split(re.sub(r"\[[^\]]*\]", " ", rest), comments=True)
        cmds.append([a for a in argv if a != "|"])
    return cmds


def config_and_sets(argv: list[str]) -> tuple[str, list[str]] | None:
    """(CONFIG, --set values) of a command that takes a config and names one; else None."""
    words = tuple(a for a in argv[:2] if not a.startswith("-"))
    if words[:1] not in TAKES_CONFIG and words[:2] not in TAKES_CONFIG:
        return None
    configs = [a for a in argv if a.endswith((".yaml", ".yml")) and not a.startswith("-")]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return (configs[0], sets) if configs else None


EXAMPLES = [(doc.relative_to(ROOT).as_posix(), *c) for doc in DOCS
            for c in map(config_and_sets, readme_commands(doc)) if c]


def test_the_docs_are_read():
    names = {d.relative_to(ROOT).as_posix() for d in DOCS}
    assert {"README.md", "docs/gpus.md", "docs/configs.md", "docs/benchmarks.md"} <= names


def test_the_readme_keeps_the_three_commands():
    """Setup, the main job and the tests, as .ci/run and a newcomer run them."""
    lines = [line.split("#")[0].split() for line in fenced_lines(ROOT / "README.md")]
    assert ["make", "setup"] in lines and ["make", "test"] in lines
    assert [".venv/bin/grpo", "run"] in lines  # the main job: no config, both recipes


def test_the_docs_have_the_gpu_examples():
    assert len(EXAMPLES) >= 6
    assert any("train.vllm_server_gpus=2" in sets and "train.num_processes=6" in sets
               for _, _, sets in EXAMPLES)  # the 8-GPU server example (docs/gpus.md)
    readme = {c for doc, c, _ in EXAMPLES if doc == "README.md"}
    assert {"configs/quickstart.yaml", "configs/models/qwen2.5-math-1.5b.yaml"} <= readme


@pytest.mark.parametrize("doc,config,sets", EXAMPLES,
                         ids=[" ".join([d, c, *s]) for d, c, s in EXAMPLES])
def test_readme_command_passes_config_show(doc, config, sets):
    argv = ["config", "show", str(ROOT / config)]
    for s in sets:
        argv += ["--set", s]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert res.output.startswith("# config hash")


def test_the_8_gpu_examples_fit_8_gpus():
    for _, _, sets in EXAMPLES:
        if "infra/accelerate/multi_gpu.yaml" not in " ".join(sets):
            continue
        cfg = config_from_dict({}, sets)
        server = cfg.train.vllm_server_gpus if cfg.grpo.vllm_mode == "server" else 0
        plan = launch_plan(8, cfg.train.num_processes, None, server_gpus=server)
        assert plan.mode == "launch", plan.message  # every GPU used, none refused


# ------------------------------------------------------------ every documented command


def _doc_id(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


def _resolve(argv: list[str]):
    """The click command an argv after `grpo` names (groups walked), and the words walked."""
    cmd, path = typer.main.get_command(app), []
    for word in argv:
        sub = getattr(cmd, "commands", {}).get(word)
        if sub is None:
            break
        cmd, path = sub, [*path, word]
    return cmd, path


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_grpo_command_and_flag_exists(doc):
    """`grpo WORDS --flag ...`: WORDS name a command (not a group) and each --flag is one of
    its options; `[--optional ...]` flags are checked too."""
    bad = []
    for rest in grpo_lines(doc):
        argv = shlex.split(rest.replace("[", " ").replace("]", " "), comments=True)
        cmd, path = _resolve(argv)
        if not path or hasattr(cmd, "commands"):
            bad.append(f"grpo {rest}: no such command")
            continue
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        bad += [f"grpo {rest}: {' '.join(path)} has no {a.split('=')[0]}" for a in argv
                if a.startswith("--") and a.split("=")[0] not in known]
    assert not bad, "\n".join(bad)


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, flags=re.M))


def _deployments() -> set[str]:
    """`<flow name>/<deployment>` for the deployments of infra/prefect.yaml and
    infra/k8s/prefect.yaml (flow names read from the entrypoints' @flow), and those the docs
    deploy by hand (`prefect deploy ENTRYPOINT --name N`)."""
    source = (ROOT / "flows" / "deployments.py").read_text(encoding="utf-8")
    flows = dict((fn, name) for name, fn in
                 re.findall(r'@flow\(name="([^"]+)".*\n\s*def (\w+)', source))
    pairs = [(d["entrypoint"], d["name"]) for f in ("infra/prefect.yaml", "infra/k8s/prefect.yaml")
             for d in yaml.safe_load((ROOT / f).read_text(encoding="utf-8"))["deployments"]]
    pairs += [m.groups() for doc in DOCS for line in fenced_lines(doc)
              if (m := re.search(r"prefect .*deploy (flows/\S+:\w+) --name (\S+)", line))]
    return {f"{flows[entry.split(':')[1]]}/{name}" for entry, name in pairs}


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_make_target_and_deployment_exists(doc):
    targets, deployments, bad = _make_targets(), _deployments(), []
    for line in fenced_lines(doc):
        if not re.search(r"^\s*make\s|deployment run", line):
            continue  # not a command line (a layout or an output block)
        words = shlex.split(line, comments=True)
        if words[:1] == ["make"] and len(words) > 1 and words[1] not in targets:
            bad.append(f"{line.strip()}: no make target {words[1]}")
        for i, word in enumerate(words[:-2]):
            if (word, words[i + 1]) == ("deployment", "run") and words[i + 2] not in deployments:
                bad.append(f"{line.strip()}: no deployment {words[i + 2]} ({sorted(deployments)})")
    assert not bad, "\n".join(bad)


PATH_PREFIXES = ("configs/", "infra/", "bench/", "flows/", "tasks/", "tests/", "locks/",
                 "grpo_core/", "docs/")


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_path_a_command_names_exists(doc):
    """Repository paths in fenced blocks (also as `key=path` values and `file:entrypoint`);
    patterns and placeholders (`*`, `{`, `<`, `$`) are left out."""
    missing = []
    for line in fenced_lines(doc):
        for token in line.split("#")[0].split():
            path = token.split("=")[-1].strip("()[],;'\"").partition(":")[0]  # entry:point
            if path.startswith(PATH_PREFIXES) and not any(c in path for c in "*{<$"):
                if not (ROOT / path).exists():
                    missing.append(f"{line.strip()}: {path}")
    assert not missing, "\n".join(missing)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_relative_link_resolves(doc):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file) if file else doc
        if not path.exists():
            bad.append(f"{target}: no {file}")
        elif anchor and anchor not in _anchors(path):
            bad.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_anchor_rule():
    assert _anchor("Before the GPU hours: `--smoke`") == "before-the-gpu-hours---smoke"
    assert _anchor("Speed: where a CPU step's time and memory go") == \
        "speed-where-a-cpu-steps-time-and-memory-go"


def test_vllm_server_gets_its_own_memory_share_and_data_parallelism():
    cfg = config_from_dict({}, ["grpo.use_vllm=true", "grpo.vllm_mode=server",
                                "train.vllm_server_gpus=4", "train.vllm_server_data_parallel_size=2",
                                "train.vllm_server_gpu_memory_utilization=0.85"])
    cmd = server_command(cfg, "/m")
    assert cfg.rollout.gpu_memory_utilization != 0.85  # the filter's share is not the server's
    assert cmd[cmd.index("--gpu_memory_utilization") + 1] == "0.85"
    assert cmd[cmd.index("--data_parallel_size") + 1] == "2"
    assert cmd[cmd.index("--tensor_parallel_size") + 1] == "2"
    default = server_command(config_from_dict({}, []), "/m")
    assert default[default.index("--gpu_memory_utilization") + 1] == "0.9"
    with pytest.raises(ConfigError, match="train.vllm_server_data_parallel_size=2 does not divide"):
        config_from_dict({}, ["train.vllm_server_gpus=3", "train.vllm_server_data_parallel_size=2"])


def test_offline_engine_data_parallel_refused_on_a_dense_model():
    with pytest.raises(ValueError, match=r"rollout.data_parallel_size=2: .*qwen2 model is dense"):
        check_offline_data_parallel({"model_type": "qwen2"}, 2)
    check_offline_data_parallel({"model_type": "qwen2"}, 1)
    check_offline_data_parallel({"model_type": "qwen2_moe", "num_experts": 60}, 2)
    check_offline_data_parallel({"model_type": "mixtral", "num_local_experts": 8}, 4)


def test_every_shipped_config_passes_config_show():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        load_config(path)  # raises ConfigError naming the field


def test_project_seed_reaches_every_sampler(tmp_path, monkeypatch):
    """At the arguments' level: TRL's GRPO/SFT (seed, data_seed; TRL seeds its sampler and
    the policy's generate from them), the filter's and eval's engines (VLLMBackend's seed,
    the hf backend's seeded SamplingParams)."""
    from grpo_core.generation import sampling
    from grpo_core.train.trl_args import grpo_kwargs, trl_sft_args

    cfg = config_from_dict({}, ["project.seed=1234", "rollout.backend=vllm"])
    kw = grpo_kwargs(cfg, str(tmp_path))
    assert (kw["seed"], kw["data_seed"]) == (1234, 1234)
    sft = trl_sft_args(cfg, str(tmp_path))
    assert (sft.seed, sft.data_seed) == (1234, 1234)

    seen = {}

    class FakeEngine:  # stands in for vLLM's (not installable beside a CPU torch)
        tokenizer = None

        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(sampling, "VLLMBackend", FakeEngine)
    monkeypatch.setattr("grpo_core.generation.rollout.resolve_backend_name", lambda name, *_: name)
    sampling.build_backend("/m", cfg)
    assert seen["seed"] == 1234
