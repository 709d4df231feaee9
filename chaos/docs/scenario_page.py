"""The scenario format's reference page, generated from the scenario's dataclasses
(`chaos.spec.scenario`: each field's type, default and the comment beside it), the bounds the
loader enforces (`chaos.spec.limits`, the shares and rates of `chaos.spec.scenario`), the reference
engine's settings (`engine.config`), the `[[aim]]` table (`chaos.spec.aim`) and the profiles."""
from __future__ import annotations

import inspect
import io
import tokenize
from dataclasses import MISSING, fields
from typing import Any

from chaos.spec.limits import MAX_SECONDS


def page() -> str:
    """docs/reference/scenario.md's text."""
    from chaos.spec import aim, limits
    from chaos.spec.scenario import RATES, SHARES, Expect, Faults, Run, load_profiles
    lines = ["# The scenario format", "",
             "Generated from the code (`python -m chaos.docs --write`). A scenario is a TOML "
             "file: `name` (a slug: it names the run's folder), `description`, and the tables "
             "below. An unknown field, a value of the wrong type or past its bound is refused "
             "with exit 2 naming the file and the field; nothing runs.", "",
             "```toml", 'name = "my-scenario"', 'description = "what it tries"', "",
             "[run]", "jobs = 20", "workers = 2", "chaos = 5.0", "", "[faults]", "kill = 0.5",
             "provider_429 = 0.1", "", "[engine]", "lease = 2.0", "```", ""]
    bounds = _bounds(limits, SHARES, RATES)
    for table, cls in (("run", Run), ("faults", Faults), ("expect", Expect)):
        lines += [f"## `[{table}]`", ""]
        lines += _table(table, cls, bounds)
    lines += _capacity()
    lines += ["## `[engine]`", "",
              "The engine's own settings, passed to its adapter (`settings(table)`), which "
              "refuses one it does not have, naming it; `--engine-set NAME=VALUE` gives one "
              "on the command line over the file's. The reference engine's:", "",
              *_engine_settings(), ""]
    lines += ["## `[[aim]]`", "", "Faults aimed at the engine's own points (one table each):",
              "", "```toml", *_aim_example(aim.__doc__ or ""), "```", ""]
    lines += ["## Profiles", "", "`--profile NAME` scales a scenario (`scenarios/profiles.toml`)"
              "; the bounds above hold after scaling.", "",
              "| profile | jobs × | durations × | rates × | what it is for |", "|---|---|---|---|---|"]
    for name, table in load_profiles().items():
        lines.append(f"| `{name}` | {table.get('jobs', 1):g} | {table.get('duration', 1):g} | "
                     f"{table.get('rates', 1):g} | {table.get('description', '')} |")
    return "\n".join(lines).rstrip() + "\n"


def _capacity() -> list[str]:
    """How many workers a real run is judged reliably with (chaos.spec.capacity)."""
    from chaos.spec.capacity import SLOTS_PER_CPU
    return ["## How many workers a machine judges", "",
            f"A real run is judged reliably with up to {SLOTS_PER_CPU} worker job slots "
            "(`workers` × `slots`) per CPU: on 2 CPUs, "
            f"{2 * SLOTS_PER_CPU}. Past that the fakes, threads of the runner's one process, "
            "and the workers themselves are not run in time: a worker reads an answer after "
            "its own deadline, a heartbeat renews late, and the checks that judge timing "
            "(fenced-writes, lease-exclusive, lease-kept, cost-accounted, retry-discipline, "
            "claims-prompt) may fail an engine that did nothing wrong. `ninelives run` warns "
            "at plan time, on stderr and in report.json's `warnings`, and runs anyway; "
            "`ninelives sim` has no such limit (its time is virtual). The measurements: "
            "[how the harness judges](explanation/harness.md#limits-how-many-workers-a-"
            "machine-judges).", ""]


def _bounds(limits: Any, shares: tuple[str, ...], rates: tuple[str, ...]) -> dict[str, str]:
    bounds = {"run.jobs": f"1 to {limits.MAX_JOBS:,}", "run.workers": f"1 to {limits.MAX_WORKERS}",
              "run.senders": f"0 to {limits.MAX_WORKERS}", "run.drain": "> 0",
              "run.needs_review": "0 to 1 (a share)"}
    bounds.update({f"faults.{n}": "0 to 1 (a share)" for n in shares})
    bounds.update({f"faults.{n}": f"0 to {limits.MAX_RATE:g} per second" for n in rates})
    return bounds


def _table(table: str, cls: type, bounds: dict[str, str]) -> list[str]:
    docs, sections = comments(cls)
    lines: list[str] = []
    header = ["| field | type | default | bounds | what it is |", "|---|---|---|---|---|"]
    started = False
    for f in fields(cls):
        if f.name in sections:
            lines += ([""] if started else []) + [f"*{sections[f.name]}*", ""] + header
            started = True
        elif not started:
            lines += header
            started = True
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        key = f"{table}.{f.name}"
        bound = bounds.get(key) or (
            f"0 to {MAX_SECONDS:,g} s" if f.type == "float" and table != "expect" else
            ">= 0" if f.type in ("int", "float") else "")
        lines.append(f"| `{f.name}` | {f.type} | `{default!r}` | {bound} | "
                     f"{docs.get(f.name, '').replace('|', '/')} |")
    return lines + [""]


def comments(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """(each field's comment: the one beside it and the lines under it, or a block of two or
    more comment lines above it; the one-line section comment above a field, by field)."""
    source = inspect.getsource(cls)
    docs: dict[str, list[str]] = {}
    sections: dict[str, str] = {}
    pending: list[str] = []
    last = None
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if last is not None and indent > 4:
                docs[last].append(text)  # a continuation of the comment beside the field
            else:
                pending.append(text)
                last = None
            continue
        name = _field_name(line)
        if name is None:
            last = None
            continue
        docs[name] = [_trailing_comment(line)] if "#" in line else []
        if len(pending) == 1:
            sections[name] = pending[0]
        elif pending:
            docs[name] = pending + docs[name]
        pending, last = [], name
    return {k: " ".join(x for x in v if x) for k, v in docs.items()}, sections


def _field_name(line: str) -> str | None:
    head = line.split("#", 1)[0]
    if ":" not in head or not line.startswith("    ") or line.startswith("     "):
        return None
    name = head.split(":", 1)[0].strip()
    return name if name.isidentifier() else None


def _trailing_comment(line: str) -> str:
    for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
        if token.type == tokenize.COMMENT:
            return token.string.lstrip("#").strip()
    return ""


def _engine_settings() -> list[str]:
    from chaos.reference.docs import settings
    return ["| setting | default | what it is |", "|---|---|---|",
            *(f"| `{name}` | {default} | {text.replace('|', '/')} |"
              for name, default, text in settings())]


def _aim_example(doc: str) -> list[str]:
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "[[aim]]")
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line[4:] if line.startswith("    ") else line)
    return block
