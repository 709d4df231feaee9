"""The one reading of engine operations every checker shares: what kind of write an
operation is and who made it, in the vocabulary of `chaos.history`, never in an engine's
own column names or writer spellings.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from chaos.history import EFFECT_OPS, JOB_OPS, Event

#: Operations come from different clocks of one machine (the engine's store, the fakes, the
#: supervisor) and a store's clock may have millisecond resolution: an order between two
#: sources closer than this (seconds) is not trusted. Engine operations among themselves
#: need none: their order is commit order.
TOL = 0.005
#: What the machine, not the engine, adds between an engine's clock read and its commit (or
#: its poll and its claim): on the simulation's virtual clock, turns of 10 ms and the wait
#: behind other writers' transactions; between real processes, scheduling on a loaded
#: machine as well. Stated, not tuned per run.
SIM_SLACK = 0.15
RUN_SLACK = 1.0


def machine_slack(clock: str | None) -> float:
    """The machine's slack for a history on this clock (the snapshot's "clock")."""
    return SIM_SLACK if clock == "virtual" else RUN_SLACK


def is_job(e: Event) -> bool:
    """An engine operation that wrote a job (submitted, claimed, state, removed)."""
    return e.get("src") == "engine" and e.get("type") in JOB_OPS


def is_effect(e: Event) -> bool:
    """An engine operation that wrote an outbox row."""
    return e.get("src") == "engine" and e.get("type") in EFFECT_OPS


def is_engine(e: Event, *types: str) -> bool:
    return e.get("src") == "engine" and (not types or e.get("type") in types)


def is_operator(e: Event | None) -> bool:
    return e is not None and e.get("actor") == "operator"


def is_worker(e: Event | None) -> bool:
    """Written by a worker or sender process (not an operator, the harness or a submit)."""
    return e is not None and e.get("actor") in ("worker", "sender")


def takes_lease(e: Event) -> bool:
    """A job write after which only its writer may write: a worker's claim (or a claim that
    parked the job), or any operator write."""
    if e.get("type") == "claimed":
        return not e.get("continued")  # moving on under a lease held is not a new one
    if e.get("took_lease"):
        return True
    return e.get("type") == "state" and is_operator(e)


def is_heartbeat(e: Event) -> bool:
    return e.get("type") == "state" and bool(e.get("heartbeat"))


def ends_an_operation(e: Event) -> bool:
    """Engine operations that close a worker's operation on a job: a state change, a claim,
    a write that lets the lease go (a failure or a retry recorded in the same state), a
    memo, a billed call, an effect queued; not a heartbeat or another write that keeps the
    lease running, nor a memo's delete (an operator's resolve, though it names the memo's
    writer)."""
    t = e.get("type")
    if t in ("submitted", "removed", "claimed"):
        return True
    if t == "state":
        if e["from"] != e["to"] or e.get("took_lease"):
            return True
        until = e.get("lease_until")
        return not e.get("heartbeat") and (until is None or until <= e["t"] + TOL)
    if t == "memo":
        return e.get("op") != "delete"
    return t in ("billed", "effect_queued")


def pids_by_worker(history: list[Event]) -> dict[str, int]:
    """worker id -> process id, from every operation that names both (engine operations,
    and ledger entries the runner tied to a process through the adapter's `pid_of`)."""
    pids = {}
    for e in history:
        if e.get("worker") and e.get("pid") is not None and e.get("src") != "process":
            pids[e["worker"]] = e["pid"]
    return pids


def worker_processes(history: list[Event]) -> dict[str, set[int]]:
    """worker id -> every process that wrote or called under it: one for an engine whose
    ids name a process, a slot's successive processes for one whose ids name a slot."""
    pids: dict[str, set[int]] = defaultdict(set)
    for e in history:
        if e.get("worker") and e.get("pid") is not None and e.get("src") != "process":
            pids[e["worker"]].add(e["pid"])
    return pids


def capable(snapshot: dict, capability: str) -> bool:
    """Whether the run's engine declared `capability` (see chaos.contract.CAPABILITIES). A
    snapshot that names no engine is judged as if every capability were declared."""
    engine = snapshot.get("engine")
    if not engine or "capabilities" not in engine:
        return True
    return capability in engine["capabilities"]


#: The nemesis's events that open a window in which engine writes wait (a held write lock,
#: the server down), and the events that close each (faults of different kinds overlap).
LOCK_WINDOWS = ("contention", "server_crash", "statement_timeout")
LOCK_ENDS = {"contention_end": "contention", "server_restart": "server_crash",
             "statement_timeout_end": "statement_timeout"}


def harness_windows(history: list[Event]) -> dict[str, Any]:
    """When the harness took leases on purpose: [t, t] of each forced expiry, (pid, from, to)
    of each pause, [from, to] of each held write lock, (table, row, from, to) of each row
    held locked (table "job": row is the job's id; "outbox": an outbox row's); pids run
    without heartbeat."""
    pauses, expiries, opened, rows, row_locks = [], [], {}, {}, []
    off_slots = {e.get("slot") for e in history
                 if e.get("src") == "nemesis" and e.get("type") == "heartbeat_off"}
    off = {e["pid"] for e in history if e.get("src") == "process" and e.get("type") == "spawn"
           and e.get("role") == "worker" and e.get("slot") in off_slots}
    for e in history:
        if e.get("src") != "nemesis":
            continue
        kind = e.get("type")
        if kind == "expire":
            expiries.append(e["t"])
        elif kind in ("pause", "hold"):  # an aimed hold stops its process as a pause does
            opened[e.get("pid")] = e["t"]
        elif kind in ("resume", "release") and e.get("pid") in opened:
            pauses.append((e["pid"], opened.pop(e["pid"]), e["t"]))
        elif kind == "row_lock":
            rows.setdefault((e.get("table"), e.get("row")), []).append(e["t"])
        elif kind == "row_lock_end" and rows.get((e.get("table"), e.get("row"))):
            row_locks.append((e["table"], e["row"], rows[(e["table"], e["row"])].pop(0),
                              e["t"]))
    pauses += [(pid, t, float("inf")) for pid, t in opened.items()]
    row_locks += [(*key, t, float("inf")) for key, ts in rows.items() for t in ts]
    return {"pauses": pauses, "locks": lock_windows(history), "expiries": expiries,
            "row_locks": row_locks, "no-heartbeat": off}


def lock_windows(history: list[Event]) -> list[tuple[float, float]]:
    """[from, to] of each span in which some nemesis window of LOCK_WINDOWS was open, from
    the first opened to the last closed: windows of different kinds overlap, and a hold
    that waited for another's lock may log its start before the other logs its end."""
    locks, open_, since = [], {kind: 0 for kind in LOCK_WINDOWS}, None
    for e in history:
        kind = e.get("type") if e.get("src") == "nemesis" else None
        if kind in LOCK_WINDOWS:
            since = e["t"] if not any(open_.values()) else since
            open_[kind] += 1
        elif kind in LOCK_ENDS and open_[LOCK_ENDS[kind]]:
            open_[LOCK_ENDS[kind]] -= 1
            if not any(open_.values()):
                locks.append((since, e["t"]))
    return locks + ([(since, float("inf"))] if any(open_.values()) else [])


def paused_holds(history: list[Event], windows: dict[str, Any]) -> list[tuple[float, float]]:
    """The pauses during which no other process committed anything: the paused process may
    have held the write lock in a transaction it had open, which stops every other writer
    as a held lock does. [(from, to)]."""
    writes = sorted(((e["t"], e.get("pid")) for e in history if e.get("src") == "engine"),
                    key=lambda w: w[0])
    times = [t for t, _ in writes]
    held = []
    for pid, a, b in windows["pauses"]:
        during = writes[bisect.bisect_right(times, a):bisect.bisect_left(times, b)]
        if not any(p != pid for _, p in during):
            held.append((a, b))
    return held


def disturbed(windows: dict[str, Any], pid: int | None, start: float, end: float,
              job: str | None = None) -> bool:
    """Whether the harness took a lease, paused process `pid`, held the write lock, or held
    `job`'s row locked at some moment of [start, end] (see harness_windows)."""
    return (any(p == pid and a <= end and b >= start for p, a, b in windows["pauses"])
            or held_back(windows, start, end, job))


def held_back(windows: dict[str, Any], start: float, end: float, job: str | None = None
              ) -> bool:
    """Whether the harness took a lease, held the write lock, or held `job`'s row locked at
    some moment of [start, end]: what may hold any writer's write back, whoever it is."""
    return (any(start - TOL <= t <= end + TOL for t in windows["expiries"])
            or any(a <= end and b >= start for a, b in windows["locks"])
            or any((table, row) == ("job", job) and a <= end and b >= start
                   for table, row, a, b in windows.get("row_locks", ())))
