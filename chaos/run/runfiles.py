"""How the harness writes a run folder's records: atomically, and with secrets redacted.

A setting whose name says key, token, secret or password (any case, at any depth of a
table), or that the engine's adapter names in its `secret_settings`, is a secret: it reaches
the engine's processes through their environment and is written nowhere, its value shown as
`REDACTED`. Every record the harness writes about settings goes through `redact`.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable

#: What a secret's value is written as.
REDACTED = "***"
#: A setting whose name contains one of these words (any case) is a secret.
SECRET_WORDS = re.compile(r"key|token|secret|password", re.IGNORECASE)


def secret_names(engine: Any = None) -> frozenset[str]:
    """The setting names `engine`'s adapter declares secret besides SECRET_WORDS."""
    return frozenset(getattr(engine, "secret_settings", ()) or ())


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a setting called `name` holds a secret (see the module docstring)."""
    return bool(SECRET_WORDS.search(name)) or name in set(extra)


def redact(value: Any, extra: Iterable[str] = ()) -> Any:
    """A copy of `value` (settings: dicts, lists, scalars) in which every secret setting's
    value, at any depth, is REDACTED (an empty or absent value stays as it is: there is
    nothing to hide, and it says no secret was given)."""
    extra = frozenset(extra)
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret(str(k), extra) and v not in (None, "")
                    else redact(v, extra)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, extra) for v in value]
    return value


def scenario_record(scenario: Any, engine: Any = None) -> dict[str, Any]:
    """The scenario as the run's records show it: `Scenario.to_json()`, redacted."""
    return redact(scenario.to_json(), secret_names(engine))


def write_json(path: str | os.PathLike, data: Any) -> str:
    """Write `data` as JSON to `path` atomically (a temporary file beside it, synced, then
    renamed over it): a run killed mid-write leaves the old file or the new, never half of
    one. Returns the path."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())  # the rename must not reach the disk before the bytes
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
