"""Workers on a skewed clock, and what their leases did: the reading lease-exclusive and
lease-kept share (chaos.checkers.leases judges it).

Whose clock places a lease is the engine's fact for its store (the snapshot's
settings.lease_clock, from the adapter): "worker", each worker's own `now` (SQLite: a worker
whose clock runs ahead takes leases still live and keeps its own past their end, which is
expected of such an engine and not judged); or "store", the database's own clock
(PostgreSQL: a skewed worker can neither steal nor keep a lease, and is judged as any).

Lease times are compared with the operations' `t`, the true clock of the machine (the
audit's, never a worker's): a lease as the job's last write left it is live at a claim when
it ends after the claim's commit.
"""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.checkers.ops import TOL, is_job, is_worker, takes_lease


def store_clock(settings: dict[str, Any]) -> bool:
    """Whether the store's own clock places leases (a skewed worker is judged as any)."""
    return settings.get("lease_clock") == "store"


def unjudged(tl, settings: dict[str, Any], worker: str | None) -> bool:
    """Whether `worker`'s leases are left unjudged: it runs on a skewed clock and that clock
    places its leases."""
    return not store_clock(settings) and tl.is_skewed(worker)


def live_lease_takes(history: list[Event]) -> list[tuple[Event, Event]]:
    """Every worker's claim of a job (a claim, or one that parks it) made while the job's
    lease, as its last write left it, was still live by the true clock: [(claim, that
    write)]. Jobs whose operations carry no `lease_until` are not read."""
    last: dict[str, Event] = {}
    takes = []
    for e in history:
        if not is_job(e):
            continue
        before = last.get(e["job"])
        until = before.get("lease_until") if before is not None else None
        if takes_lease(e) and is_worker(e) and until and until > e["t"] + TOL:
            takes.append((e, before))
        last[e["job"]] = e
    return takes


def leases_past_a_lease(history: list[Event], lease: float | None, tl) -> list[Event]:
    """The leases skewed workers wrote (claims and renewals) to end more than one lease after
    their write by the true clock: a lease kept past its end."""
    if lease is None:
        return []
    return [e for e in history if is_job(e) and is_worker(e) and tl.is_skewed(e.get("worker"))
            and (e["type"] == "claimed" or e.get("heartbeat"))
            and (e.get("lease_until") or 0.0) > e["t"] + lease + TOL]


def skew_effects(history: list[Event], settings: dict[str, Any], tl) -> dict[str, Any] | None:
    """What the skewed workers did with leases, for the report; None without any.
    {"lease_clock", "workers", "seconds", "claims", "live_leases_taken", "leases_kept_past_end",
    "judged", "note"}."""
    workers = sorted({w for w in tl.pids if tl.is_skewed(w)})
    if not workers:
        return None
    skewed = set(workers)
    claims = [e for e in history if is_job(e) and is_worker(e) and takes_lease(e)
              and e.get("worker") in skewed]
    taken = [c for c, _ in live_lease_takes(history) if c.get("worker") in skewed]
    kept = leases_past_a_lease(history, settings.get("lease"), tl)
    judged = store_clock(settings)
    seconds = sorted({tl.skew_of(w) for w in workers})
    # processes, not ids: a process with job slots writes under an id per slot
    processes = {tl.pids[w] for w in workers}
    ids = f" ({len(workers)} worker ids)" if len(workers) != len(processes) else ""
    did = (f"{len(processes)} worker process(es){ids} on a clock "
           f"{', '.join(f'{s:+g}' for s in seconds)} s "
           f"off made {len(claims)} claims: {len(taken)} of a lease still live by the true "
           f"clock, and {len(kept)} leases of theirs ran past one lease")
    note = (f"{did}; judged, as the store's clock places leases" if judged else
            f"{did}; expected, not judged: each worker's own clock places leases here")
    return {"lease_clock": settings.get("lease_clock") or "worker", "workers": workers,
            "seconds": seconds, "claims": len(claims), "live_leases_taken": len(taken),
            "leases_kept_past_end": len(kept), "judged": judged, "note": note}
