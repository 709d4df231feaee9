"""Each (job, step)'s memo lifetimes, and when each memo is known committed (a store stamps
a statement, not its commit): the reading no-rebill-after-commit, memo-consistent and
cost-accounted share (chaos.checkers.billing)."""
from __future__ import annotations

from collections import defaultdict

from chaos.history import Event
from chaos.checkers.ops import TOL, harness_windows, is_engine, is_job, is_worker, takes_lease

Key = tuple[str, str]


#: Statements of one transaction follow each other this closely (seconds) at most, as a
#: memo's writer's next writes of the job under the same token are read (see Memos.visible)
TXN_GAP = 0.05
#: A commit known to follow another write is placed this much after that write's stamp.
AFTER = 1e-6


class Memos:
    """Each (job, step)'s memo lifetimes: [insert, delete or None] in commit order.

    `conflicts` holds (live insert, second insert) pairs: an insert while a memo was live.
    `visible[id(insert)]`: when the insert is known committed, where that is later than its
    stamp. A store stamps a write when its statement runs, and its transaction commits after
    its last statement: the memo's writer's next writes of the job under the same token
    that follow it closely (within TXN_GAP each) are read as the rest of its transaction;
    and where the harness paused the writer's process while that transaction ran, it
    committed after the resume at the earliest. Until then no other worker could see the
    memo (on PostgreSQL the others go on writing meanwhile; a process with several job slots
    makes that common). And a transaction fenced out by another worker's claim that began
    within TXN_GAP of its last statement (its writer never wrote the job again under its
    token) committed after that claim: its write of the job came after the claim had locked
    the row, and waited for it (`_fenced`).
    """

    def __init__(self, history: list[Event]) -> None:
        self.periods: dict[Key, list[list]] = defaultdict(list)
        self.conflicts: list[tuple[Event, Event]] = []
        self.visible: dict[int, float] = {}
        self._last: dict[int, float] = {}   # id(memo insert) -> its transaction's last stamp
        self.count = 0
        self._visibility(history)
        for e in history:
            if not is_engine(e, "memo"):
                continue
            self.count += 1
            periods = self.periods[(e["job"], e["step"])]
            live = periods[-1] if periods and periods[-1][1] is None else None
            if e["op"] == "insert":
                if live is not None:
                    self.conflicts.append((live[0], e))
                    continue
                periods.append([e, None])
            elif e["op"] == "delete":
                if live is not None:
                    live[1] = e

    def live_at(self, key: Key, t: float) -> Event | None:
        """The memo insert live at audit time t (committed before t, not deleted by then)."""
        for insert, delete in self.periods.get(key, ()):
            if self.committed(insert) < t and (delete is None or delete["t"] >= t):
                return insert
        return None

    def committed(self, insert: Event) -> float:
        """When the memo insert is known committed (see `visible`)."""
        return self.visible.get(id(insert), insert["t"])

    def _visibility(self, history: list[Event]) -> None:
        pauses = harness_windows(history)["pauses"]
        open_: dict[tuple, tuple[Event, float]] = {}   # (worker, job, token) -> (memo, last)
        for e in history:
            if e.get("src") != "engine" or not is_worker(e):
                continue
            key = (e.get("worker"), e.get("job"), e.get("token"))
            if key in open_ and e["t"] - open_[key][1] <= TXN_GAP:
                open_[key] = (open_[key][0], e["t"])
            elif key in open_:
                self._close(*open_.pop(key), pauses)
            if is_engine(e, "memo") and e.get("op") == "insert":
                open_[key] = (e, e["t"])
        for memo, last in open_.values():
            self._close(memo, last, pauses)
        self._fenced(history)

    def _close(self, memo: Event, last: float, pauses: list) -> None:
        resumed = [b for pid, a, b in pauses
                   if pid == memo.get("pid") and memo["t"] - TOL <= a <= last + TOL]
        seen = max([last] + resumed)
        self._last[id(memo)] = last
        if seen > memo["t"]:
            self.visible[id(memo)] = seen

    def _fenced(self, history: list[Event]) -> None:
        """A memo whose writer never wrote its job again under the token, while another
        worker claimed the job within TXN_GAP of the memo transaction's last statement: that
        claim locked the job's row before the transaction's own write of it, which found
        the token changed (fenced out) once the claim committed; so the memo committed
        after the claim, which could not see it. (Where one write lock orders every
        transaction, as on SQLite, such a claim is stamped before the memo already.)"""
        writes: dict[str, list[Event]] = defaultdict(list)
        for e in history:
            if is_job(e):
                writes[e["job"]].append(e)
        for e in history:
            if not (is_engine(e, "memo") and e.get("op") == "insert" and is_worker(e)):
                continue
            later = [w for w in writes.get(e["job"], ()) if w["t"] >= e["t"]]
            if any(w.get("worker") == e.get("worker") and w.get("token") == e.get("token")
                   for w in later):
                continue  # its writer wrote the job again under the token: not fenced out
            last = self._last.get(id(e), e["t"])
            claim = next((w for w in later if w.get("worker") != e.get("worker")
                          and takes_lease(w)), None)
            if claim is not None and claim["t"] - last <= TXN_GAP:
                after = claim["t"] + AFTER  # committed after the claim, not with it
                self.visible[id(e)] = max(self.visible.get(id(e), e["t"]), after)

    def worker_inserts(self) -> list[tuple[Event, Event | None]]:
        """(memo insert by a worker, its delete or None), in commit order."""
        return sorted(((i, d) for periods in self.periods.values() for i, d in periods
                       if is_worker(i)), key=lambda p: p[0]["t"])
