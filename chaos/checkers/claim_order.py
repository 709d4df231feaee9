"""claims-prompt's claim order (chaos.checkers.promptness): a claim takes the unit (job,
outbox row) that fell due first among those due at its own time; with "due-unless-locked",
first among those no other transaction holds locked, as a claim that skips locked rows
(PostgreSQL's `FOR UPDATE SKIP LOCKED`) does. The history does not say which rows were
locked when, so a unit passed over is excused where a lock could have held it (`Locks`):
another writer wrote it within TRANSACTION seconds of the claim, or the harness held its
row locked; and, since a transaction left open names no row (a claimer killed before its
COMMIT is rolled back by the server), as many more as the processes paused, held or
stalled at the claim, or seen dead around it, could hold, one per job slot each. A claim
that passed over more than all that could have held broke the order."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from chaos.history import Event
from chaos.checkers.index import readings
from chaos.checkers.ops import is_effect, machine_slack
from chaos.checkers.verdict import Verdict

#: Failures reported in full; the rest are counted.
MAX_REPORTED = 20

#: The claim orders an engine may declare (chaos.contract.EngineSettings.claim_order).
CLAIM_ORDERS = ("due", "due-unless-locked")


@dataclass
class Locks:
    """When a unit's row could have been locked by a transaction other than a claim's, read
    from what the history does say (see the module docstring)."""
    slack: float                  # the machine's: how late a death may be seen
    writes: dict                  # unit -> [(t, writer)] of every engine write of it
    stopped: list                 # (pid, from, to): an engine process could not go on
    died: list                    # (pid, t) each process's exit was seen
    row_locks: dict               # unit -> [(from, to)] the harness held its row locked
    per_process: int              # the transactions one process may hold open at once

    @classmethod
    def of(cls, history: list[Event], snapshot: dict, unit: str) -> "Locks":
        shared = readings(history)
        # every write that names the unit: a memo or a spend of a job locks its row too
        # (the foreign key's share lock), which a claim that skips locked rows passes over
        field = "job" if unit == "job" else "row"
        writes: dict[Any, list] = defaultdict(list)
        for e in history:
            if e.get("src") == "engine" and e.get(field) is not None and (
                    unit == "job" or is_effect(e)):
                writes[e[field]].append((e["t"], e.get("worker") or e.get("actor")))
        stopped = list(shared.windows["pauses"]) + list(shared.stalls)
        died = [(e.get("pid"), e["t"]) for e in history
                if e.get("src") == "process" and e.get("type") == "exit"]
        table = "job" if unit == "job" else "outbox"
        row_locks: dict[Any, list] = defaultdict(list)
        for name, row, a, b in shared.windows.get("row_locks", ()):
            if name == table:
                row_locks[row].append((a, b))
        slots = int((snapshot.get("settings") or {}).get("slots") or 1)
        return cls(machine_slack(snapshot.get("clock")), writes, stopped, died, row_locks,
                   slots if unit == "job" else 1)

    def why(self, key: Any, claimer: Any, now: float, t: float) -> str | None:
        """Why `key` may have been locked while a claim by `claimer` that began at `now` and
        was written at `t` read the due rows, by what names it; None: nothing named it."""
        if any(writer != claimer and now - TRANSACTION <= at <= t + TRANSACTION
               for at, writer in self.writes.get(key, ())):
            return WROTE_IT
        if any(a <= t and b >= now for a, b in self.row_locks.get(key, ())):
            return ROW_LOCKED
        return None

    def held_open(self, now: float, t: float) -> int:
        """How many rows transactions left open may have held while a claim that began at
        `now` and was written at `t` read the due rows: one a transaction, `per_process`
        transactions for each process paused or stalled by the machine from TRANSACTION
        before the claim to its write, or seen dead from then to the machine's slack after
        it. Such a transaction names no row in the history (a claimer killed before its
        COMMIT is rolled back by the server), so which rows it held is not known, only how
        many it could."""
        lo = now - TRANSACTION
        stopped = {pid for pid, a, b in self.stopped if a <= t and b >= lo}
        dead = {pid for pid, at in self.died if lo <= at <= t + self.slack}
        return self.per_process * len(stopped | dead)


#: How long a transaction lasts at most, from the write that locks a row to its COMMIT,
#: where nothing stopped its process (a pause, a stall the machine's run queue shows): a
#: write of a row stamped longer before a claim than this held no lock the claim met.
TRANSACTION = 0.25

#: Why a unit passed over may have been locked (the metrics count each).
WROTE_IT = "another writer wrote it then"
ROW_LOCKED = "the harness held its row locked"
HELD_OPEN = "a process that could not go on may have held it"


def check_order(verdict: Verdict, reading: Any, unit: str,
                 locks: Locks | None) -> dict[str, Any]:
    """Fail each claim of `reading` (claims-prompt's reading of one kind of unit: its
    `choices` and `t0`) that passed over an older due unit; with `locks`, over more of them
    than locks could have held then (see Locks). The claims judged, and those whose
    passing over was excused."""
    excused, reasons = 0, Counter()
    for claim, due, now, older in reading.choices:
        passed, room = len(older), 0
        if locks is not None and older:
            why = {k: locks.why(k, claim.get("worker"), now, claim["t"]) for _, k in older}
            rest = sorted((d, k) for d, k in older if why[k] is None)
            room = min(len(rest), locks.held_open(now, claim["t"])) if rest else 0
            reasons.update(reason for reason in why.values() if reason)
            reasons[HELD_OPEN] += room
            excused += len(rest) - room < len(older)
            older = rest[room:]  # a claimer that took the oldest first held the oldest
        if not older:
            continue
        d, k = min(older)
        if len(verdict.failures) < MAX_REPORTED:
            held = (f"; nothing names it locked, and processes that could not go on may have "
                    f"held {room} row(s) then" if locks is not None else "")
            verdict.fail("claimed-out-of-order",
                         f"{claim.get('worker')} claimed {_name(unit, claim)} (due "
                         f"+{due - reading.t0:.3f} s) at +{now - reading.t0:.3f} s while "
                         f"{unit} {k}, due since +{d - reading.t0:.3f} s, waited "
                         f"({passed} due earlier in all{held})", claim)
        else:
            verdict.error_count += 1
    stats = {"order_checked": len(reading.choices)}
    if locks is not None:
        stats["order_excused_for_a_lock"] = excused
        stats["order_excuses"] = {r: n for r, n in reasons.items() if n}  # reason -> units
    return stats


def _name(unit: str, e: Event) -> str:
    if unit == "job":
        return f"job {e['job']}"
    return f"outbox row {e['row']} ({e['job']} {e['kind']!r})"
