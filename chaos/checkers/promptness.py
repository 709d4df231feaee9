"""claims-prompt: due work (jobs, outbox rows) is claimed in the order it fell due, and without
delay while a worker (a sender) is free.

A job is *due* from the moment the engine may hand it to a worker: its `next_run_at` when
its operations report one (a submission, a retry's backoff, a lease that lapses), else the
end of its lease in a working state, else the write that left it ready. It stops being due
at the next write that takes it (a claim, a claim that parks a crash loop) or settles it.

Two claims, each checked only where the engine declares it (chaos.contract.EngineSettings):

- `claim_order = "due"`: a claim takes the job that fell due first among those due at the
  claim's own time (its lease start, `lease_until - lease`). This is exact: claims commit
  one at a time, so the due times of every other job at that commit are the ones the
  operations before it left. A claim that skips an older due job starves it.
- `claim_order = "due-unless-locked"`: the same, among the jobs no other transaction holds
  locked (a claim that skips locked rows, as `FOR UPDATE SKIP LOCKED` does); what a lock
  may excuse, since the history does not say which rows were locked when, is
  chaos.checkers.claim_order's.
- `claim_latency` seconds: a free worker claims due work within this long (its poll
  interval at the longest, plus the claim). A worker process is free from the write that
  released a job while it held all its slots (one slot: its only job) until the claim that
  fills its slots again, and only while it is alive, holds fewer jobs than its slots (job
  slots are counted per process, whether the engine writes every slot under one worker id or
  each under its own), runs on the true clock, and the harness is not pausing it, stalling it
  (the simulation's loaded machine) or holding the write lock; between real processes, nor
  while the store was held up for every writer (`_store_stalls`). A job that
  stays due while some worker is free for longer than claim_latency plus the scheduling
  slack fails.

Outbox rows are judged the same way, with senders as the workers: a row is due from its
`next_run_at` (queued, a retry's backoff, its lease ended) until a sender claims it or it is
sent or dead-lettered, and a claim's own time is `lease_until - outbox_lease`.

The slack is what the machine, not the engine, adds to a poll: on the simulation's virtual
clock the turns that other writers' transactions take (SIM_SLACK); between real processes,
scheduling on a loaded machine as well (RUN_SLACK). Both are stated, not tuned per run.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.index import readings
from chaos.checkers.ops import (RUN_SLACK, capable, is_effect, is_job, is_operator, is_worker,
                  machine_slack)
from chaos.checkers.verdict import Verdict
from chaos.checkers.claim_order import CLAIM_ORDERS, MAX_REPORTED, Locks, check_order

#: Exact comparisons of an engine's own stored times allow for float rounding only.
EPS = 1e-6


@dataclass
class _Unit:
    state: str | None = None
    due: float | None = None      # when the engine may hand it out; None: not claimable
    seen: float | None = None     # when the write that made it due is known committed
    holder: str | None = None


@dataclass
class _Worker:
    pid: int | None
    ids: list = field(default_factory=list)       # the worker ids it wrote under
    active: set = field(default_factory=set)
    free_from: float | None = None
    windows: list = field(default_factory=list)   # [(from, to)] free, in time order


def check_claims_prompt(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Claims take the oldest due job first (claim_order "due"), and a free worker claims
    due work within claim_latency (see the module docstring)."""
    verdict = Verdict("claims-prompt")
    settings = snapshot.get("settings") or {}
    order, latency = settings.get("claim_order"), settings.get("claim_latency")
    if order is None and latency is None:
        return verdict.unknown("the engine declares neither a claim order nor a claim latency "
                               "(settings.claim_order, settings.claim_latency)")
    if not any(is_job(e) or is_effect(e) for e in history):
        return verdict.unknown("the history has no job or outbox operation")
    visible = _visible_times(history)
    units = {"job": _read(history, visible, snapshot["pipeline"], settings)}
    if capable(snapshot, "outbox"):
        units["outbox row"] = _read_rows(history, visible, settings.get("outbox_lease"))
    verdict.metrics = {}
    for unit, reading in units.items():
        stats: dict[str, Any] = {"claims": reading.claims}
        if order in CLAIM_ORDERS:
            locks = Locks.of(history, snapshot, unit) if order == "due-unless-locked" else None
            stats.update(check_order(verdict, reading, unit, locks))
        if latency is not None:
            stats.update(_check_latency(verdict, reading, history, snapshot, float(latency),
                                        unit))
        verdict.checked += stats.get("order_checked", 0) + stats.get("due_spells", 0)
        verdict.metrics["jobs" if unit == "job" else "outbox"] = stats
    return verdict


# -- one pass over the job operations ----------------------------------------------------------

@dataclass
class _Reading:
    t0: float
    lease: float | None           # the units' lease: a claim's own time is its end minus it
    claims: int = 0
    # every claim that chose a unit, with what it passed over: (claim, its due time, the
    # claim's own time, [(due, unit)] of the others due earlier and already due then)
    choices: list = field(default_factory=list)
    # (job, due from, ended at, how it ended)
    spells: list = field(default_factory=list)
    workers: dict = field(default_factory=dict)   # the process (see _holder) -> _Worker
    still_due: dict = field(default_factory=dict)


def _read(history: list[Event], visible: dict[int, float], pipeline: dict,
          settings: dict) -> _Reading:
    ready, working = set(pipeline["ready"]), set(pipeline["working"])
    settled = set(pipeline["terminal"]) | set(pipeline["parked"])
    slots = int(settings.get("slots") or 1)
    reading, jobs = _start(history, settings.get("lease"))
    for pos, e in enumerate(history):
        if not is_job(e):
            continue
        job_id, t = e["job"], e["t"]
        j = jobs[job_id]
        takes = e["type"] == "claimed" and not e.get("continued") or bool(e.get("took_lease"))
        if takes and is_worker(e):
            reading.claims += 1
            if e["type"] == "claimed":
                _choice(reading, e, jobs, job_id)
                _hold(reading, e, job_id, slots)
            # (a claim that parks a crash loop takes the job and lets it go in one write)
            _close(reading, job_id, j, t, "claimed")
        elif e["type"] == "claimed" and is_worker(e):
            # Moving on to the next step under the lease it held: still its job.
            _hold(reading, e, job_id, slots, keep=True)
            _close(reading, job_id, j, t, "claimed")
        elif e["type"] == "removed":
            _close(reading, job_id, j, t, "removed")
            j.due = None
            continue
        elif is_worker(e) and not e.get("heartbeat"):
            if e.get("to") not in working or (e.get("lease_until") or 0.0) <= t:
                _let_go(reading, e, job_id, slots)
        elif e.get("type") == "state" and (is_operator(e) or e.get("actor") == "harness"):
            _close(reading, job_id, j, t, "moved")
        j.state = e.get("to") if e.get("to") is not None else e.get("state")
        j.due = _due_after(e, j.state, ready, working, settled)
        j.seen = visible.get(pos, t)
    reading.still_due = {k: v for k, v in jobs.items() if v.due is not None}
    return reading


def _read_rows(history: list[Event], visible: dict[int, float], lease: float | None
               ) -> _Reading:
    """The outbox's reading: rows are the units, senders the workers (one row at a time)."""
    reading, rows = _start(history, lease)
    for pos, e in enumerate(history):
        if not is_effect(e):
            continue
        key, t = e["row"], e["t"]
        r = rows[key]
        over = e.get("sent_at") is not None or e.get("dead_at") is not None
        if e["type"] == "effect_claimed" and is_worker(e):
            reading.claims += 1
            if not over:  # (a claim that dead-letters a row past its cap lets it go at once)
                _choice(reading, e, rows, key)
                _hold(reading, e, key, 1)
            _close(reading, key, r, t, "claimed")
        elif is_worker(e):
            if over or (e.get("lease_until") or 0.0) <= t:
                _let_go(reading, e, key, 1)
        elif e.get("actor") == "harness":
            _close(reading, key, r, t, "moved")
        r.due = None if over else (e.get("next_run_at") if e.get("next_run_at") is not None
                                   else e.get("lease_until") or t)
        r.seen = visible.get(pos, t)
    reading.still_due = {k: v for k, v in rows.items() if v.due is not None}
    return reading


def _start(history: list[Event], lease: float | None) -> tuple[_Reading, dict[Any, _Unit]]:
    """A reading to fill, and the units by key."""
    return _Reading(t0=history[0]["t"] if history else 0.0, lease=lease), defaultdict(_Unit)


def _due_after(e: Event, state: str | None, ready: set, working: set, settled: set
               ) -> float | None:
    """When the engine may hand the job out after this operation (None: it may not)."""
    if state is None or state in settled or (state not in ready and state not in working):
        return None
    if e.get("next_run_at") is not None:
        return float(e["next_run_at"])
    if state in working:
        return e.get("lease_until")
    return e["t"]


def _close(reading: _Reading, job_id: str, j: _Unit, t: float, how: str) -> None:
    if j.due is not None:
        reading.spells.append((job_id, max(j.due, j.seen or j.due), t, how))


def _visible_times(history: list[Event]) -> dict[int, float]:
    """position of an engine operation -> when it is known committed, where that is later
    than its stamp. A store stamps an operation when its statement runs; a writer the harness
    paused before its commit holds its transaction (and the write lock) open, and its writes
    become visible no earlier than the next operation of another writer, which could not
    commit before it."""
    pauses = readings(history).windows["pauses"]
    out: dict[int, float] = {}
    later: list[tuple[Any, float]] = []   # the next op, and the next one of another writer
    for pos in range(len(history) - 1, -1, -1):
        e = history[pos]
        if e.get("src") != "engine":
            continue
        writer = e.get("worker")
        other = next((t for w, t in later if w != writer), None)
        if other is not None and any(pid == e.get("pid") and e["t"] <= b and a <= other
                                     for pid, a, b in pauses):
            out[pos] = other
        later = [(writer, e["t"])] + [(w, t) for w, t in later if w != writer][:1]
    return out


def _choice(reading: _Reading, e: Event, units: dict, key: Any) -> None:
    """A claim of `key`: the units it passed over, due earlier and already due at the claim's
    own time. Not judged without the lease that tells that time, or without a due time."""
    due, until = units[key].due, e.get("lease_until")
    if reading.lease is None or until is None or due is None:
        return
    now = until - reading.lease  # the claim's own clock: its lease starts when it is written
    older = [(u.due, k) for k, u in units.items() if k != key and u.due is not None
             and u.due <= now + EPS and u.due < due - EPS]
    reading.choices.append((e, due, now, older))


def _holder(e: Event) -> Any:
    """Whose slots a write fills or frees: its process (the pid the operation names), else
    its worker id. Job slots belong to a process, whatever ids its slots write under."""
    return ("pid", e["pid"]) if e.get("pid") is not None else ("worker", e.get("worker") or "")


def _who(w: _Worker, key: Any) -> str:
    """A process as a failure names it: its worker ids (the first few) and its pid."""
    ids = ", ".join(w.ids[:3]) + (f" and {len(w.ids) - 3} more" if len(w.ids) > 3 else "")
    return f"{ids or key[1]} (pid {w.pid})" if w.pid is not None else str(key[1])


def _hold(reading: _Reading, e: Event, key: Any, slots: int, keep: bool = False) -> None:
    """Its writer's process now holds `key`: with every slot taken, a free span of it ends
    here."""
    w = reading.workers.setdefault(_holder(e), _Worker(e.get("pid")))
    if e.get("worker") and e["worker"] not in w.ids:
        w.ids.append(e["worker"])
    if slots == 1 and not keep:
        w.active.clear()  # one slot: whatever it held before is over
    if w.free_from is not None and len(w.active) + 1 >= slots:
        w.windows.append((w.free_from, e["t"]))
        w.free_from = None
    w.active.add(key)


def _let_go(reading: _Reading, e: Event, key: Any, slots: int) -> None:
    """Its writer's process let `key` go: with a slot free, a free span of it begins."""
    w = reading.workers.get(_holder(e))
    if w is not None and key in w.active:
        w.active.discard(key)
        if len(w.active) < slots and w.free_from is None:
            w.free_from = e["t"]


# -- claim latency ------------------------------------------------------------------------------

def _check_latency(verdict: Verdict, reading: _Reading, history: list[Event],
                   snapshot: dict, latency: float, unit: str) -> dict[str, Any]:
    phases = snapshot.get("phases") or {}
    end = phases.get("drain_end") or (history[-1]["t"] if history else 0.0)
    slack = machine_slack(snapshot.get("clock"))
    bound = latency + slack
    shared = readings(history)
    excluded = _excluded(history, snapshot)
    free = _free_windows(reading, history, end, excluded)
    spells = reading.spells + [(k, max(j.due, j.seen or j.due), end, "open")
                               for k, j in reading.still_due.items()]
    # no one may claim a job (an outbox row) while the harness holds its row locked
    spells = _unlocked(spells, [(row, a, b) for table, row, a, b in
                                shared.windows.get("row_locks", ())
                                if table == ("job" if unit == "job" else "outbox")])
    longest, judged = 0.0, 0
    for job_id, due, ended, how in spells:
        if ended - due <= bound:
            continue
        judged += 1
        worst = None
        for worker, windows in free.items():
            pid = reading.workers[worker].pid
            for a, b in _overlaps(windows, due, ended):
                # Free, less what the machine left it unrun (its stalls, proportionately).
                if b - a - shared.stalled(pid, a, b) > bound and (
                        worst is None or b - a > worst[2] - worst[1]):
                    worst = (worker, a, b)
        if worst is None:
            continue
        longest = max(longest, worst[2] - worst[1])
        worker, a, b = worst
        worker = _who(reading.workers[worker], worker)
        t0 = reading.t0
        if len(verdict.failures) < MAX_REPORTED:
            verdict.fail("due-job-waited" if unit == "job" else "due-row-waited",
                         f"{unit} {job_id} was due from +{due - t0:.3f} s until it was {how} at "
                         f"+{ended - t0:.3f} s, while {worker} had a free slot from +{a - t0:.3f} s to "
                         f"+{b - t0:.3f} s ({b - a:.3f} s, over claim_latency {latency:g} s + "
                         f"slack {slack:g} s)")
        else:
            verdict.error_count += 1
    return {"due_spells": len(spells), "due_spells_judged": judged, "bound": bound,
            "longest_wait_beside_a_free_worker": round(longest, 3)}


def _unlocked(spells: list, row_locks) -> list:
    """The parts of each due spell (unit, from, to, how) outside the times the harness held
    that unit's row locked ([(unit, from, to)]); a part that ends where a lock began ends
    "row-locked"."""
    locked: dict[Any, list] = defaultdict(list)
    for key, a, b in row_locks:
        locked[key].append((a, b))
    return [(key, a, b, how if b == ended else "row-locked by the harness")
            for key, due, ended, how in spells
            for a, b in _subtract([(due, ended)], sorted(locked.get(key, [])))]


def _excluded(history: list[Event], snapshot: dict) -> dict[int | None, list]:
    """Per pid, the spans the harness stopped it (pauses); key None: every pid (the write
    lock held). A process's stalls are not cut out whole: `_check_latency` takes off the
    time they left it unrun."""
    shared = readings(history)
    out: dict[int | None, list] = defaultdict(list)
    for pid, a, b in shared.windows["pauses"]:
        out[pid].append((a, b))
    out[None] += shared.windows["locks"] + shared.paused_holds
    if snapshot.get("clock") != "virtual":
        out[None] += _store_stalls(history, snapshot["settings"])
    return out


def _store_stalls(history: list[Event], settings: dict) -> list[tuple[float, float]]:
    """Between real processes, the spans in which the store was held up for every writer (an
    fsync on a loaded disk under the write lock, a lock holder the machine did not run): a
    client had a write to make (its provider call or receiver request had ended, answered or
    past its timeout) and made it more than the machine's slack later, and nothing at all
    committed meanwhile, by anyone. No worker could have claimed then. (A quiet store alone
    is no stall: a slow poll is what the check is for.) The simulation has none."""
    commits = sorted(e["t"] for e in history if e.get("src") == "engine")
    # each client's writes for the job that end an operation (a client with job slots writes
    # for other jobs meanwhile: only its write for this one is the one it had to make)
    by_client = readings(history).jobs.writes
    timeouts = {"provider": settings.get("call_timeout"), "receiver": settings.get("send_timeout")}
    stalls = []
    for e in history:
        if e.get("src") not in timeouts or not e.get("worker") or e.get("t_end") is None:
            continue
        timeout = timeouts[e["src"]]
        ended = e["t_end"] if timeout is None else min(e["t_end"], e["t_start"] + timeout)
        writes = by_client.get((e.get("job"), e["worker"]), [])
        i = bisect.bisect_right(writes, ended)
        if i == len(writes) or writes[i] - ended <= RUN_SLACK:
            continue
        j = bisect.bisect_right(commits, ended)
        if j < len(commits) and commits[j] < writes[i]:
            continue  # others committed meanwhile: the store was not held up
        stalls.append((ended, writes[i]))
    return stalls


def _free_windows(reading: _Reading, history: list[Event], end: float,
                  excluded: dict) -> dict[str, list]:
    """worker process (see _holder) -> its free spans, cut where it ended and where the
    harness stopped it; workers on a skewed clock are left out (they see other due times)."""
    exits = {e.get("pid"): e["t"] for e in history
             if e.get("src") == "process" and e.get("type") == "exit"}
    skewed = {e.get("pid") for e in history if e.get("src") == "nemesis"
              and e.get("type") == "skew"} | _skewed_by_slot(history)
    free = {}
    for worker, w in reading.workers.items():
        if w.pid is None or w.pid in skewed:
            continue
        spans = list(w.windows)
        if w.free_from is not None:
            spans.append((w.free_from, end))
        stop = min(exits.get(w.pid, end), end)
        spans = [(a, min(b, stop)) for a, b in spans if a < stop]
        cuts = sorted(excluded.get(w.pid, []) + excluded.get(None, []))
        free[worker] = _subtract(spans, cuts)
    return free


def _skewed_by_slot(history: list[Event]) -> set:
    slots = {e.get("slot") for e in history if e.get("src") == "nemesis"
             and e.get("type") == "skew" and e.get("slot") is not None}
    return {e.get("pid") for e in history if e.get("src") == "process"
            and e.get("type") == "spawn" and e.get("slot") in slots and e.get("role") == "worker"}


def _subtract(spans: list, cuts: list) -> list:
    out = []
    for a, b in spans:
        for c, d in cuts:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return sorted(out)


def _overlaps(windows: list, start: float, end: float) -> list:
    i = max(bisect.bisect_left(windows, (start,)) - 1, 0)
    out = []
    for a, b in windows[i:]:
        if a >= end:
            break
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            out.append((lo, hi))
    return out


CHECKS = {"claims-prompt": check_claims_prompt}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "claims-prompt": reads(
        submitted="actor job next_run_at pid to worker",
        claimed="actor continued job lease_until next_run_at pid to worker",
        state="actor from heartbeat job lease_until next_run_at pid to took_lease worker",
        memo="job op pid worker",
        effect_queued="actor dead_at job lease_until next_run_at pid row sent_at worker",
        effect_claimed="actor dead_at lease_until next_run_at pid row sent_at worker",
        effect_sent="actor pid row sent_at worker",
        effect_state="actor dead_at lease_until next_run_at pid row sent_at worker",
        billed="job pid worker"),
}
