"""Secret redaction: values of secret-named keys and credentials inside URLs never reach
a run's params, tags, artifacts, messages or logs."""
from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
_SECRET_WORDS = ("token", "password", "passwd", "secret", "key", "credential", "credentials",
                 "apikey", "auth")
# Counts, not credentials: max_tokens, min_tokens, max_new_tokens, keywords ...
_NOT_SECRET = {"tokens", "keywords", "keyword"}
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s@]+@")


def is_secret_name(name: str) -> bool:
    """True when a field or env var name says it holds a secret.

    Word-wise, not a raw substring test: the config's own max_tokens, min_tokens and
    reasoning_keywords are not secrets, while HF_TOKEN, hub_token, MLFLOW_TRACKING_PASSWORD,
    AWS_SECRET_ACCESS_KEY, api_key, apiKey and hftoken are.
    """
    words = re.split(r"[^0-9A-Za-z]+|(?<=[a-z0-9])(?=[A-Z])", str(name))
    for w in (w.lower() for w in words if w):
        if w in _NOT_SECRET:
            continue
        if any(w == s or w == s + "s" or w.endswith(s) for s in _SECRET_WORDS):
            return True
    return False


def _scrub_value(value: Any) -> Any:
    if isinstance(value, str):
        return _URL_USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", value)
    return value


def redact(tree: Any) -> Any:
    """A copy with the value of every secret-named key replaced by "***" (None stays None),
    recursively through dicts and lists, and passwords in URLs (scheme://user:pw@) hidden."""
    if isinstance(tree, Mapping):
        return {k: (REDACTED if v is not None else None) if is_secret_name(str(k)) else redact(v)
                for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [redact(v) for v in tree]
    return _scrub_value(tree)


def strip_userinfo(uri: str) -> str:
    """The URI without user:password@, for messages and for our own health probe."""
    p = urllib.parse.urlparse(uri)
    if p.username is None and p.password is None:
        return uri
    host = p.hostname or ""
    if p.port:
        host = f"{host}:{p.port}"
    return urllib.parse.urlunparse(p._replace(netloc=host))
