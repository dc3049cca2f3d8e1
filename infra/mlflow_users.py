#!/usr/bin/env python3
"""Create a user of an MLflow server running with basic auth, or set its password if it
exists (rotation), through MLflow's auth REST API. Standard library only.

    export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
    export MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=...   # an admin: infra/.env
    python infra/mlflow_users.py alice                  # asks for alice's password
    NEW_USER_PASSWORD=... python infra/mlflow_users.py grpo-pipeline --password-env NEW_USER_PASSWORD

The new user's password comes from a prompt or from the environment variable named by
--password-env, never from the command line (which `ps` and shell histories show), and is
never printed. What a user may do is infra/mlflow/basic_auth.ini's default_permission
(READ: a viewer) plus MANAGE on what the user creates; the compose stack runs this once
for the pipeline's own identity (service `mlflow-users`).
"""
from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


def _call(base: str, auth: str, method: str, path: str, body: dict | None = None,
          query: dict | None = None) -> tuple[int, dict]:
    url = base.rstrip("/") + "/api/2.0/mlflow/users/" + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    req = urllib.request.Request(url, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")[:300]
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"message": text}


def ensure_user(base: str, admin: tuple[str, str], username: str, password: str) -> str:
    """'created' or 'password updated'; raises SystemExit with the server's reason."""
    auth = f"{admin[0]}:{admin[1]}"
    status, body = _call(base, auth, "GET", "get", query={"username": username})
    if status == 200:
        status, body = _call(base, auth, "PATCH", "update-password",
                             {"username": username, "password": password})
        outcome = "password updated"
    elif status == 404 or body.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
        status, body = _call(base, auth, "POST", "create",
                             {"username": username, "password": password})
        outcome = "created"
    if status != 200:
        hint = {401: "wrong admin credentials (MLFLOW_TRACKING_USERNAME / _PASSWORD)",
                403: "MLFLOW_TRACKING_USERNAME is not an admin"}.get(status, "")
        raise SystemExit(f"mlflow_users: {username}: HTTP {status} "
                         f"{body.get('message', '')} {hint}".rstrip())
    return outcome


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("username")
    ap.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                    help="the MLflow server (default: $MLFLOW_TRACKING_URI)")
    ap.add_argument("--password-env", metavar="VAR",
                    help="read the user's password from this environment variable")
    args = ap.parse_args(argv)
    if not args.tracking_uri or not args.tracking_uri.startswith(("http://", "https://")):
        ap.error("an http(s) --tracking-uri or MLFLOW_TRACKING_URI is needed")
    admin = (os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD"))
    if not all(admin):
        ap.error("set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to an admin's credentials")
    if args.password_env:
        password = os.environ.get(args.password_env, "")
        if not password:
            ap.error(f"{args.password_env} is unset or empty")
    else:
        password = getpass.getpass(f"password for {args.username}: ")
        if password != getpass.getpass("again: "):
            ap.error("the passwords differ")
    outcome = ensure_user(args.tracking_uri, admin, args.username, password)
    print(f"mlflow_users: {args.username}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
