"""The nemesis: applies the fault plan's timeline, and undoes what it did when told to heal.

It knows how to apply a fault, never when (the plan says) nor whether the engine survived
(the checkers say). Every fault it applies, and every healing, is logged as a history event.
"""
from __future__ import annotations

import hashlib
import heapq
import os
import signal
import threading
import time
from collections import Counter
from functools import cached_property
from typing import Any, Callable

from chaos.engines.adapter_guard import described
from chaos.contract import Engine, submitter
from chaos.history import Event, payload_hash
from chaos.spec.plan import (FaultPlan, document_fault, documents_for, forced_provider_fault,
                   forced_receiver_fault, latency_fault, provider_fault, provider_form,
                   receiver_document_fault, receiver_fault)
from chaos.powerloss.fault import cut as power_cut
from chaos.spec.scenario import Scenario
from chaos.run.supervisor import Supervisor


#: Faults that write to the engine database, and so may wait for its write lock; and the
#: server's own (a restart takes its down time): each runs aside.
WAITS_ON_DATABASE = frozenset({"lease_expiry", "operator", "duplicate_submit",
                               "server_restart", "connection_kill", "statement_timeout",
                               "row_lock"})
#: Faults made through the database server (a session of the harness's own, or the server's
#: view of the engine's): while a restart has it down they wait for it to be up again, or
#: every one that fell into a down time would fail, and a run could end with none applied.
NEEDS_SERVER = frozenset({"connection_kill", "statement_timeout", "row_lock"})
#: Seconds a statement timeout fault waits, past the timeout itself, for its target to run a
#: write the held lock keeps waiting: a worker writes at least every poll or heartbeat.
STATEMENT_WAIT = 3.0
#: Seconds a connection kill waits for its target to be in a transaction before it ends the
#: connections as they are: the cut that matters is the one through a write, and an engine
#: between model calls holds a transaction for a few milliseconds at a time.
MID_TRANSACTION_WAIT = 2.0


class FaultPolicy:
    """What the fakes ask before answering: a pure function of the plan, plus the outage
    switch the nemesis flips. After `heal()` only the payloads' own nature (poison) and the
    plan's few forced calls remain: those prove each configured fault fired at least once,
    however short the chaos phase was."""

    def __init__(self, scenario: Scenario, plan: FaultPlan, send_timeout: float) -> None:
        self.scenario, self.plan = scenario, plan
        self.send_timeout = send_timeout
        self.outage = threading.Event()
        self.healed = threading.Event()

    def heal(self) -> None:
        self.outage.clear()
        self.healed.set()

    def provider_fault(self, job: str, step: str, n: int) -> dict | None:
        own = document_fault(self.plan, job, step)
        if own is not None:  # the document's nature: it never heals
            return provider_form(self.plan, job, step, n, own)
        fault = provider_fault(self.scenario, self.plan, job, step, n)
        if self.healed.is_set():
            return (forced_provider_fault(self.scenario, self.plan, job, step, n)
                    or latency_fault(self.scenario, self.plan, job, step, n))
        if self.outage.is_set():
            return provider_form(self.plan, job, step, n,
                                 {"kind": "status", "status": 503, "retry_after": None})
        return fault

    def receiver_fault(self, job: str, kind: str, n: int) -> dict | None:
        own = receiver_document_fault(self.plan, job, kind)
        if own is not None:  # the document's nature: it never heals
            return own
        fault = (forced_receiver_fault if self.healed.is_set() else receiver_fault)(
            self.scenario, self.plan, job, kind, n)
        if fault is not None and fault["kind"] in ("timeout", "lost"):
            fault = {**fault, "seconds": self.send_timeout + 0.3}
        return fault


def different_payload(payload: Any, job: str) -> Any:
    """A payload that differs from `payload` the way a client's second try can: a field
    added, or a value edited; which one is fixed by the job, so that an engine comparing
    payloads by anything but equality is seen either way the comparison falls."""
    if isinstance(payload, dict) and isinstance(payload.get("title"), str) and \
            int(hashlib.blake2b(job.encode(), digest_size=1).digest()[0]) % 2:
        return {**payload, "title": payload["title"] + "-2"}
    return {**payload, "revision": 2} if isinstance(payload, dict) else [payload, 2]


class Nemesis:
    """Runs the plan's timeline against live processes, the database and the fakes."""

    def __init__(self, scenario: Scenario, plan: FaultPlan, engine: Engine, db: str,
                 supervisor: Supervisor, policy: FaultPolicy,
                 record: Callable[[Event], None], server: Any = None) -> None:
        self.scenario, self.plan, self.engine, self.db = scenario, plan, engine, db
        self.server = server  # the database server the run started (its own faults), or None
        self.store = None  # the lost-fsync mount under the store (power_loss), or None
        self._server_lock = threading.Lock()  # one crash-and-restart at a time
        self._up = threading.Lock()  # held while the server is down (see `server_up`)
        self.supervisor, self.policy, self.record = supervisor, policy, record
        self.applied: Counter[str] = Counter()
        self._stop = threading.Event()
        self._heals: list[tuple[float, int, str, dict]] = []  # (due, n, what, details)
        self._n = 0
        self._paused: dict[int, str] = {}
        self._threads: list[threading.Thread] = []
        self._count_lock = threading.Lock()
        self._docs = dict(documents_for(plan))
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self, chaos_start: float) -> None:
        self.chaos_start = chaos_start
        self._thread.start()

    def heal(self) -> None:
        """Stop applying faults and undo every one still in force."""
        self._stop.set()
        self._thread.join()
        for _, _, what, details in sorted(self._heals):
            self._undo(what, details)
        self._heals.clear()
        for thread in self._threads:
            thread.join()
        self.policy.heal()

    def server_up(self) -> threading.Lock:
        """Held, the database server stays up (a crash waits): the runner's own reads of the
        database (progress, integrity after a kill) wait out a server down instead of
        failing."""
        return self._up

    def _log(self, type_: str, **details: Any) -> None:
        self.record({"t": time.time(), "src": "nemesis", "type": type_, **details})

    def _run(self) -> None:
        for event in self.plan.timeline:
            due = self.chaos_start + event["at"]
            while not self._stop.is_set():
                self._run_heals(time.time())
                wait = min(due - time.time(), 0.02)
                if wait <= 0:
                    break
                self._stop.wait(wait)
            if self._stop.is_set():
                return
            if event["fault"] in WAITS_ON_DATABASE:
                # These may wait for the write lock (a worker stopped mid-transaction holds
                # it): run them aside, so pauses still end on time.
                self._aside(self._apply, event)
            else:
                self._apply(event)
        while not self._stop.wait(0.02):
            self._run_heals(time.time())

    def _count(self, fault: str) -> None:
        with self._count_lock:  # faults applied aside may count at the same time
            self.applied[fault] += 1

    def _apply(self, event: dict) -> None:
        if event["fault"] in NEEDS_SERVER:
            with self._up:  # held while a restart has the server down: wait it out
                pass
            if self._stop.is_set():
                return  # healing began meanwhile: no fault after the heal
        try:
            getattr(self, f"_{event['fault']}")(event)
        except Exception as exc:  # a fault that cannot apply is logged, not fatal
            # A control that raises here (AdapterError) may have met a server the nemesis
            # crashed or a lock a paused worker holds, so it does not end the run: the
            # history keeps what the adapter raised, and the checkers judge a control that
            # raised instead of answering (operator-moves, submissions-idempotent).
            self._log("error", fault=event["fault"], error=described(exc))

    def _aside(self, target, *args) -> None:
        """Run `target` on its own thread; heal() waits for every one of them."""
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _schedule(self, delay: float, what: str, details: dict) -> None:
        self._n += 1
        heapq.heappush(self._heals, (time.time() + delay, self._n, what, details))

    def _run_heals(self, now: float) -> None:
        while self._heals and self._heals[0][0] <= now:
            _, _, what, details = heapq.heappop(self._heals)
            self._undo(what, details)

    def _undo(self, what: str, details: dict) -> None:
        if what == "resume":
            pid = details["pid"]
            if self._paused.pop(pid, None) is not None:
                _signal(pid, signal.SIGCONT)
                self._log("resume", **details)
        elif what == "outage_end":
            self.policy.outage.clear()
            self._log("outage_end", target="provider", **details)

    def _target(self, event: dict, roles: tuple[str, ...]):
        live = sorted((c for c in self.supervisor.alive() if c.role in roles
                       and c.pid not in self._paused), key=lambda c: c.name)
        return live[event["pick"] % len(live)] if live else None

    # -- the faults ------------------------------------------------------------------------

    def _kill(self, event: dict) -> None:
        roles = ("worker", "sender") if self.scenario.faults.kill_senders else ("worker",)
        child = self._target(event, roles)
        if child is None:
            return
        self._log("kill", target=child.name, pid=child.pid, role=child.role)
        self.supervisor.signal(child, signal.SIGKILL)
        self._count("kill")

    def _pause(self, event: dict) -> None:
        roles = ("worker", "sender") if self.scenario.faults.pause_senders else ("worker",)
        child = self._target(event, roles)
        if child is None:
            return
        seconds = self.scenario.faults.pause_seconds
        self._paused[child.pid] = child.name
        _signal(child.pid, signal.SIGSTOP)
        self._log("pause", target=child.name, pid=child.pid, seconds=seconds)
        self._schedule(seconds, "resume", {"target": child.name, "pid": child.pid})
        self._count("pause")

    def _lease_expiry(self, event: dict) -> None:
        expired = self.engine.expire_leases(self.db)
        self._log("expire", leases=expired)
        if expired:
            self._count("lease_expiry")

    def _outage(self, event: dict) -> None:
        self.policy.outage.set()
        self._log("outage", target="provider", until=event["until"])
        self._schedule(self.chaos_start + event["until"] - time.time(), "outage_end",
                       {"started": event["at"]})
        self._count("outage")

    def _contention(self, event: dict) -> None:
        self._aside(self._hold_lock, event.get("seconds", self.scenario.faults.contention_seconds))

    def _hold_lock(self, seconds: float) -> None:
        try:
            with self.engine.hold_write_lock(self.db):
                self._log("contention", seconds=seconds)
                self._count("contention")
                time.sleep(seconds)
            self._log("contention_end")
        except Exception as exc:  # the store refused the lock: logged, not fatal
            self._log("error", fault="contention", error=described(exc))

    @cached_property
    def _submit(self) -> Callable[..., str]:
        """The adapter's submit as the harness calls it (`submitter`), read when first used."""
        return submitter(self.engine, self.scenario.engine)

    def _duplicate_submit(self, event: dict) -> None:
        job = event["job"]
        payload = self._docs[job]
        if event["kind"] == "different":
            payload = different_payload(payload, job)
        result = self._submit(self.db, job, payload)
        self._log("duplicate_submit", job=job, kind=event["kind"], result=result)
        self._count(f"duplicate_{event['kind']}")
        self.record({"t": time.time(), "src": "runner", "type": "submit", "job": job,
                     "payload_hash": payload_hash(payload), "result": result,
                     "duplicate": True})

    def _operator(self, event: dict) -> None:
        jobs = self.plan.jobs
        job = jobs[event["pick"] % len(jobs)]
        started = time.time()
        result = self.engine.operator(self.db, event["action"], job)
        self._log("operator", action=event["action"], job=job, result=result, t_start=started)
        if result == "done":
            self._count(f"operator_{event['action']}")
        self._count("operator")

    # -- the database server's own (chaos.run.pgserver, a server the run started) -------------

    def _server_restart(self, event: dict) -> None:
        """Crash the server (pg_ctl stop -m immediate), restart it server_down_seconds
        later. heal() joins this thread, so no run ends with its server down."""
        down = self.scenario.faults.server_down_seconds
        with self._server_lock, self._up:
            self.server.crash()
            self._log("server_crash", seconds=down)
            self._count("server_restart")
            try:
                time.sleep(down)
            finally:
                self.server.restart()  # also when the run is being stopped: healing
                self._log("server_restart")

    def _connection_kill(self, event: dict) -> None:
        """End one engine process's connections on the server (pg_terminate_backend), in
        whatever it was doing: mid-transaction, its write is rolled back."""
        child = self._target(event, ("worker", "sender"))
        if child is None:
            return
        with self._server_lock:  # never against a server being restarted
            ended = self.server.terminate_clients(child.pid, within=MID_TRANSACTION_WAIT)
        if ended:
            self._log("connection_kill", target=child.name, pid=child.pid,
                      backends=len(ended), in_transaction=any(e["in_transaction"] for e in ended))
            self._count("connection_kill")

    def _statement_timeout(self, event: dict) -> None:
        """Have the server cancel engine statements as a statement_timeout would (SQLSTATE
        57014). A statement runs long when something holds what it needs: the write lock is
        held (the engine's control, as contention holds it) until a statement of some
        engine process has waited statement_timeout_seconds; every one that has is then
        cancelled (pg_cancel_backend), and the lock goes, or STATEMENT_WAIT later. (A
        timeout set on the server, ALTER ROLE ... SET statement_timeout, would reach only
        connections opened after it: the engine's live ones would never see it.)"""
        seconds = self.scenario.faults.statement_timeout_seconds
        cancelled: list = []
        with self._server_lock:  # never against a server being restarted
            try:
                with self.engine.hold_write_lock(self.db):
                    self._log("statement_timeout", seconds=seconds)
                    cancelled = self.server.cancel_statements(
                        lambda: self._engine_processes().keys(), running_for=seconds,
                        within=seconds + STATEMENT_WAIT)
                    names = self._engine_processes()
                    for c in cancelled:
                        self._log("statement_cancelled", target=names.get(c["client"]),
                                  pid=c["client"], backend=c["backend"])
                    if cancelled:
                        self._count("statement_timeout")
            finally:  # the held lock's window closes in the history however this ends
                self._log("statement_timeout_end", cancelled=len(cancelled))

    def _row_lock(self, event: dict) -> None:
        """Hold one row's lock in another transaction (the adapter's control: a job a worker
        holds, else one still to run, else an unsent outbox row) for row_lock_seconds,
        longer than a write of it waits (the engine's busy timeout, its lock_timeout on
        PostgreSQL): that write times out after its other statements ran, and must leave
        nothing; a claim passes the row over, and must take it once the lock goes.
        Recorded as row_lock and row_lock_end (table, row, job); row_lock_idle when nothing
        was left unfinished to lock."""
        seconds, target = self.scenario.faults.row_lock_seconds, None
        try:
            with self.engine.hold_row_lock(self.db, event["pick"]) as target:
                if target is None:
                    self._log("row_lock_idle")
                    return
                self._log("row_lock", seconds=seconds, **target)
                self._count("row_lock")
                time.sleep(seconds)
        finally:  # its window closes in the history however this ends
            if target is not None:
                self._log("row_lock_end", **target)

    # -- the machine's (chaos.powerloss) ---------------------------------------------------

    def _power_loss(self, event: dict) -> None:
        """Cut the power under the store: see chaos.powerloss.fault."""
        power_cut(self, event)

    def _engine_processes(self) -> dict[int, str]:
        """pid -> name of every live worker and sender."""
        return {c.pid: c.name for c in self.supervisor.alive() if c.role in ("worker", "sender")}


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
