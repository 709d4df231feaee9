"""How many workers one machine can run while the harness still judges them: the largest
worker count a real run's timing checks hold to, and the warning a run gives, at plan time,
when its scenario asks for more.

Every provider call and every receiver request of a run goes through the fakes, which are
threads of the runner's one process, and every process of the run shares the machine's
CPUs. Past a dozen worker job slots per CPU the fakes fall behind: a request waits seconds in
the runner's accept queue and run queue before its handler stamps it, so the ledger says
the call came when the fake got to it, after the worker had given it up, recorded its
spend and ended its claim. The checks that place a call in a lease (fenced-writes
call-without-lease, lease-exclusive concurrent-calls, cost-accounted spend-unrecorded,
retry-discipline parked-before-cap) then fail an engine that did nothing wrong. The fakes
stamp a request when the kernel received it (chaos.fakes.server.arrived), which ends most
of that, but not all: a worker not run in time to read an answer the fake gave looks like
one that threw it away, and a heartbeat not run like a lease let lapse. The run goes
on (the simulation has no such limit: its time is virtual); the warning says its failures
of those checks may be the machine's. The figures: docs/explanation/harness.md, "Limits".
"""
from __future__ import annotations

import os
from typing import Any

#: Worker job slots (worker processes x slots) per CPU up to which real runs are judged
#: reliably: measured on 2 CPUs (docs/explanation/harness.md, "Limits").
SLOTS_PER_CPU = 12


def job_slots(scenario: Any) -> int:
    """How many jobs a scenario's workers run at once: worker processes x slots, each a
    caller of the fakes. (Senders call only the receiver, once or twice a job.)"""
    return scenario.run.workers * int(scenario.engine.get("slots", 1) or 1)


def reliable_slots(cpus: int | None = None) -> int:
    """The most worker job slots this machine (`cpus`, default its count) is judged
    reliably with."""
    return SLOTS_PER_CPU * max(1, cpus or os.cpu_count() or 1)


def capacity_warnings(scenario: Any, cpus: int | None = None) -> list[str]:
    """The warnings a real run of `scenario` gets on a machine of `cpus` CPUs (default this
    one's): one when it runs more worker job slots than `reliable_slots`, else none."""
    cpus = max(1, cpus or os.cpu_count() or 1)
    asked, limit = job_slots(scenario), reliable_slots(cpus)
    if asked <= limit:
        return []
    slots = int(scenario.engine.get("slots", 1) or 1)
    shape = f"{scenario.run.workers} workers" + (f" x {slots} slots = {asked} job slots"
                                                 if slots > 1 else "")
    return [f"{shape} on {cpus} CPU(s): more than the {limit} ({SLOTS_PER_CPU} per CPU) "
            "this machine's runs are judged reliably with; the fakes and the workers may not "
            "be run in time, and fenced-writes, lease-exclusive, lease-kept, cost-accounted, "
            "retry-discipline and claims-prompt may then fail an engine that did nothing "
            "wrong. Use fewer workers, or `ninelives sim`, whose time is virtual"]
