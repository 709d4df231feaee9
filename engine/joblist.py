"""`ninelives engine jobs`: the jobs in some states by id, so that an operator can act on
them (requeue, resolve, cancel) without opening the database.

An id is the caller's text, any text: it is shown as one shell word that the shell reads back
into exactly that id (quoted where it must be, control characters escaped), so that the id
printed, pasted after `--`, is the id the action gets.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

from .config import ConfigError
from .states import Pipeline, PipelineError, get_pipeline

#: The state groups `--state` takes beside state names, and what each holds.
GROUPS = {
    "parked": "every parked state (failed steps and jobs waiting for review): what requeue, "
              "resolve and cancel act on",
    "ready": "every step's ready state (waiting for a worker): what cancel acts on",
    "working": "every step's working state (held by a worker now)",
    "unfinished": "every state that is not terminal",
}
#: What a shell word may hold unquoted (shlex's own set): anything else is quoted.
PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def shell_word(text: str) -> str:
    """`text` as one word a POSIX shell reads back as `text`: as it is when plain, in single
    quotes when printable, else in bash's $'...' with every unprintable character escaped
    (a newline or an escape sequence in an id must not break the table or the terminal)."""
    if PLAIN.fullmatch(text):
        return text
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_escaped(c) for c in text) + "'"


def _escaped(c: str) -> str:
    if c in ESCAPES:
        return ESCAPES[c]
    if c.isprintable():
        return c
    code = ord(c)  # always the full width of digits, so a next character is never read in
    return f"\\x{code:02x}" if code < 0x80 else (
        f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")


def states_named(pipeline: Pipeline, text: str) -> frozenset[str]:
    """The states `--state TEXT` names: a group (GROUPS), a state of `pipeline`, or several
    of them separated by commas. Raises ConfigError naming --state and what it takes."""
    groups = {"parked": pipeline.parked_states, "ready": pipeline.ready_states,
              "working": pipeline.working_states,
              "unfinished": pipeline.states - pipeline.terminal}
    states: set[str] = set()
    for name in (part.strip() for part in text.split(",")):
        if name in groups:
            states |= groups[name]
        elif name in pipeline.states:
            states.add(name)
        else:
            raise ConfigError(
                f"--state: {name[:40]!r} is no state of pipeline {pipeline.name!r} (it takes "
                f"{', '.join(GROUPS)}, or a state: {', '.join(sorted(pipeline.states))})")
    return frozenset(states)


def step_of(pipeline_name: str, state: str, pipelines: dict[str, Pipeline | None]) -> str:
    """The step a job in `state` stands at ("-" for a terminal state or an unknown
    pipeline); `pipelines` caches the pipelines looked up."""
    if pipeline_name not in pipelines:
        try:
            pipelines[pipeline_name] = get_pipeline(pipeline_name)
        except PipelineError:
            pipelines[pipeline_name] = None
    pipeline = pipelines[pipeline_name]
    for step in pipeline.steps if pipeline else ():
        if state in (step.ready, step.working, step.parked, step.alternate):
            return step.name
    return "-"


def listing(store: Any, pipeline: Pipeline, states: frozenset[str], now: float,
            limit: int) -> dict:
    """The `jobs` command's answer for the jobs in `states` (see `states_named`):
    {"states", "jobs": [{"id", "state", "step", "attempts", "age_s", "error"}], "total",
    "more"}, the oldest write first, `more` past `limit`."""
    rows, total = store.jobs(states, now, limit)
    pipelines: dict[str, Pipeline | None] = {pipeline.name: pipeline}
    jobs = [{"id": r["id"], "state": r["state"],
             "step": step_of(r["pipeline"], r["state"], pipelines), "attempts": r["attempts"],
             "age_s": r["age_s"], "error": r["error"]} for r in rows]
    return {"states": sorted(states), "jobs": jobs, "total": total, "more": total - len(jobs)}


def footer(answer: dict, limit: int) -> list[str]:
    """The lines under the table: how many more there are, and how to act on one."""
    lines = []
    if answer["more"]:
        lines.append(f"{answer['more']} more not shown: {answer['total']} in all, the "
                     f"{limit} oldest above (raise --limit to see more)")
    if answer["jobs"]:
        lines.append("act on one: ninelives engine requeue|resolve|cancel -- ID "
                     "(ID as shown, quotes and all)")
    return lines
