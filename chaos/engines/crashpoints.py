"""Crash points as a scenario names them, and which of one engine's points each name arms.

A scenario's `faults.crash_points` names points in three ways:

  `*`                  every point the engine declares
  `worker.after_call`  a point by the engine's own name (its adapter's `crashpoints`)
  `role:after_call`    a point by its role: a crash window that engines of this kind share
                       (`ROLES`); the adapter's `point_roles` says which of its points play
                       it. A point's own name never holds a colon (the probe reads
                       NINELIVES_CRASH_AT items as `point:N`), so a role is never taken for
                       an engine's name, nor one for the other.

A trailing `?` makes a name optional (`role:before_mark?`, `worker.group.before_commit?`):
an engine without it runs the scenario and the report lists the name as not applicable,
with the reason. A name without `?` that the engine does not declare is a scenario error
(exit 2): a misspelt point, or another engine's, must never arm nothing and pass green.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

ROLE_PREFIX = "role:"
OPTIONAL = "?"
ALL = "*"

#: The crash windows a scenario may name by role, each with what holds when a process dies
#: there. An adapter maps a role to the points it passes in that window (`point_roles`).
ROLES: dict[str, str] = {
    "submit": "inside the transaction that records a submitted job, before its commit",
    "claim": "inside the transaction that takes a job's lease, before its commit",
    "after_claim": "a worker holds a job's lease; nothing of the step done yet",
    "memo_hit": "a step is about to finish from the memo it already has, with no call",
    "before_call": "about to call the provider for a step: nothing billed yet",
    "after_call": "the provider call returned (billed); nothing of it written yet",
    "before_fail": "a step failed; its failure or retry not yet committed",
    "before_commit": "inside the transaction that completes a step (memo, outbox, state), "
                     "before its commit",
    "after_commit": "the transaction that completed a step committed; nothing after it done",
    "heartbeat": "about to extend the lease of a running step",
    "before_send": "the sender holds (or has read) an effect to send; nothing posted yet",
    "after_send": "the receiver answered an effect; its sent mark not yet written",
    "before_mark": "inside the transaction that writes an effect's sent mark, before its "
                   "commit",
}

#: Characters the probe's environment uses to separate or qualify points (chaos.probe).
RESERVED = (",", "@", ":")


class PointName(NamedTuple):
    """One entry of `faults.crash_points`, read: `role` or `point` (the other None)."""

    text: str
    role: str | None
    point: str | None
    optional: bool


def parse(text: str) -> PointName:
    """The entry `text` read (see the module docstring). Raises ValueError naming it: an
    empty name, an unknown role (listing the known ones), a reserved character, `*?`."""
    shown = _excerpt(text)
    optional = text.endswith(OPTIONAL)
    name = text[:-1] if optional else text
    if name == ALL:
        if optional:
            raise ValueError(f"{shown}: '*' names every point the engine has, so it is never "
                             "optional (drop the '?')")
        return PointName(text, None, ALL, False)
    if name.startswith(ROLE_PREFIX):
        role = name[len(ROLE_PREFIX):]
        if role not in ROLES:
            raise ValueError(f"{shown} names no role (known roles: {', '.join(ROLES)})")
        return PointName(text, role, None, optional)
    if not name.strip() or any(c in name for c in RESERVED) or name != name.strip():
        raise ValueError(f"{shown} is not a crash point name (no spaces at either end, none "
                         f"of {' '.join(RESERVED)}; a role is written {ROLE_PREFIX}NAME)")
    return PointName(text, None, name, optional)


@dataclass(frozen=True)
class Resolution:
    """What a scenario's crash-point names arm on one engine."""

    #: the engine's points to arm, each once, in the order named ("*": all of them)
    armed: tuple[str, ...] = ()
    #: each name that arms something -> the engine's points it arms
    named: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: each optional name the engine lacks -> why it is not applicable
    absent: dict[str, str] = field(default_factory=dict)
    #: each required name the engine lacks -> why (a scenario error)
    missing: dict[str, str] = field(default_factory=dict)


def resolve(names: Iterable[str], engine: Any) -> Resolution:
    """What `names` (a scenario's `faults.crash_points`) arm on `engine`, an adapter. An
    engine without the crash_points capability arms nothing: every name is then absent,
    optional or not (the fault as a whole is not applicable to it). Raises ValueError for
    a name `parse` refuses."""
    capable = "crash_points" in getattr(engine, "capabilities", ())
    label = getattr(engine, "name", "?")
    declared = tuple(getattr(engine, "crashpoints", ())) if capable else ()
    roles = point_roles(engine) if capable else {}
    named: dict[str, tuple[str, ...]] = {}
    absent: dict[str, str] = {}
    missing: dict[str, str] = {}
    for text in names:
        entry = parse(text)
        if not capable:
            absent[text] = f"engine {label} has no crash points"
            continue
        if entry.point == ALL:
            named[text] = (ALL,)
        elif entry.role is not None and roles.get(entry.role):
            named[text] = roles[entry.role]
        elif entry.point is not None and entry.point in declared:
            named[text] = (entry.point,)
        else:
            why = (f"engine {label} maps no point to role {entry.role}: {ROLES[entry.role]}"
                   if entry.role else f"engine {label} declares no point {entry.point!r}")
            (absent if entry.optional else missing)[text] = why
    armed = tuple(dict.fromkeys(p for points in named.values() for p in points))
    return Resolution(armed, named, absent, missing)


def point_roles(engine: Any) -> dict[str, tuple[str, ...]]:
    """The adapter's `point_roles` (role -> its points), or {} when it declares none."""
    return {role: tuple(points) for role, points in getattr(engine, "point_roles", {}).items()}


def role_gaps(engine: Any) -> list[str]:
    """What is wrong with an adapter's `point_roles`, for `chaos.contract.validate`: a role
    outside `ROLES`, a point it does not declare in `crashpoints`."""
    if not hasattr(engine, "point_roles"):
        return []
    raw = getattr(engine, "point_roles")
    if not isinstance(raw, dict):
        return ["its point_roles is not a dict of role -> tuple of points"]
    declared = set(getattr(engine, "crashpoints", ()))
    gaps = [f"maps unknown role {role!r} in point_roles (known: {', '.join(ROLES)})"
            for role in raw if role not in ROLES]
    for role, points in raw.items():
        if isinstance(points, str) or not all(isinstance(p, str) for p in points):
            gaps.append(f"maps role {role!r} to {_excerpt(repr(points))}, not a tuple of "
                        "point names")
            continue
        gaps += [f"maps role {role!r} to {p!r}, which is not in its crashpoints"
                 for p in points if p not in declared]
    return gaps


def describe(engine: Any) -> str:
    """The points and roles `engine` declares, as an error message lists them."""
    points = tuple(getattr(engine, "crashpoints", ()))
    if "crash_points" not in getattr(engine, "capabilities", ()) or not points:
        return "it declares no crash points"
    roles = point_roles(engine)
    mapped = ", ".join(f"{role} -> {' '.join(ps)}" for role, ps in roles.items() if ps)
    return (f"its points: {', '.join(points)}; its roles: {mapped or 'none'} "
            f"(every role: {', '.join(ROLES)})")


def summary(resolution: Resolution) -> tuple[list[str], list[str]]:
    """(the names armed, each with the points it armed where they differ; the names not
    applicable, each with why): the report's two crash-point lines."""
    armed = [f"{text} (every declared point)" if points == (ALL,) else
             text if points == (text,) else
             f"{text} ({', '.join(points)})" for text, points in resolution.named.items()]
    absent = [f"{text} ({why})" for text, why in resolution.absent.items()]
    return armed, absent


def _excerpt(text: str, limit: int = 60) -> str:
    """`text` quoted, cut to `limit` characters: an error quotes a scenario's input short."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
