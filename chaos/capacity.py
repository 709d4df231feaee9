"""How many engine processes one machine can run while the harness still judges them: the
largest worker count a real run's timing checks hold to, and the warning a run gives, at
plan time, when its scenario asks for more.

Every provider call and every receiver request of a run goes through the fakes, which are
threads of the runner's one process, and every process of the run shares the machine's
CPUs. Past a few engine processes per CPU the fakes fall behind: a request waits seconds in
the runner's accept queue and run queue before its handler stamps it, so the ledger says
the call came when the fake got to it, after the worker had given it up, recorded its
spend and ended its claim. The checks that place a call in a lease (fenced-writes
call-without-lease, lease-exclusive concurrent-calls, cost-accounted spend-unrecorded,
retry-discipline parked-before-cap) then fail an engine that did nothing wrong. The fakes
stamp a request when the kernel received it (chaos.fakes.server.arrived), which ends most
of that, but not all: a fake slow to answer still looks like a slow provider. The run goes
on (the simulation has no such limit: its time is virtual); the warning says its failures
of those checks may be the machine's. The figures: README, "Limits".
"""
from __future__ import annotations

import os
from typing import Any

#: Engine processes (worker processes x job slots, plus senders) per CPU up to which real
#: runs are judged reliably (measured, see the module docstring).
CALLERS_PER_CPU = 5


def callers(scenario: Any) -> int:
    """How many callers of the fakes a scenario runs at once: each worker slot, each sender."""
    slots = int(scenario.engine.get("slots", 1) or 1)
    return scenario.run.workers * slots + scenario.run.senders


def reliable_callers(cpus: int | None = None) -> int:
    """The most callers this machine (`cpus`, default its count) is judged reliably with."""
    return CALLERS_PER_CPU * max(1, cpus or os.cpu_count() or 1)


def capacity_warnings(scenario: Any, cpus: int | None = None) -> list[str]:
    """The warnings a real run of `scenario` gets on a machine of `cpus` CPUs (default this
    one's): one when it runs more callers than `reliable_callers`, else none."""
    cpus = max(1, cpus or os.cpu_count() or 1)
    asked, limit = callers(scenario), reliable_callers(cpus)
    if asked <= limit:
        return []
    slots = int(scenario.engine.get("slots", 1) or 1)
    shape = (f"{scenario.run.workers} workers" + (f" x {slots} slots" if slots > 1 else "")
             + f" + {scenario.run.senders} senders")
    return [f"{shape} = {asked} engine callers on {cpus} CPU(s): more than the "
            f"{limit} ({CALLERS_PER_CPU} per CPU) this machine's runs are judged reliably "
            "with; the fakes may fall behind the calls, and fenced-writes, lease-exclusive, "
            "cost-accounted and retry-discipline may then fail an engine that did nothing "
            "wrong. Use fewer workers, or `ninelives sim`, whose time is virtual"]
