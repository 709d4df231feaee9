"""The simulation's nemesis: applies the fault plan's timeline at virtual times.

The same timeline as a real run (`chaos.run.nemesis`), with the same target picks and the same
history events; a kill unwinds the target's threads at once, a pause keeps its threads off
the schedule for the pause's virtual length, a contention holds the write lock for virtual
seconds. It runs as an actor of its own, so where its writes land among the workers' is a
scheduling choice like any other. What it writes to the engine's store goes through the
simulation's controls (`chaos.sim.controls.SimControls`), never its tables.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.engines.adapter_guard import described
from chaos.run.nemesis import different_payload
from chaos.sim.controls import SimControls


class SimNemesis:
    """Applies `timeline` (the plan's events this schedule kept) for `sim`."""

    def __init__(self, sim: SimControls, timeline: list[dict]) -> None:
        self.sim, self.timeline = sim, timeline
        self.applied: Counter[str] = Counter()
        self.healed = False
        self.paused: dict[int, int] = {}  # pid -> virtual time its pause ends
        self.outage_started: float | None = None

    # -- the actor ---------------------------------------------------------------------------

    def run(self) -> None:
        sim = self.sim
        sched = sim.sched
        for event in self.timeline:
            due = sim.chaos_start_us + sched.us(event["at"])
            if due > sched.now_us:
                sched.sleep((due - sched.now_us) / 1_000_000)
            if self.healed:
                return
            try:
                getattr(self, f"_{event['fault']}")(event)
            except Exception as exc:  # a fault that cannot apply is logged, not fatal
                self._log("error", fault=event["fault"], error=described(exc))

    def heal(self) -> None:
        """Stop applying faults and undo those still in force (from the scheduler's thread)."""
        self.healed = True
        for pid in sorted(self.paused):
            self._resume(pid)
        if self.sim.policy.outage.is_set():
            self.sim.policy.outage.clear()
            self._log("outage_end", target="provider", started=self.outage_started)
        self.sim.policy.heal()

    def _log(self, type_: str, **details: Any) -> None:
        self.sim.record({"t": self.sim.sched.now(), "src": "nemesis", "type": type_, **details})

    def _target(self, event: dict, roles: tuple[str, ...]):
        live = sorted((p for p in self.sim.live() if p.role in roles and p.pid not in self.paused),
                      key=lambda p: p.name)
        return live[event["pick"] % len(live)] if live else None

    # -- the faults -----------------------------------------------------------------------------

    def _kill(self, event: dict) -> None:
        roles = ("worker", "sender") if self.sim.scenario.faults.kill_senders else ("worker",)
        process = self._target(event, roles)
        if process is None:
            return
        self._log("kill", target=process.name, pid=process.pid, role=process.role)
        self.sim.kill(process, point=None)
        self.applied["kill"] += 1

    def _pause(self, event: dict) -> None:
        roles = ("worker", "sender") if self.sim.scenario.faults.pause_senders else ("worker",)
        process = self._target(event, roles)
        if process is None:
            return
        sched, seconds = self.sim.sched, self.sim.scenario.faults.pause_seconds
        until = sched.now_us + sched.us(seconds)
        process.paused_until = until
        self.paused[process.pid] = until
        self._log("pause", target=process.name, pid=process.pid, seconds=seconds)
        sched.at(until, lambda: self._resume(process.pid, until))
        self.applied["pause"] += 1

    def _resume(self, pid: int, until: int | None = None) -> None:
        if pid not in self.paused or (until is not None and self.paused[pid] != until):
            return
        del self.paused[pid]
        process = self.sim.processes.get(pid)
        if process is not None:
            process.paused_until = min(process.paused_until, self.sim.sched.now_us)
            self._log("resume", target=process.name, pid=pid)

    def _lease_expiry(self, event: dict) -> None:
        expired = self.sim.expire_leases()
        self._log("expire", leases=expired)
        if expired:
            self.applied["lease_expiry"] += 1

    def _outage(self, event: dict) -> None:
        sim = self.sim
        sim.policy.outage.set()
        self.outage_started = event["at"]
        self._log("outage", target="provider", until=event["until"])
        end = sim.chaos_start_us + sim.sched.us(event["until"])

        def over() -> None:
            if sim.policy.outage.is_set() and not self.healed:
                sim.policy.outage.clear()
                self._log("outage_end", target="provider", started=event["at"])

        sim.sched.at(end, over)
        self.applied["outage"] += 1

    def _contention(self, event: dict) -> None:
        sim = self.sim
        seconds = event.get("seconds", sim.scenario.faults.contention_seconds)
        process = sim.internal_process("contention")
        sim.sched.spawn(process.name, lambda: self._hold_lock(seconds), process)

    def _hold_lock(self, seconds: float) -> None:
        """A process holding the write lock for `seconds` (its own actor)."""
        def held() -> None:
            self._log("contention", seconds=seconds)
            self.applied["contention"] += 1

        self.sim.hold_write_lock(seconds, held, lambda: self._log("contention_end"))

    def _duplicate_submit(self, event: dict) -> None:
        sim = self.sim
        job = event["job"]
        payload = sim.documents[job]
        if event["kind"] == "different":
            payload = different_payload(payload, job)
        result = sim.submit(job, payload)
        self._log("duplicate_submit", job=job, kind=event["kind"], result=result)
        self.applied[f"duplicate_{event['kind']}"] += 1
        sim.record_submit(job, payload, result, duplicate=True)

    def _operator(self, event: dict) -> None:
        sim = self.sim
        jobs = sim.job_ids
        job = jobs[event["pick"] % len(jobs)]
        started = sim.sched.now()
        result = sim.operate(event["action"], job)
        self._log("operator", action=event["action"], job=job, result=result, t_start=started)
        if result == "done":
            self.applied[f"operator_{event['action']}"] += 1
        self.applied["operator"] += 1
