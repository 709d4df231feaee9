"""What the simulation's nemesis and aimed faults may use of a running simulation: its
scheduler, its plan, its processes and its controls over the engine's store. The driver
(`chaos.sim.driver.Simulation`) provides them; the nemesis and the aims depend on this
description alone, not on the driver that starts them."""
from __future__ import annotations

from typing import Any, Callable, Protocol

from chaos.history import Event
from chaos.run.nemesis import FaultPolicy
from chaos.spec.plan import FaultPlan
from chaos.spec.scenario import Scenario
from chaos.sim.scheduler import Actor, Process, Scheduler


class SimControls(Protocol):
    """A running simulation, as its nemesis and its aims see it."""

    engine: Any
    scenario: Scenario
    plan: FaultPlan
    policy: FaultPolicy
    sched: Scheduler
    processes: dict[int, Process]

    def operations(self) -> list[Event]: ...
    def expire_leases(self) -> int: ...
    def hold_write_lock(self, seconds: float, held: Callable[[], None],
                        released: Callable[[], None]) -> None: ...
    def submit(self, job: str, payload: Any) -> str: ...
    def operate(self, action: str, job: str) -> str: ...
    def record(self, event: Event) -> None: ...
    def record_submit(self, job: str, payload: Any, result: str, duplicate: bool) -> None: ...
    def internal_process(self, name: str) -> Process: ...
    def point_job(self, actor: Actor) -> str | None: ...
    def live(self) -> list[Process]: ...
    def kill(self, process: Process, point: str | None, actor: Actor | None = None) -> None: ...
