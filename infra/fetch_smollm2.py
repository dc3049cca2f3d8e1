"""Kept for old instructions: the same as `grpo model fetch smollm2-135m-instruct`.

    python infra/fetch_smollm2.py [--workdir DIR] [--force] [--find-links DIR]

The one implementation is grpo_core.modeling.fetch (through flows/cli_model.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.cli import app  # noqa: E402

if __name__ == "__main__":
    app(["model", "fetch", "smollm2-135m-instruct", *sys.argv[1:]])
