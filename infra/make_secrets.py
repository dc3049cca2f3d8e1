#!/usr/bin/env python3
"""Write infra/.env: random values for every password, key and auth string that
infra/compose.yaml requires (`make secrets`). Standard library only.

- A new file is created with mode 600 (owner read/write only); .gitignore keeps it out of git.
- An existing file is never overwritten: its values are kept as they are, and only the
  variables it lacks are appended (names printed, never values). A stack that is already
  running keeps working: its databases hold the passwords they were created with.
- Rotating a credential is a deliberate edit of that one line plus the steps in the
  "Rotating credentials" of docs/security.md, not a re-run of this script.
"""
from __future__ import annotations

import argparse
import os
import re
import secrets
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path

ENV_FILE = Path(__file__).resolve().parent / ".env"


def _token() -> str:
    # URL-safe ([A-Za-z0-9_-]): the PostgreSQL passwords go inside connection URLs as they are,
    # and nothing in a .env line needs quoting.
    return secrets.token_urlsafe(24)


# name -> a fresh value. Usernames are not secrets but live here so that one file says who is who.
VARIABLES = {
    "POSTGRES_PREFECT_PASSWORD": _token,
    "POSTGRES_MLFLOW_PASSWORD": _token,
    "MINIO_ROOT_USER": lambda: "minio",
    "MINIO_ROOT_PASSWORD": _token,
    "MLFLOW_ADMIN_USERNAME": lambda: "admin",
    "MLFLOW_ADMIN_PASSWORD": _token,
    "MLFLOW_FLASK_SECRET_KEY": lambda: secrets.token_hex(32),
    "MLFLOW_PIPELINE_USERNAME": lambda: "grpo-pipeline",
    "MLFLOW_PIPELINE_PASSWORD": _token,
    # Prefect compares the whole string; "user:password" is the form its UI login expects.
    "PREFECT_AUTH_STRING": lambda: f"grpo:{_token()}",
}

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def existing_names(text: str) -> set[str]:
    return {m.group(1) for line in text.splitlines() if (m := _LINE.match(line))}


def write_secrets(path: Path = ENV_FILE) -> list[str]:
    """Create `path` or append the variables it lacks; returns the names written."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")  # noqa: UP017 - any python3
    if not path.exists():
        lines = [f"# Credentials of infra/compose.yaml, written by `make secrets` on {stamp}.",
                 "# Keep private: mode 600, never committed (.gitignore). Rotation: docs/security.md."]
        lines += [f"{name}={make()}" for name, make in VARIABLES.items()]
        # O_EXCL: if something created the file meanwhile, fail rather than overwrite it.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return list(VARIABLES)
    text = path.read_text()
    missing = [name for name in VARIABLES if name not in existing_names(text)]
    if missing:
        add = [f"# Added by `make secrets` on {stamp}."] + [f"{n}={VARIABLES[n]()}" for n in missing]
        with path.open("a") as f:
            f.write(("" if text.endswith("\n") or not text else "\n") + "\n".join(add) + "\n")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)
        print(f"make_secrets: {path} was readable by others (mode {mode:o}): now 600")
    return missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env-file", type=Path, default=ENV_FILE, help=f"default: {ENV_FILE}")
    args = ap.parse_args(argv)
    existed = args.env_file.exists()
    written = write_secrets(args.env_file)
    if not existed:
        print(f"make_secrets: wrote {args.env_file} (mode 600): {', '.join(written)}")
    elif written:
        print(f"make_secrets: {args.env_file} exists; kept its values, added: {', '.join(written)}")
    else:
        print(f"make_secrets: {args.env_file} exists and is complete; nothing written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
