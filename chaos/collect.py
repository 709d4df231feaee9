"""A run's history read back from what it left: the engine's operations from its store, the
fakes' ledgers with each request tied to its process and worker, the crash log and trace,
and the runner's own events, merged in time order; on a finished run and on one killed
halfway alike (every source is appended to as the run goes)."""
from __future__ import annotations

import os

from chaos import history as hist
from chaos.run.backends import SQLITE_FILE
from chaos.contract import Engine
from chaos.fakes import read_ledger
from chaos.engines.writers import attribute_writes


def collect_history(run_dir: str, engine: Engine, recorded: list[hist.Event],
                    db: str | None = None) -> list[hist.Event]:
    """The history of the run in `run_dir`: the engine's operations from its database (`db`,
    by default the SQLite file in `run_dir`), the
    fakes' ledgers, the crash log and trace, and the runner's `recorded` events (lifecycle,
    nemesis, phases), merged in time order. Works on a finished run and on one killed
    halfway (every source is appended to as the run goes)."""
    provider = [{**e, "t": e["t_start"], "src": "provider", "type": "call"}
                for e in read_ledger(os.path.join(run_dir, "provider.jsonl"))]
    receiver = [{**e, "t": e["t_start"], "src": "receiver", "type": "request"}
                for e in read_ledger(os.path.join(run_dir, "receiver.jsonl"))]
    crashes = [{**e, "src": "process", "type": "crashpoint"}
               for e in read_ledger(os.path.join(run_dir, "crashes.jsonl"))]
    trace = [{**e, "src": "process", "type": "point"}
             for e in read_ledger(os.path.join(run_dir, "trace.jsonl"))]
    attribute_callers(provider + receiver, engine, recorded)
    events = hist.merge(engine.operations(db or os.path.join(run_dir, SQLITE_FILE)), provider,
                        receiver, crashes, trace, recorded)
    if trace:
        attribute_writes(events, engine.write_points)
    return events


def attribute_callers(requests: list[hist.Event], engine: Engine,
                      recorded: list[hist.Event]) -> None:
    """Tie each request in the fakes' ledgers to its process and worker, in place.

    A request that names its worker gets that worker's process from the adapter's `pid_of`.
    One that does not (a plain client) keeps the process the fake saw on the other end of
    the socket (`caller_pid`), when that is a process the harness started; the adapter's
    `worker_of` then names the worker id that process writes under, if it can."""
    pid_of, worker_of = getattr(engine, "pid_of", None), getattr(engine, "worker_of", None)
    spawned = {e["pid"]: e for e in recorded
               if e.get("src") == "process" and e.get("type") == "spawn"}
    for e in requests:
        e.pop("server", None)
        caller = e.pop("caller_pid", None)
        if pid_of is not None and e.get("worker"):
            e["pid"] = pid_of(e["worker"])  # the ledgers name the worker, not its process
        if e.get("pid") is None and caller in spawned:
            e["pid"] = caller
            if not e.get("worker") and worker_of is not None:
                e["worker"] = worker_of(spawned[caller])
