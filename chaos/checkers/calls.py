"""The provider's calls as the money checks read them: the ledger's calls per (job, step), the
call a memo holds the result of, and the engine's spend record of each call."""
from __future__ import annotations

import math
from collections import defaultdict

from chaos.history import Event
from chaos.checkers.ops import TOL, is_engine


Key = tuple[str, str]  # (job, step)


def provider_calls(history: list[Event]) -> dict[Key, list[Event]]:
    """The provider ledger's calls per (job, step), by start time."""
    calls: dict[Key, list[Event]] = defaultdict(list)
    for e in history:
        if e["src"] == "provider" and e["type"] == "call":
            calls[(e["job"], e["step"])].append(e)
    for group in calls.values():
        group.sort(key=lambda c: c["t_start"])
    return calls


def memoized_call(memo: Event, calls: list[Event]) -> Event | None:
    """The call a worker's memo holds the result of: the memo writer's call for that
    (job, step) that ended last before the memo committed (TOL: ledger vs audit clocks)."""
    found = None
    for call in calls:
        if call["worker"] == memo["worker"] and call["t_end"] <= memo["t"] + TOL:
            if found is None or call["t_end"] > found["t_end"]:
                found = call
    return found


def match_spends(history: list[Event], calls: dict[Key, list[Event]]) -> dict[int, Event]:
    """id(call) -> the engine's spend record of that call.

    A worker's calls for one (job, step) are sequential; call i's record is its first spend
    record committed after the call started and before the worker's next call started.
    """
    spends: dict[tuple, list[Event]] = defaultdict(list)
    for e in history:
        if is_engine(e, "billed"):
            spends[(e["worker"], e["job"], e["step"])].append(e)
    by_worker: dict[tuple, list[Event]] = defaultdict(list)
    for (job, step), group in calls.items():
        for call in group:
            by_worker[(call["worker"], job, step)].append(call)
    matched: dict[int, Event] = {}
    for key, group in by_worker.items():
        pending = list(spends.get(key, ()))
        for i, call in enumerate(group):
            until = group[i + 1]["t_start"] + TOL if i + 1 < len(group) else math.inf
            for j, spend in enumerate(pending):
                if call["t_start"] - TOL <= spend["t"] <= until:
                    matched[id(call)] = pending.pop(j)
                    break
    return matched


def needs_ledger(history: list[Event], calls: dict[Key, list[Event]]) -> str | None:
    """Why a money check cannot judge: costs were recorded but the provider ledger is empty."""
    if calls:
        return None
    for e in history:
        if is_engine(e, "memo", "billed") and (e.get("cost") or 0) > 0:
            return ("no provider ledger events, yet the engine recorded billed costs: "
                    "was the provider's ledger collected?")
    return None
