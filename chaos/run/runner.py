"""A chaos run, phase by phase: set up, chaos, heal, drain, collect, check, report.

report.json's start record (`chaos.reports.report.start_record`), the scenario and the plan are saved
before anything starts, lifecycle and nemesis events are appended to `events.jsonl` as they
happen, the audit lives in the engine database and the ledgers on disk: a run killed halfway
still leaves its evidence, which `chaos.run.saved` reads back.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable

from chaos.spec import aim
from chaos import history as hist
from chaos.engines.adapter_guard import AdapterError
from chaos.run.backends import (SQLITE_FILE, Backend, RunDatabase, backend_for, check_backend,
                                database_name, run_database)
from chaos.checkers import run_checkers
from chaos.reports.console import Progress, plural
from chaos.contract import Command, Engine, ProcessContext, has, process_counts, submitter
from chaos.run.expect import harness_snapshot, process_context, settled
from chaos.fakes import FakeProvider, FakeReceiver
from chaos.run.nemesis import FaultPolicy, Nemesis
from chaos.spec.plan import FaultPlan, documents_for, make_plan
from chaos.powerloss.fault import refusal as power_loss_refusal, store_mount
from chaos.reports.render import render_run
from chaos.spec.capacity import capacity_warnings
from chaos.collect import collect_history
from chaos.reports.fired import faults_applied
from chaos.reports.report import build_report, start_record, write_report
from chaos.run.runfiles import is_secret, scenario_record, secret_names, write_json
from chaos.run.aim_watch import AimWatch
from chaos.run.runqueue import RunQueueWatch
from chaos.spec.scenario import (SERVER_FAULTS, Scenario, ScenarioError, check_for_engine,
                       crash_points_for)
from chaos.run.supervisor import Supervisor, evidence_in

POLL = 0.02
#: Seconds between two looks at the engine's progress for the progress line.
LOOK = 1.0


class HarnessError(RuntimeError):
    """The run could not be carried out (exit code 2), as opposed to an invariant failing."""


@dataclass
class RunResult:
    run_dir: str
    report: dict[str, Any]

    @property
    def exit_code(self) -> int:
        return self.report["exit_code"]


class Recorder:
    """Collects events from every thread and appends each to events.jsonl at once."""

    def __init__(self, path: str) -> None:
        self.events: list[hist.Event] = []
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8")

    def __call__(self, event: hist.Event) -> None:
        with self._lock:
            event.setdefault("seq", len(self.events))
            self.events.append(event)
            self._fh.write(json.dumps(event, sort_keys=True) + "\n")
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def run_dir_for(out: str, scenario: Scenario, seed: int) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = os.path.join(out, scenario.name, f"{stamp}-seed{seed}")
    os.makedirs(path, exist_ok=False)
    latest = os.path.join(out, scenario.name, "latest")
    try:
        if os.path.islink(latest):
            os.unlink(latest)
        os.symlink(os.path.basename(path), latest)
    except OSError:
        pass  # a concurrent run took the link; the run folder is what counts
    return path


class Campaign:
    """One run of one scenario with one plan against one engine."""

    def __init__(self, scenario: Scenario, plan: FaultPlan, engine: Engine,
                 run_dir: str, *, progress: bool = True,
                 database: RunDatabase | None = None, store: Any = None) -> None:
        self.scenario, self.plan, self.engine, self.run_dir = scenario, plan, engine, run_dir
        self.progress = progress
        # a SQLite file in the run folder (on the lost-fsync mount `store` when the power
        # fails: chaos.powerloss), or the URL of the run's PostgreSQL database
        self.store = store
        self.db = database.target if database and database.target else \
            os.path.join(store.mountpoint if store else run_dir, SQLITE_FILE)
        self.record = Recorder(os.path.join(run_dir, "events.jsonl"))
        self.integrity: list[dict[str, Any]] = []
        self.phases: dict[str, Any] = {}
        self.chaos_on = False
        self.faulting = False  # the nemesis is started and not yet healed
        try:
            self.settings = check_for_engine(scenario, engine)
        except ScenarioError as exc:
            raise HarnessError(str(exc)) from None
        self.server = database.control if database else None
        configured = [name for name in SERVER_FAULTS if getattr(scenario.faults, name)]
        if configured and self.server is None:
            raise HarnessError(f"faults.{configured[0]} needs --backend postgres on a server the "
                               "run starts itself (without --pg-url): it crashes and restarts "
                               "that server, or ends its connections")
        if scenario.faults.row_lock and (database.backend if database else "sqlite") != \
                "postgres":
            raise HarnessError("faults.row_lock needs --backend postgres: it holds one row's "
                               "lock, and SQLite locks the whole database (the contention "
                               "fault holds that)")
        if hasattr(engine, "store_settings"):  # what this store changes (whose clock, ...)
            self.settings = replace(self.settings, **engine.store_settings(self.db))
        self.urls = ("", "")
        self.fakes: dict[str, Any] = {}

    # -- the phases ------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Carry out every phase; returns the snapshot the checkers need."""
        self._write_json("scenario.json", scenario_record(self.scenario, self.engine))
        self._write_json("plan.json", self.plan.to_json())
        self._submit_all()
        policy = FaultPolicy(self.scenario, self.plan, self.settings.send_timeout or 1.0)
        with FakeProvider(os.path.join(self.run_dir, "provider.jsonl"), faults=policy) as p, \
                FakeReceiver(os.path.join(self.run_dir, "receiver.jsonl"), faults=policy) as r:
            self.urls = (p.url, r.url)
            self.fakes = {"provider": p, "receiver": r}
            sup = Supervisor(self._command, log_dir=self.run_dir, record=self.record)
            # What the machine did to the engine's processes (chaos.run.runqueue): the timing
            # checks excuse a process only its own stalls.
            watch = RunQueueWatch(lambda: [c.pid for c in sup.children if c.ended is None],
                                  self.record).start()
            try:
                self._phases(sup, policy)
            except BaseException:
                self._stop_nemesis()  # no fault may land on a process being stopped
                raise
            finally:
                with Progress("stopping", enabled=self.progress) as shown:
                    shown.update(detail="the engine's processes")
                    watch.stop()
                    sup.close()
                    self.phases["processes_ended"] = time.time()
                    shown.update(detail="the fakes")
            applied = r.applied()
        self._check_ledgers()  # a line lost in the drain's last requests
        with Progress("stopping", enabled=self.progress) as shown:
            shown.update(detail="the final snapshot of the store")
            return self._snapshot(applied)

    def _phases(self, sup: Supervisor, policy: FaultPolicy) -> None:
        counts = process_counts(self.scenario.run, self.engine)
        nemesis = Nemesis(self.scenario, self.plan, self.engine, self.db, sup, policy,
                          self.record, self.server)
        self.nemesis = nemesis
        nemesis.store = self.store
        # the aimed faults' side of the probe's holds (chaos.run.aim_watch): its own role
        self.aims = AimWatch(aim.resolve(self.scenario.aims, self.engine), self.engine,
                             self.db, aim.hold_log(self.run_dir), lambda: list(sup.children),
                             self.record, self.plan,
                             lambda child: sup.signal(child, signal.SIGKILL))
        self.chaos_on = True
        self._wait_for_first_claim(sup, counts)
        self._phase("chaos")
        nemesis.start(self.phases["chaos_start"])
        if self.aims.targets:
            self.aims.start()
        self.faulting = True
        self._loop(sup, counts, self.phases["chaos_start"] + self.scenario.run.chaos, "chaos")
        self._phase("heal")
        self.chaos_on = False
        self.aims.heal()
        nemesis.heal()
        self.faulting = False
        self._loop(sup, counts, time.time() + self.scenario.run.heal, "heal")
        self._phase("drain")
        deadline = time.time() + self.scenario.run.drain
        self.phases["drained"] = self._loop(sup, counts, deadline, "drain", until_settled=True)
        self._phase("check")
        self.phases["drain_end"] = self.phases["check_start"]

    def _check_ledgers(self) -> None:
        """Raise HarnessError once a fake could not write its ledger (a full disk): the run's
        record would lack requests it answered, so it can have no verdict. The fake kept the
        error (chaos.fakes.server); this is the one place it is said."""
        for name, fake in self.fakes.items():
            failure = fake.ledger_failure
            if failure is not None:
                raise HarnessError(f"the fake {name} could not write its ledger "
                                   f"{failure.filename}: {failure.strerror} (after "
                                   f"{plural(failure.written, 'line')}); a run without the "
                                   "record of every request has no verdict")

    def _stop_nemesis(self) -> None:
        """On the way out of an interrupted run: stop applying faults, undo those in force
        (a paused process resumes, and can then act on the supervisor's SIGTERM)."""
        if self.faulting:
            self.faulting = False
            self.aims.heal()
            self.nemesis.heal()

    def _wait_for_first_claim(self, sup: Supervisor, counts: dict[str, int],
                              timeout: float = 60.0) -> None:
        """Start the engine's processes (`counts` per role), and the chaos clock once the
        workers work: on a loaded machine, starting the interpreters can take longer than a
        short chaos phase. The progress line says so from the start of both."""
        initial = self.engine.pipeline.initial
        workers = f"{plural(counts['worker'], 'worker')} and {plural(counts['sender'], 'sender')}"
        with Progress("starting", enabled=self.progress) as shown:
            shown.update(detail=f"starting {workers}")
            sup.keep(counts)
            shown.update(detail=f"{workers} started, waiting for the first claim")
            deadline, looked = time.time() + timeout, 0.0
            while time.time() < deadline:
                states = self.engine.progress(self.db)["states"]
                if set(states) - {initial}:
                    return
                if time.time() - looked > 0.2:  # a claim that leaves the state as it was
                    looked = time.time()
                    if any(e["type"] == "claimed" for e in self.engine.operations(self.db)):
                        return
                if not sup.alive("worker"):
                    sup.reap()
                    sup.keep({"worker": self.scenario.run.workers})
                time.sleep(POLL)
        raise HarnessError(f"no worker claimed a job within {timeout:.0f} s; see the worker "
                           f"logs in {self.run_dir}")

    def _phase(self, name: str) -> None:
        now = time.time()
        self.phases[f"{name}_start"] = now
        self.record({"t": now, "src": "runner", "type": "phase", "phase": name})

    def _loop(self, sup: Supervisor, counts: dict[str, int], until: float, phase: str,
              until_settled: bool = False) -> bool:
        """Reap, check integrity after kills, respawn; True once settled (if asked). The
        progress line shows the phase's seconds, or for the drain what it waits for."""
        looked = 0.0
        total, unit = ((len(self.plan.jobs), "jobs settled") if until_settled
                       else (until - time.time(), "s"))
        with Progress(phase, total, unit=unit, enabled=self.progress) as shown:
            while time.time() < until:
                for child in sup.reap():
                    if child.proc.returncode == -9 and has(self.engine, "integrity"):
                        with self._server_up():
                            self.integrity.append({"t": time.time(),
                                                   "after": f"kill of {child.name}",
                                                   "result": self.engine.integrity(self.db)})
                with self._server_up():  # no respawn while the power is cut
                    sup.keep(counts)
                self._check_ledgers()
                if until_settled or (self.progress and time.time() - looked > LOOK):
                    with self._server_up():
                        looked, state = time.time(), self.engine.progress(self.db)
                    if until_settled and settled(self.engine, state):
                        shown.update(sum(state["states"].values()), detail="all settled")
                        return True
                    self._show(shown, state, until, until_settled)
                time.sleep(POLL)
            if self.progress:  # the phase as it ended, not as it was a second before
                with self._server_up():
                    state = self.engine.progress(self.db)
                self._show(shown, state, until, until_settled)
        return until_settled and self._settled()

    def _server_up(self):
        """While faults apply, a database server the nemesis crashes is held up for a read
        of ours (the nemesis's `server_up`); otherwise nothing to hold."""
        return self.nemesis.server_up() if self.faulting and (
            self.server is not None or self.store is not None) else contextlib.nullcontext()

    def _settled(self) -> bool:
        return settled(self.engine, self.engine.progress(self.db))

    def _show(self, shown: Progress, state: dict[str, Any], until: float, drain: bool) -> None:
        """Update a phase's progress from the engine's own count of jobs per state and of
        unsent outbox rows (the contract's `progress`)."""
        states, left = state["states"], max(0.0, until - time.time())
        if not drain:
            shown.update(shown.total - left,
                         detail=", ".join(f"{s} {n}" for s, n in sorted(states.items())))
            return
        done = self.engine.pipeline.terminal | self.engine.pipeline.parked_states
        finished = sum(n for s, n in states.items() if s in done)
        waiting = [f"{plural(sum(states.values()) - finished, 'job')} not finished"] if \
            sum(states.values()) > finished else []
        if state["unsent"]:
            waiting.append(f"{plural(state['unsent'], 'outbox row')} unsent")
        shown.update(finished, total=sum(states.values()),
                     detail=", ".join(waiting + [f"{left:.0f} s to the deadline"]))

    # -- set-up ------------------------------------------------------------------------------

    def _submit_all(self) -> None:
        with Progress("starting", len(self.plan.jobs), unit="jobs submitted",
                      enabled=self.progress) as shown:
            shown.update(0, detail="the engine's database and its audit")
            self.engine.install(self.db)
            shown.update(0, detail=f"making {plural(len(self.plan.jobs), 'document')}")
            submit = submitter(self.engine, self.scenario.engine)
            for n, (job_id, payload) in enumerate(documents_for(self.plan), 1):
                self._submit(submit, job_id, payload)
                shown.update(n, detail="")

    def _submit(self, submit: Callable[..., str], job_id: str, payload: Any) -> None:
        result = submit(self.db, job_id, payload)
        self.record({"t": time.time(), "src": "runner", "type": "submit", "job": job_id,
                     "payload_hash": hist.payload_hash(payload),
                     "result": result, "duplicate": False})
        if result != "created":
            raise HarnessError(f"submitting {job_id} to a fresh database gave {result!r}")

    def _command(self, role: str, slot: int, n: int) -> Command:
        """The adapter's command for one process, from this run's settings for `slot`, with
        the probe's environment when the engine arms it."""
        command = self.engine.command(role, self._context(role, slot))
        return Command(command.argv, {**command.env, **self._crash_env(n)})

    def _context(self, role: str, slot: int) -> ProcessContext:
        """Per-slot settings (chaos.run.expect.process_context), recorded when they are faults."""
        ctx = process_context(self.scenario, self.plan, self.settings, role, slot, self.db,
                              *self.urls)
        if ctx.clock_skew:
            self.record({"t": time.time(), "src": "nemesis", "type": "skew", "slot": slot,
                         "seconds": ctx.clock_skew})
        if ctx.heartbeat is False:
            self.record({"t": time.time(), "src": "nemesis", "type": "heartbeat_off",
                         "slot": slot, "call_timeout": ctx.call_timeout})
        return ctx

    def _crash_env(self, n: int) -> dict[str, str]:
        """The probe's environment (see chaos.probe): crash-loop jobs always, armed points
        during the chaos phase."""
        if not has(self.engine, "crash_points"):
            return {}
        env = {"NINELIVES_CRASH_LOG": os.path.join(self.run_dir, "crashes.jsonl")}
        if getattr(self.engine, "write_points", None):  # its rows do not say who wrote
            env["NINELIVES_TRACE"] = os.path.join(self.run_dir, "trace.jsonl")
        if self.plan.crash_loop:
            env["NINELIVES_CRASH_JOBS"] = ",".join(self.plan.crash_loop)
            env["NINELIVES_CRASH_JOBS_AT"] = self.engine.crash_loop_point
        f = self.scenario.faults
        points, _ = crash_points_for(self.scenario, self.engine)
        if self.chaos_on and points:
            env["NINELIVES_CRASH_AT"] = ",".join(
                f"{p}@{f.crash_point_probability}" for p in points)
            env["NINELIVES_CRASH_SEED"] = str(self.plan.crash_seeds[n % len(self.plan.crash_seeds)])
        if self.chaos_on and self.scenario.aims:  # aimed faults (chaos.spec.aim): the holds
            env.update(aim.probe_env(aim.resolve(self.scenario.aims, self.engine), self.plan,
                                     aim.hold_log(self.run_dir), self.engine))
        return env

    def _write_json(self, name: str, data: Any) -> None:
        write_json(os.path.join(self.run_dir, name), data)

    # -- collecting --------------------------------------------------------------------------

    def _snapshot(self, applied: list[dict]) -> dict[str, Any]:
        snap = self.engine.snapshot(self.db)
        if has(self.engine, "integrity"):
            self.integrity.append({"t": time.time(), "after": "end",
                                   "result": self.engine.integrity(self.db)})
        snap.update(harness_snapshot(self.scenario, self.plan, self.engine, self.settings,
                                     integrity=self.integrity, receiver_applied=applied,
                                     phases=self.phases, jobs=self.plan.jobs))
        self._write_json("snapshot.json", snap)
        return snap

    def history(self) -> list[hist.Event]:
        """Every source merged into one time-ordered history."""
        return collect_history(self.run_dir, self.engine, self.record.events, self.db)


def run_campaign(scenario: Scenario, seed: int, engine: Engine, out: str, *,
                 plan: FaultPlan | None = None, engine_spec: str | None = None,
                 progress: bool = True, backend: Backend = Backend()) -> RunResult:
    """Run one scenario end to end, on a fresh database of `backend`, and write its reports.
    Raises HarnessError when the run itself could not be carried out, BackendError (before
    any run folder is made) when its database cannot be."""
    if plan is None:
        with Progress("planning", enabled=progress) as shown:
            shown.update(detail=f"the fault plan of {plural(scenario.run.jobs, 'job')}, "
                                f"seed {seed}")
            plan = make_plan(scenario, seed, engine.pipeline)
    check_backend(engine, backend)
    backend = backend_for(scenario, backend)
    refused = power_loss_refusal(scenario, backend.name, own_server=backend.pg_url is None)
    if refused:
        raise HarnessError(refused)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    # The database first: a server that cannot be started or reached fails the run before
    # it leaves a folder; a server started here stops when the run ends, however it ends.
    with run_database(backend, database_name(scenario.name, stamp, seed)) as database:
        return _run_on(scenario, plan, engine, out, engine_spec, progress, database)


def _run_on(scenario: Scenario, plan: FaultPlan, engine: Engine, out: str,
            engine_spec: str | None, progress: bool, database: RunDatabase) -> RunResult:
    seed = plan.seed
    run_dir = run_dir_for(out, scenario, seed)
    started = time.time()
    # More engine processes than this machine's runs are judged reliably with: said before
    # the run, and in its report (chaos.spec.capacity).
    for warning in capacity_warnings(scenario):
        print(f"warning: {warning}", file=sys.stderr)
    # First of all, what runs and how to replay it: a run killed halfway stays usable.
    start = with_capacity(start_record(scenario, plan, engine, engine_spec, run_dir, started,
                                       database.to_json()), scenario)
    write_report(run_dir, start)
    try:
        # From here on the folder exists: an interrupt anywhere (the campaign, its checks,
        # the rendering) names it
        with evidence_in(run_dir):
            return _carry_out(scenario, plan, engine, run_dir, engine_spec, progress,
                              database, started)
    except AdapterError as exc:
        keep_adapter_error(exc, run_dir, start, scenario, engine)
        raise


def keep_adapter_error(exc: AdapterError, run_dir: str, start: dict[str, Any],
                       scenario: Scenario, engine: Engine) -> None:
    """An adapter raised mid-run: its traceback goes into the run folder (the scenario's
    secret settings hidden), and report.json stays the start record, partial as a killed
    run's, saying which method raised. Every process was stopped on the way out."""
    extra = secret_names(engine)
    exc.hide_values(v for k, v in scenario.engine.items() if is_secret(str(k), extra))
    exc.keep_in(run_dir, partial=True)
    write_report(run_dir, {**start, "adapter_error": exc.to_json()})


def _carry_out(scenario: Scenario, plan: FaultPlan, engine: Engine, run_dir: str,
               engine_spec: str | None, progress: bool, database: RunDatabase,
               started: float) -> RunResult:
    # unmounted once the history is read; a server the run started moves onto it
    with store_mount(scenario, run_dir, database.control) as store:
        campaign = Campaign(scenario, plan, engine, run_dir, progress=progress,
                            database=database, store=store)
        try:
            snapshot = campaign.run()
        finally:
            campaign.record.close()
        with Progress("check", enabled=progress) as shown:
            shown.update(detail="reading the history")
            events = campaign.history()
    with Progress("check", enabled=progress) as shown:
        shown.update(detail=f"writing the history of {len(events)} events")
        hist.write_history(os.path.join(run_dir, "history.jsonl"), events)
        shown.update(detail=f"the invariants over {len(events)} events")
        verdicts = run_checkers(events, snapshot)
        shown.update(detail="writing the report")
        applied = faults_applied(plan, events, campaign.nemesis.applied)
        report = with_capacity(build_report(scenario, plan, engine, engine_spec, run_dir,
                                            verdicts, applied, events, snapshot, started,
                                            database.to_json()), scenario)
        write_report(run_dir, report)
        shown.update(detail="rendering report.html, junit.xml, summary.md")
        render_reports(run_dir)
    return RunResult(run_dir, report)


def with_capacity(report: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """`report` with `warnings` (a list, empty when none): what the run was warned of at
    plan time, such as more workers than this machine's runs are judged reliably with."""
    return {**report, "warnings": capacity_warnings(scenario)}


def render_reports(run_dir: str) -> list[str]:
    """report.html, junit.xml and summary.md beside report.json; returns their paths. A
    rendering failure is a warning on stderr, never a lost run: report.json is written."""
    try:
        return render_run(run_dir)
    except Exception as exc:  # any rendering bug: the run's record must survive it
        print(f"warning: could not render the reports of {run_dir}: {type(exc).__name__}: "
              f"{exc}; report.json is complete (retry: ninelives report {run_dir})",
              file=sys.stderr)
        return []
