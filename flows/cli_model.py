"""`grpo model build`: rebuild the built-in tiny model from its recipe and compare it with
the weights the package ships (grpo_core/builtin_models/tiny-arith)."""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The built-in models.", no_args_is_help=True, add_completion=False)


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
