"""`ninelives doctor --engine M:OBJ`: is an adapter ready for `ninelives run`? The first
thing to run while writing one.

It loads the adapter and lists every contract gap; installs a fresh SQLite store in a
temporary folder; submits a few jobs; runs one worker (and one sender) from the adapter's
own `command(role, ctx)` against the fakes, with no fault, until every job is finished or
the deadline passes; reads back its operations and snapshot; tries each declared control
once; and prints every gap at once, each with its fix (`chaos.engines.doctor_checks` draws the
conclusions). Exit 0: ready (warnings and notes allowed); exit 2: not ready. Exit 1 says
an invariant failed, and doctor judges no invariant, so it never exits 1.

Why SQLite only: doctor checks an adapter, not a backend; an adapter that runs only on
PostgreSQL is told so and doctor stops (start a server with `ninelives run --backend
postgres` instead). Every process it starts is ended by the supervisor, whatever happens.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, Callable

from chaos.engines.adapter_guard import AdapterError, guard, guarded_call, unguarded
from chaos.contract import (REQUIRED, Command, ContractError, EngineSettings, ProcessContext,
                       contract_gaps, has, import_adapter, submitter)
from chaos.engines.doctor_checks import (CONTROL_FIXES, GAP, NOTE, OK, WARNING, Evidence, Finding,
                            capability_findings, contract_fix, evidence_left_out, excerpt, gap,
                            history_findings, hold, int_answer, ok_answer, progress_shape,
                            read_all, see)
from chaos.engines.schema import OperationError, read_snapshot

#: Jobs doctor submits, the seconds it waits for them, and how often it looks.
JOBS = 4
TIMEOUT = 15.0
POLL = 0.05
#: A heartbeat interval at most this long is exercised: one call is slowed past it.
PROVOKE_HEARTBEAT = 1.0
UNKNOWN_SETTING = "no_such_setting"
EXTRA_JOB = "doctor-extra"


class Stop(Exception):
    """Doctor cannot go on: the finding says why."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.text)
        self.finding = finding


def adapter_gap(exc: AdapterError, fix: str) -> Finding:
    return gap(str(exc), fix)


class Doctor:
    """One examination of one adapter; `findings` grows as it goes."""

    def __init__(self, spec: str, table: dict[str, Any], jobs: int = JOBS,
                 timeout: float = TIMEOUT, progress: bool = True) -> None:
        self.spec, self.table, self.jobs, self.timeout = spec, table, jobs, timeout
        self.progress = progress
        self.findings: list[Finding] = []
        self.engine: Any = None
        self.given = spec

    def add(self, *findings: Finding) -> None:
        self.findings += [f for f in findings if f not in self.findings]

    def say(self, text: str) -> None:
        if self.progress:
            print(f"doctor: {text}", file=sys.stderr, flush=True)

    # -- the examination ----------------------------------------------------------------------

    def examine(self, keep: str | None = None) -> list[Finding]:
        """Every finding about the adapter (see the module docstring); `keep`: a folder to
        keep the store and the process logs in, instead of a temporary one."""
        try:
            self.load()
            settings = self.check_settings()
            with ExitStack() as stack:
                folder = keep or stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="ninelives-doctor-"))
                os.makedirs(folder, exist_ok=True)
                self.run_in(folder, settings)
        except Stop as stop:
            self.add(stop.finding)
        return self.findings

    def load(self) -> None:
        """Import and build the adapter; every contract gap; stop where the run needs what
        is missing."""
        try:
            given, engine = import_adapter(self.spec)
        except ContractError as exc:
            raise Stop(gap(str(exc), "give --engine as module:object, importable from the "
                                     "current folder " + see("Testing your own engine")))
        except AdapterError as exc:
            raise Stop(adapter_gap(exc, "make the module import and the object build "
                                        "without error"))
        gaps = contract_gaps(engine)
        for text in gaps:
            self.add(gap(f"the adapter {text}", contract_fix(text)))
        missing = [n for n in REQUIRED if not hasattr(engine, n)]
        if missing or any("pipeline" in g for g in gaps):
            raise Stop(Finding(NOTE, "doctor stops here: a run needs "
                               + ", ".join(REQUIRED) + " and a chaos.pipeline.Pipeline"))
        if not gaps:
            self.add(Finding(OK, f"contract: {engine.name}, every required attribute and "
                                 f"every capability's control "
                                 f"({', '.join(sorted(engine.capabilities)) or 'none'})"))
        supported = tuple(getattr(engine, "backends", ("sqlite",)))
        if "sqlite" not in supported:
            raise Stop(gap(f"{engine.name} runs on {', '.join(supported)} only; doctor "
                           "checks an adapter on a SQLite file",
                           "add 'sqlite' to the adapter's backends, or check it with "
                           "ninelives run --backend postgres"))
        self.given, self.engine = given, guard(engine, given)
        self.check_static()

    def check_static(self) -> None:
        """What the adapter declares, checked without a store: crash points, submit."""
        e = self.engine
        if has(e, "crash_points"):
            points = tuple(getattr(e, "crashpoints", ()))
            loop = getattr(e, "crash_loop_point", None)
            if not points or not all(isinstance(p, str) for p in points):
                self.add(gap(f"'crash_points' is declared but crashpoints is "
                             f"{excerpt(points)}, not a tuple of point names",
                             "list the engine's points in crashpoints " + see("Crash points "
                                                                              "by role")))
            elif loop not in points:
                self.add(gap(f"crash_loop_point {loop!r} is not among the crashpoints "
                             f"({', '.join(points)})",
                             "set crash_loop_point to one of crashpoints, where a crash-loop "
                             "job kills its worker " + see("Crash points by role")))
            else:
                self.add(Finding(OK, f"crash points: {len(points)} declared, crash loops "
                                     f"die at {loop}"))
        params = _parameters(unguarded(e).submit)
        if "settings" in params:
            self.add(Finding(NOTE, "submit takes settings=: each submission is given the "
                                   "[engine] table " + see("Settings at submit")))
        elif any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            self.add(Finding(NOTE, "submit takes **kwargs but no parameter named settings: "
                                   "the harness passes the [engine] table only when asked for "
                                   "by name " + see("Settings at submit")))

    def check_settings(self) -> EngineSettings:
        """settings(table) gives EngineSettings and refuses a setting it does not have,
        by name. Returns the settings the run uses."""
        e = self.engine
        try:
            refused = e.settings({**self.table, UNKNOWN_SETTING: 1})
        except ValueError as exc:
            if UNKNOWN_SETTING not in str(exc):
                self.add(gap(f"settings() refused {UNKNOWN_SETTING} without naming it: "
                             f"{excerpt(str(exc))}", "name the field at fault in the "
                             "ValueError settings() raises " + see("The contract, by role")))
        except AdapterError as exc:
            self.add(adapter_gap(exc, "let settings() raise ValueError naming an unknown "
                                      "setting, and nothing else"))
        else:
            self.add(gap(f"settings() accepts the unknown setting {UNKNOWN_SETTING} "
                         f"silently (it returned {type(refused).__name__})",
                         "raise ValueError naming any [engine] setting the engine does not "
                         "have, so a misspelt one is never ignored " + see("The contract, "
                                                                          "by role")))
        try:
            settings = e.settings(dict(self.table))
        except ValueError as exc:
            raise Stop(gap(f"settings({excerpt(self.table)}) refused: {exc}",
                           "give every setting a default, or pass it with --engine-set"))
        except AdapterError as exc:
            raise Stop(adapter_gap(exc, "have settings() return EngineSettings"))
        if not isinstance(settings, EngineSettings):
            raise Stop(gap(f"settings() returned {type(settings).__name__}, not "
                           "chaos.contract.EngineSettings", "return EngineSettings(...) "
                           + see("The contract, by role")))
        self.add(Finding(OK, f"settings: EngineSettings (token_order {settings.token_order}, "
                             f"cap_counts {settings.cap_counts}), an unknown one refused"))
        return settings

    # -- the run -------------------------------------------------------------------------------

    def run_in(self, folder: str, settings: EngineSettings) -> None:
        from chaos.fakes import FakeProvider, FakeReceiver, ScriptedFaults
        from chaos.run.supervisor import Supervisor
        e, db = self.engine, os.path.join(folder, "engine.db")
        self.attempt(lambda: e.install(db), "create the store in install(db)")
        if hasattr(unguarded(e), "store_settings"):
            extra = self.attempt(lambda: e.store_settings(db),
                                 "have store_settings(db) return EngineSettings fields")
            settings = replace(settings, **extra)
        jobs = self.submit_all(db)
        ev = Evidence(e.pipeline, frozenset(e.capabilities), settings, jobs=jobs)
        slow = self.heartbeat_fault(settings, jobs)
        ev.heartbeat_provoked = bool(slow)
        with FakeProvider(os.path.join(folder, "provider.jsonl"),
                          faults=ScriptedFaults(provider=slow)) as provider, \
                FakeReceiver(os.path.join(folder, "receiver.jsonl")) as receiver:
            sup = Supervisor(self.command_for(db, provider.url, receiver.url), log_dir=folder)
            try:
                ev.settled = self.watch(sup, db)
            finally:
                sup.close()
        ev.provider_calls = len(_ledger(os.path.join(folder, "provider.jsonl")))
        self.read_back(db, ev)
        self.try_controls(db)
        self.add(*capability_findings(ev), *history_findings(ev))

    def attempt(self, call: Callable[[], Any], fix: str) -> Any:
        """`call()`, or Stop with the adapter's error and `fix`."""
        try:
            return call()
        except AdapterError as exc:
            raise Stop(adapter_gap(exc, fix)) from None

    def submit_all(self, db: str) -> tuple[str, ...]:
        """Submit the jobs (each must be "created"), and the first one again ("exists")."""
        from chaos.spec.documents import make_documents
        docs = make_documents(self.jobs, seed=1, prefix="doctor")
        submit = submitter(self.engine, self.table)
        fix = "have submit(db, job, payload) answer created, exists or rejected"
        for job, payload in docs:
            answer = self.attempt(lambda: submit(db, job, payload), fix)
            if answer != "created":
                raise Stop(gap(f"submit of a new job {job} to a fresh store answered "
                               f"{excerpt(answer)}, not 'created'", fix))
        again = self.attempt(lambda: submit(db, *docs[0]), fix)
        if again != "exists":
            self.add(gap(f"submit of job {docs[0][0]} again, with the same payload, answered "
                         f"{excerpt(again)}, not 'exists'", fix + "; the same id and payload "
                         "again is 'exists' " + see("The contract, by role")))
        self.add(Finding(OK, f"install and submit: {len(docs)} jobs created, the first "
                             "again answered exists"))
        return tuple(job for job, _ in docs)

    def heartbeat_fault(self, settings: EngineSettings,
                        jobs: tuple[str, ...]) -> dict | None:
        """A slow first call, past the heartbeat interval, when the engine declares heartbeat
        with an interval short enough to wait for (and a call timeout that allows it)."""
        interval, timeout = settings.heartbeat_interval, settings.call_timeout
        steps = self.engine.pipeline.model_steps
        if not (has(self.engine, "heartbeat") and settings.heartbeat and interval and steps
                and interval <= PROVOKE_HEARTBEAT):
            return None
        seconds = interval * 2.5
        if timeout is not None and seconds >= timeout * 0.8:
            return None
        return {(jobs[0], steps[0], 1): {"kind": "slow", "seconds": seconds}}

    def command_for(self, db: str, provider: str,
                    receiver: str) -> Callable[[str, int, int], Command]:
        def command(role: str, slot: int, n: int) -> Command:
            ctx = ProcessContext(db, provider, receiver, dict(self.table), slot)
            made = self.engine.command(role, ctx)
            if not isinstance(made, Command):
                raise Stop(gap(f"command({role!r}, ctx) returned {type(made).__name__}, not "
                               "chaos.contract.Command", "return Command(argv, env) "
                               + see("The contract, by role")))
            return made
        return command

    def watch(self, sup: Any, db: str) -> bool:
        """Start one worker (and one sender), then wait until progress(db) shows every job
        finished and nothing unsent; False when the deadline passed first."""
        from chaos.reports.console import Progress
        from chaos.run.expect import settled
        e = self.engine
        roles = ["worker"] + (["sender"] if has(e, "outbox") or e.pipeline.effects else [])
        for role in roles:
            self.attempt(lambda: sup.spawn(role), "return the argv and env of one "
                         f"{role} from command(role, ctx)")
        deadline = time.monotonic() + self.timeout
        with Progress("doctor", self.jobs, unit="jobs finished",
                      enabled=self.progress) as shown:
            while True:
                for child in sup.reap():
                    tail = (_last_line(child.log_path) or "no output")
                    raise Stop(gap(f"{child.role} process {child.name} exited by itself "
                                   f"(code {child.proc.returncode}) before the jobs finished: "
                                   f"{excerpt(tail, 200)}", "command(role, ctx) must start "
                                   "a process that runs until it is stopped "
                                   + see("The contract, by role")))
                state = self.attempt(lambda: e.progress(db),
                                     "have progress(db) return {'states': {...}, 'unsent': n}")
                if not progress_shape(state):
                    raise Stop(gap(f"progress(db) returned {excerpt(state)}, not "
                                   "{'states': {state: n}, 'unsent': n}",
                                   "return that shape " + see("The contract, by role")))
                done = e.pipeline.terminal | e.pipeline.parked_states
                finished = sum(n for s, n in state["states"].items() if s in done)
                shown.update(finished, detail=f"{state['unsent']} unsent")
                if settled(e, state):
                    self.add(Finding(OK, f"run: {' and '.join(roles)} finished "
                                         f"{self.jobs} jobs without faults"))
                    return True
                if time.monotonic() > deadline:
                    self.add(gap(f"the jobs did not finish within {self.timeout:g} s: "
                                 f"{excerpt(state)}", "check the worker logs (--keep DIR), "
                                 "and that progress(db) counts the pipeline's states"))
                    return False
                time.sleep(POLL)

    def read_back(self, db: str, ev: Evidence) -> None:
        """The operations and the snapshot, every unreadable field named."""
        from chaos.checkers import READS, load
        e = unguarded(self.engine)
        ops = self.attempt(lambda: guarded_call(
            self.given, "operations", e.operations)(db),
            "have operations(db) return what the engine committed, without raising")
        problems, ev.ops, ev.unreadable = read_all(ops)
        self.add(*problems)
        if not problems:
            self.add(Finding(OK, f"operations: {len(ev.ops)}, each readable by the "
                                 "history's vocabulary"))
        load()
        self.add(*evidence_left_out(ev.ops, READS))
        snap = self.attempt(lambda: guarded_call(
            self.given, "snapshot", e.snapshot)(db),
            "have snapshot(db) return the final rows, without raising")
        try:
            ev.snapshot = read_snapshot(snap)
            self.add(Finding(OK, "snapshot: readable"))
        except OperationError as exc:
            self.add(gap(str(exc), "give snapshot(db) every table and field of the neutral "
                                   "form " + see("The snapshot", "docs/history.md")))

    def try_controls(self, db: str) -> None:
        """Each declared capability's control, once, on the quiet store."""
        e = self.engine
        checks = [("operator", "operator", self.try_operator),
                  ("lease_expiry", "expire_leases", lambda: int_answer(e.expire_leases(db))),
                  ("write_lock", "hold_write_lock", lambda: hold(e.hold_write_lock(db))),
                  ("integrity", "integrity", lambda: ok_answer(e.integrity(db)))]
        for capability, method, check in checks:
            fix = CONTROL_FIXES[method]
            if not has(e, capability):
                continue
            try:
                why = check(db) if method == "operator" else check()
            except AdapterError as exc:
                why = str(exc)
            if why:
                self.add(gap(f"'{capability}' is declared but {method}: {why}",
                             f"{fix}, or leave out '{capability}' "
                             + see("Capabilities and what they enable")))
            else:
                self.add(Finding(OK, f"{capability}: {method} answered as the contract says"))

    def try_operator(self, db: str) -> str | None:
        e = self.engine
        payload = {"doc_id": EXTRA_JOB, "title": "Extra", "body": "A job to cancel."}
        if submitter(e, self.table)(db, EXTRA_JOB, payload) != "created":
            return f"the extra job {EXTRA_JOB} to cancel could not be created"
        answer = e.operator(db, "cancel", EXTRA_JOB)
        if answer == "done" or (isinstance(answer, str) and answer.startswith("refused: ")):
            return None
        return f"cancel answered {excerpt(answer)}, not 'done' or 'refused: why'"


def _parameters(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def _ledger(path: str) -> list[dict]:
    from chaos.fakes import read_ledger
    return read_ledger(path) if os.path.exists(path) else []


def _last_line(path: str | None) -> str | None:
    from chaos.run.supervisor import log_tail
    tail = log_tail(path)
    lines = [line for line in (tail or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


# -- the report ---------------------------------------------------------------------------------

LABELS = {OK: "ok", NOTE: "note", WARNING: "warning", GAP: "GAP"}


def render(spec: str, findings: list[Finding]) -> str:
    """The findings as lines, passes first and gaps last, then the verdict."""
    order = [OK, NOTE, WARNING, GAP]
    lines = [f"ninelives doctor --engine {spec}"]
    for level in order:
        for f in findings:
            if f.level == level:
                lines.append(f"{LABELS[level]:>7}  {f.text}")
                if f.fix:
                    lines.append(f"{'fix:':>12} {f.fix}")
    lines.append(verdict(findings))
    return "\n".join(lines)


def verdict(findings: list[Finding]) -> str:
    gaps = sum(f.level == GAP for f in findings)
    warnings = sum(f.level == WARNING for f in findings)
    if gaps:
        return (f"not ready: {gaps} gap{'s' * (gaps != 1)} to fix, {warnings} "
                f"warning{'s' * (warnings != 1)} (exit 2)")
    return f"ready for ninelives run: no gap, {warnings} warning{'s' * (warnings != 1)}"


def exit_code(findings: list[Finding]) -> int:
    """0 when no finding is a gap; 2 otherwise (never 1: doctor judges no invariant)."""
    return 2 if any(f.level == GAP for f in findings) else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="is an adapter ready? every gap at once, with its fix")
    p.add_argument("--engine", default="reference", help="reference, or module:object")
    p.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine setting for the run (a TOML value; repeat for more)")
    p.add_argument("--jobs", type=int, default=JOBS, help=f"jobs to submit (default {JOBS})")
    p.add_argument("--timeout", type=float, default=TIMEOUT,
                   help=f"seconds to wait for them (default {TIMEOUT:.0f})")
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="keep the store and the process logs in DIR")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd_doctor(args: Any) -> int:
    from chaos.spec.scenario import parse_engine_set
    if args.jobs < 1 or not args.timeout > 0:
        raise ValueError("--jobs must be at least 1 and --timeout above 0")
    doctor = Doctor(args.engine, parse_engine_set(args.engine_set), args.jobs, args.timeout,
                    progress=not (args.quiet or args.json))
    findings = doctor.examine(args.keep)
    code = exit_code(findings)
    if args.json:
        print(json.dumps({"engine": args.engine, "ready": code == 0, "exit_code": code,
                          "verdict": verdict(findings),
                          "findings": [f.to_json() for f in findings]}, indent=2))
    else:
        print(render(args.engine, findings))
    return code
