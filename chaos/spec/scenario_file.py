"""A scenario file as TOML: read within chaos.spec.limits (a regular file, of bounded size, UTF-8),
its tables typed field by field against the scenario's dataclasses, and its `[engine]` table
kept as plain values for the engine to read; every error names the file and the field."""
from __future__ import annotations

import math
import tomllib
from dataclasses import fields
from typing import Any

from chaos.spec.limits import read_text, shown
from chaos.run.runfiles import is_secret


class ScenarioError(ValueError):
    """A scenario or profile that cannot run; the message names file, field and reason."""


def read_toml(path: str) -> dict:
    """The TOML table of the file at `path`, read within chaos.spec.limits (a regular file, of
    bounded size, UTF-8). Raises ScenarioError naming the file and what is wrong with it."""
    try:
        text = read_text(path)
    except OSError as exc:
        raise ScenarioError(f"{shown(path)}: cannot be read: "
                            f"{exc.strerror or exc}") from None
    except ValueError as exc:  # not a regular file, too large, not UTF-8: it says which
        raise ScenarioError(str(exc)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{shown(path)}: not valid TOML: {exc}") from None


def read_table(where: str, name: str, cls: type, raw: Any):
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: [{name}] must be a table")
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise ScenarioError(f"{where}: unknown field '{name}.{key}' "
                                f"(known: {', '.join(sorted(known))})")
        values[key] = typed(where, f"{name}.{key}", known[key].type, value)
    return cls(**values)


#: What a field of each type must be, as an error message says it.
KINDS = {"bool": "a boolean (true or false)", "int": "an integer", "str": "a string",
         "tuple[str, ...]": "a list of strings",
         "tuple[tuple[float, float], ...]": "a list of [start, end] pairs of finite numbers"}


def typed(where: str, field_name: str, kind: str, value: Any) -> Any:
    """`value` as a field of type `kind` holds it; raises ScenarioError naming the field
    (TOML values have types: "2" is not a number, nor "yes" a boolean)."""
    bad = ScenarioError(f"{where}: field '{field_name}' must be {KINDS.get(kind, kind)}, "
                        f"got {value!r}")
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if kind == "float":  # nan or inf would hang the planner (a rate of inf, a phase of nan)
        if not finite(value):
            raise ScenarioError(f"{where}: field '{field_name}' must be a finite number, "
                                f"got {value!r}")
        return float(value)
    if kind == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad
        return tuple(value)
    if kind == "tuple[tuple[float, float], ...]":
        ok = isinstance(value, list) and all(
            isinstance(w, list) and len(w) == 2 and all(finite(x) for x in w) for w in value)
        if not ok:
            raise bad
        return tuple((float(a), float(b)) for a, b in value)
    if not isinstance(value, str):
        raise bad
    return value


def finite(value: Any) -> bool:
    """Whether `value` is a finite number (a bool is not a number here)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def engine_table(where: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: [engine] must be a table")
    for key, value in raw.items():  # what each setting means is the engine's to say
        shown = "a value not shown (a secret)" if is_secret(str(key)) else repr(value)
        if not isinstance(value, (str, int, float, bool)):
            raise ScenarioError(f"{where}: field 'engine.{key}' must be a string, number or "
                                f"boolean, got {shown}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ScenarioError(f"{where}: field 'engine.{key}' must be a finite number, "
                                f"got {shown}")
    return dict(raw)
