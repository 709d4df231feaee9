"""Scenarios: what a chaos run does, as TOML data validated when loaded.

A scenario file has four tables, each optional but `name`:

    name = "kill-storm"
    description = "..."
    [run]     jobs, workers, senders, chaos, heal, drain, needs_review
    [engine]  any engine setting for the workers and senders (lease, heartbeat, ...)
    [faults]  rates (per second of the chaos phase) and shares (of calls or of jobs)
    [expect]  allowances the invariants use when a scenario breaks their assumptions

Profiles (`scenarios/profiles.toml`) scale job count, duration and fault rates. Counts,
durations and rates are bounded as written and as scaled (`chaos.spec.limits`: at most 100,000
jobs, 256 workers or senders, a day of any duration, 100 faults per second of a rate, 100,000
fault events in all), and a file is read only if it is a regular one of at most 1 MiB of
UTF-8. Errors name the file, the field and the reason. `faults.crash_points` names points by
the engine's own names or by role, optional with a trailing `?` (`chaos.engines.crashpoints`); a name
the engine does not declare is refused when the scenario is loaded for it.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from chaos.engines import crashpoints
from chaos.spec.aim import Aim, read_aims, resolve as resolve_aims
from chaos.spec.latency import LatencyError, parse_latency
from chaos.spec.limits import (MAX_FAULT_EVENTS, MAX_JOBS, MAX_RATE, MAX_SECONDS, MAX_WORKERS,
                               excerpt, shown)
from chaos.run.runfiles import is_secret
from chaos.spec.scenario_file import ScenarioError, engine_table, finite, read_table, read_toml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO_DIR = os.path.join(ROOT, "scenarios")


#: What a scenario's name may be: it names the run's folder under --out.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True)
class Run:
    jobs: int = 20              # documents submitted, each a job through every step
    workers: int = 2            # worker processes (a killed one is started again)
    senders: int = 1            # outbox sender processes
    chaos: float = 5.0          # seconds of faults
    heal: float = 0.5           # quiet seconds after the faults stop
    drain: float = 60.0         # liveness deadline: everything settles within this
    needs_review: float = 0.0   # share of documents the model flags (they park in needs_human)


@dataclass(frozen=True)
class Faults:
    # processes
    kill: float = 0.0                     # SIGKILLs per second, of a random worker or sender
    kill_senders: bool = True             # kills may strike senders too, not only workers
    crash_points: tuple[str, ...] = ()    # points armed in spawned processes ("*": all,
                                          # "role:after_call" by role, "name?" optional:
                                          # see chaos.engines.crashpoints)
    crash_point_probability: float = 0.0  # chance per hit of an armed point
    pause: float = 0.0                    # SIGSTOP/SIGCONT per second, of a random worker
    pause_seconds: float = 3.0            # how long a paused process stays stopped
    pause_senders: bool = False           # ... or sender (its outbox lease runs out paused)
    lease_expiry: float = 0.0             # expiries of every in-flight lease, per second
    skewed_workers: int = 0               # workers started with a skewed clock
    skew_seconds: float = 5.0             # seconds a skewed worker's clock is ahead
    heartbeat_off_workers: int = 0        # workers with heartbeat off (call_timeout < lease)
    # the model provider, as shares of calls
    slow: float = 0.0                     # answered, but slow_seconds late
    slow_seconds: float = 2.0             # how late a slow answer comes
    provider_429: float = 0.0             # refused: 429 Too Many Requests
    retry_after: float = 0.5              # seconds in Retry-After on half of the 429s
                                          # (half of those as an HTTP date: plan.provider_form)
    provider_5xx: float = 0.0             # refused: 500 or 503
    hang: float = 0.0                     # past the client timeout, still billed (half
                                          # trickle a byte every 0.2 s: plan.provider_form)
    hang_seconds: float = 2.0             # how long a hung call holds the connection
    reset: float = 0.0                    # the connection reset before any answer
    outages: tuple[tuple[float, float], ...] = ()  # [start, end] seconds into the chaos phase
    latency: str = ""                     # every call's latency: fixed:S, uniform:A:B, ...
    # jobs, as shares of the submitted documents
    poison: float = 0.0                   # 400, malformed content, schema-invalid output
    unavailable: float = 0.0              # 503 on every call of one step: parked at the cap
    crash_loop: float = 0.0               # documents that kill their worker every time
    duplicate_same: float = 0.0           # submitted again with the same content
    duplicate_different: float = 0.0      # submitted again under the same id, other content
    # the receiver, as shares of requests
    receiver_5xx: float = 0.0             # refused with 500/503, not applied
    receiver_timeout: float = 0.0         # answered past the sender's timeout, applied
    receiver_drop: float = 0.0            # applied, then the connection drops
    receiver_lost: float = 0.0            # held past the sender's timeout, never applied
    # documents whose first effect the receiver refuses for good, every time (a payment
    # declined: 402), which the sender must dead-letter, not retry
    declined: float = 0.0
    # the database and the operator
    contention: float = 0.0               # write-lock holds per second
    contention_seconds: float = 0.5       # how long each hold keeps the write lock
    contention_seconds_max: float = 0.0   # above contention_seconds: each hold's length is
                                          # drawn from [contention_seconds, this]
    operator: float = 0.0                 # operator actions per second (cancel, requeue, resolve)
    # the database server's own faults (--backend postgres, on a server the run starts)
    server_restart: float = 0.0           # crashes per second (pg_ctl stop -m immediate)
    server_down_seconds: float = 0.5      # seconds from each crash to its restart
    connection_kill: float = 0.0          # per second: one engine process's connection ended
                                          # by the server (pg_terminate_backend)
    statement_timeout: float = 0.0        # per second: a lock held so that the engine's
                                          # statements waiting on it are cancelled by the
                                          # server (SQLSTATE 57014)
    statement_timeout_seconds: float = 0.2  # how long a statement runs before the cancel
    # --backend postgres, on any server: one job's row held locked (SELECT ... FOR UPDATE)
    row_lock: float = 0.0                 # holds per second, of a job a worker holds (or any)
    row_lock_seconds: float = 1.0         # how long another transaction holds the row
    power_loss: float = 0.0               # power cuts per second, evenly spread (FUSE; on
                                          # PostgreSQL a server the run starts): every engine
                                          # process and the store's server killed at once, the
                                          # writes no fsync covered dropped (chaos.powerloss)
    power_loss_mode: str = "mixed"        # all, torn-seq, torn-op, or mixed (cut by cut)


@dataclass(frozen=True)
class Expect:
    duplicate_spend_allowance: float = 0.0  # dollars of duplicate calls lease-exclusive
                                            # forgives (a lease shorter than a call's length
                                            # may pay twice by design: see the lease sweep)


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (after its profile was applied)."""

    name: str
    path: str
    description: str = ""
    profile: str = "ci"
    run: Run = field(default_factory=Run)
    engine: dict[str, Any] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    expect: Expect = field(default_factory=Expect)
    #: engine settings given on the command line over the file's [engine] table (already
    #: in `engine`), kept apart so that a rerun and a replay give them again
    engine_set: dict[str, Any] = field(default_factory=dict)
    #: faults aimed at the engine's own points (`[[aim]]`, chaos.spec.aim)
    aims: tuple[Aim, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "description": self.description,
                "profile": self.profile, "run": dataclasses.asdict(self.run),
                "engine": dict(self.engine), "faults": dataclasses.asdict(self.faults),
                "expect": dataclasses.asdict(self.expect),
                "engine_set": dict(self.engine_set),
                **({"aim": [a.to_json() for a in self.aims]} if self.aims else {})}


SHARES = ("slow", "provider_429", "provider_5xx", "hang", "reset", "poison", "unavailable",
          "crash_loop",
          "duplicate_same", "duplicate_different", "receiver_5xx", "receiver_timeout",
          "receiver_drop", "receiver_lost", "declined", "crash_point_probability")
RATES = ("kill", "pause", "lease_expiry", "contention", "operator", "server_restart",
         "connection_kill", "statement_timeout", "row_lock", "power_loss")
#: How a power cut drops the unsynced writes (chaos.powerloss.journal), or "mixed": cut by cut.
POWER_LOSS_MODES = ("mixed", "all", "torn-seq", "torn-op")
#: The faults of a PostgreSQL server the run started itself (chaos.run.backends).
SERVER_FAULTS = ("server_restart", "connection_kill", "statement_timeout")
#: The faults only a PostgreSQL store can undergo (the server's, and a row's lock: SQLite
#: locks the whole database), in the order the plan draws them, after every other fault (a
#: new one goes last: the others keep their draws); each with what it does, for a refusal.
POSTGRES_FAULTS = {"server_restart": "crashes a real PostgreSQL server",
                   "connection_kill": "ends connections on a real PostgreSQL server",
                   "statement_timeout": "cancels statements on a real PostgreSQL server",
                   "row_lock": "holds a row lock on a real PostgreSQL server"}


def resolve_path(name: str) -> str:
    """A scenario file path from a path or a bare name (`smoke` -> scenarios/smoke.toml)."""
    if os.path.exists(name):
        return name
    candidate = os.path.join(SCENARIO_DIR, name if name.endswith(".toml") else f"{name}.toml")
    if os.path.exists(candidate):
        return candidate
    known = sorted(f[:-5] for f in os.listdir(SCENARIO_DIR)
                   if f.endswith(".toml") and f != "profiles.toml")
    raise ScenarioError(f"no scenario {name!r} (a file path, or one of: {', '.join(known)})")


def load_scenario(name: str, profile: str | None = None, engine: Any = None,
                  engine_set: dict[str, Any] | None = None) -> Scenario:
    """Load, validate and scale a scenario for `engine` (an adapter; the reference when
    None), with `engine_set` (see `parse_engine_set`) over its [engine] table. Raises
    ScenarioError naming file and field (or the --engine-set setting)."""
    path = resolve_path(name)
    data = read_toml(path)
    where = shown(path)
    unknown = set(data) - {"name", "description", "run", "engine", "faults", "expect", "aim"}
    if unknown:
        raise ScenarioError(f"{where}: unknown field {sorted(unknown)[0]!r} (known: name, "
                            "description, run, engine, faults, expect, aim)")
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ScenarioError(f"{where}: field 'name' is required and must be a string")
    if not SAFE_NAME.fullmatch(data["name"]):
        # The name becomes a folder under --out: a path in it would write outside
        raise ScenarioError(f"{where}: field 'name' must be a short slug (letters, digits, "
                            f"'.', '_', '-'; at most 100; no path), got {excerpt(data['name'])}")
    run = read_table(where, "run", Run, data.get("run", {}))
    faults = read_table(where, "faults", Faults, data.get("faults", {}))
    expect = read_table(where, "expect", Expect, data.get("expect", {}))
    table = engine_table(where, data.get("engine", {}))
    overrides = engine_table("--engine-set", dict(engine_set or {}))
    try:
        aims = read_aims(data.get("aim", []))
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    scenario = Scenario(name=data["name"], path=path, description=data.get("description", ""),
                        run=run, engine={**table, **overrides}, faults=faults, expect=expect,
                        engine_set=overrides, aims=aims)
    _check(where, scenario)
    scenario = apply_profile(scenario, profile or "ci")
    check_for_engine(scenario, engine)
    return scenario


def parse_engine_set(items: list[str] | None) -> dict[str, Any]:
    """`--engine-set NAME=VALUE` arguments as a table: VALUE is read as a TOML value (4,
    0.5, true, "text"), a bare word that is not one as a string. Raises ScenarioError naming
    the argument. Whether the engine has the setting, and accepts the value, is checked
    with the scenario (`check_for_engine`), as for the file's [engine] table."""
    table: dict[str, Any] = {}
    for item in items or ():
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ScenarioError(f"--engine-set {item!r}: expected NAME=VALUE, e.g. slots=4")
        try:
            value = tomllib.loads(f"value = {raw.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word: a string setting
        table[name] = value
    return table


def engine_set_args(engine_set: dict[str, Any]) -> list[str]:
    """The `--engine-set` arguments that give `engine_set` again (parse_engine_set's
    inverse): what a rerun command shows. A secret setting (chaos.run.runfiles.is_secret) is
    left out: it is never written down, so it must be given again by hand."""
    def toml(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (int, float)):
            return repr(value)
        try:
            tomllib.loads(f"value = {value}")
        except tomllib.TOMLDecodeError:
            return str(value)
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return [arg for name, value in engine_set.items() if not is_secret(str(name))
            for arg in ("--engine-set", f"{name}={toml(value)}")]


def check_numbers(scenario: Scenario) -> Scenario:
    """`scenario` if every number of its [run] and [faults] is finite, for a scenario that
    did not come through `load_scenario` (a saved schedule's JSON may hold NaN, which would
    hang the planner). Raises ScenarioError naming the field."""
    where = shown(scenario.path) if scenario.path else scenario.name
    for name, table in (("run", scenario.run), ("faults", scenario.faults)):
        for f in fields(table):
            value = getattr(table, f.name)
            windows = value if f.name == "outages" else ((value,),) if f.type == "float" else ()
            if not all(finite(x) for window in windows for x in window):
                raise ScenarioError(f"{where}: field '{name}.{f.name}' must be a finite "
                                    f"number, got {value!r}")
    return scenario


def check_saved(scenario: Scenario, where: str) -> Scenario:
    """`scenario` if it would have passed `load_scenario`'s checks of its name, numbers and
    bounds, for one read back from JSON (a saved schedule, a run's report.json): such a file
    may come from someone else, and its name becomes a folder under --out and its counts the
    work planned. Raises ScenarioError naming `where` and the field."""
    if not isinstance(scenario.name, str) or not SAFE_NAME.fullmatch(scenario.name):
        # The name becomes a folder under --out: a path in it would write outside
        raise ScenarioError(f"{where}: field 'scenario.name' must be a short slug (letters, "
                            f"digits, '.', '_', '-'; at most 100; no path), got "
                            f"{excerpt(str(scenario.name))}")
    check_numbers(scenario)
    _check(where, scenario)
    _check_bounds(where, scenario.run, scenario.faults)
    return scenario


def check_for_engine(scenario: Scenario, engine: Any = None) -> Any:
    """The scenario's [engine] table as `engine` reads it (its EngineSettings). Raises
    ScenarioError naming the file and the field: an [engine] setting the engine refuses, or
    a crash point it does not declare (see `check_crash_points`)."""
    from chaos.contract import load_engine
    engine = engine if engine is not None else load_engine("reference")
    where = shown(scenario.path)
    try:
        settings = engine.settings(scenario.engine)
    except ValueError as exc:
        given = [f"{k}={v!r}" for k, v in scenario.engine_set.items()
                 if not is_secret(str(k))]
        raise ScenarioError(f"{where}: [engine] {exc}" + (
            f" (with --engine-set {', '.join(given)})" if given else "")) from None
    check_crash_points(scenario, engine)
    check_aims(scenario, engine)
    return settings


def check_aims(scenario: Scenario, engine: Any) -> None:
    """Raise ScenarioError naming the file, the aim's field and the engine's points and
    roles when an aim names a point (or a rendezvous point) the engine does not declare and
    does not mark optional (as `check_crash_points` for crash points)."""
    where = shown(scenario.path) if scenario.path else scenario.name
    for target in resolve_aims(scenario.aims, engine):
        if target.missing:
            raise ScenarioError(
                f"{where}: field 'aim[{target.index}].point' (or its until) names points the "
                f"engine does not declare: {target.missing}. "
                f"{crashpoints.describe(engine).capitalize()}. Mark one optional with a "
                f"trailing '?' where only some engines have it")


def check_crash_points(scenario: Scenario, engine: Any) -> crashpoints.Resolution:
    """What the scenario's `faults.crash_points` arm on `engine` (`chaos.engines.crashpoints`).
    Raises ScenarioError naming the file, the field, every name the engine does not declare
    (neither a point of its own nor a role it maps) that is not marked optional, and the
    engine's points and roles."""
    where = shown(scenario.path) if scenario.path else scenario.name
    try:
        resolution = crashpoints.resolve(scenario.faults.crash_points, engine)
    except ValueError as exc:
        raise ScenarioError(f"{where}: field 'faults.crash_points': {exc}") from None
    if resolution.missing:
        lacking = "; ".join(f"{text!r}: {why}" for text, why in resolution.missing.items())
        raise ScenarioError(
            f"{where}: field 'faults.crash_points' names crash points the engine does not "
            f"declare: {lacking}. {crashpoints.describe(engine).capitalize()}. Name a point "
            f"by role (role:NAME) where engines differ, or mark one optional with a "
            f"trailing '?' where only some engines have it")
    return resolution


def crash_points_for(scenario: Scenario, engine: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the engine's points the scenario arms, "*" for all; the scenario's optional names
    the engine lacks, not applicable to it). Raises ScenarioError as `check_crash_points`."""
    resolution = check_crash_points(scenario, engine)
    return resolution.armed, tuple(resolution.absent)


def _check(where: str, s: Scenario) -> None:
    r, f = s.run, s.faults
    for name in ("jobs", "workers"):
        if getattr(r, name) < 1:
            raise ScenarioError(f"{where}: field 'run.{name}' must be >= 1")
    for name in ("senders", "chaos", "heal"):
        if getattr(r, name) < 0:
            raise ScenarioError(f"{where}: field 'run.{name}' must be >= 0, "
                                f"got {getattr(r, name)}")
    if r.drain <= 0:
        raise ScenarioError(f"{where}: field 'run.drain' must be > 0, got {r.drain}")
    for name in SHARES:
        if not 0.0 <= getattr(f, name) <= 1.0:
            raise ScenarioError(f"{where}: field 'faults.{name}' is a share and must be in "
                                f"[0, 1], got {getattr(f, name)}")
    if not 0.0 <= r.needs_review <= 1.0:
        raise ScenarioError(f"{where}: field 'run.needs_review' must be in [0, 1]")
    for name in RATES:
        if getattr(f, name) < 0:
            raise ScenarioError(f"{where}: field 'faults.{name}' is a rate and must be >= 0, "
                                f"got {getattr(f, name)}")
    for name in ("pause_seconds", "skew_seconds", "slow_seconds", "retry_after", "hang_seconds",
                 "contention_seconds", "server_down_seconds", "contention_seconds_max", "skewed_workers",
                 "heartbeat_off_workers", "statement_timeout_seconds", "row_lock_seconds"):
        if getattr(f, name) < 0:
            raise ScenarioError(f"{where}: field 'faults.{name}' must be >= 0, "
                                f"got {getattr(f, name)}")
    if f.statement_timeout and f.statement_timeout_seconds <= 0:
        raise ScenarioError(f"{where}: field 'faults.statement_timeout_seconds' must be > 0 "
                            "with faults.statement_timeout set (0 is no timeout at all)")
    if f.contention_seconds_max and f.contention_seconds_max < f.contention_seconds:
        raise ScenarioError(f"{where}: field 'faults.contention_seconds_max' "
                            f"({f.contention_seconds_max}) is below faults.contention_seconds "
                            f"({f.contention_seconds})")
    timed = [name for name in RATES + ("duplicate_same", "duplicate_different")
             if getattr(f, name)] + (["outages"] if f.outages else [])
    if timed and r.chaos == 0:
        raise ScenarioError(f"{where}: faults.{timed[0]} happens during the chaos phase, but "
                            "run.chaos is 0")
    if f.poison + f.crash_loop + r.needs_review > 0.5:
        raise ScenarioError(f"{where}: faults.poison + faults.crash_loop + run.needs_review "
                            "exceed half the jobs: too few would be delivered to check much")
    if f.latency:
        try:
            parse_latency(f.latency)
        except LatencyError as exc:
            raise ScenarioError(f"{where}: field 'faults.latency': {exc}") from None
    for text in f.crash_points:
        try:
            crashpoints.parse(text)
        except ValueError as exc:
            raise ScenarioError(f"{where}: field 'faults.crash_points': {exc}") from None
    if f.crash_points and f.crash_point_probability == 0:
        raise ScenarioError(f"{where}: faults.crash_points is set but "
                            "faults.crash_point_probability is 0: no point would fire")
    for start, end in f.outages:
        if not 0 <= start < end <= r.chaos:
            raise ScenarioError(f"{where}: field 'faults.outages' window [{start}, {end}] must "
                                f"lie inside the chaos phase [0, {r.chaos}]")
    if f.power_loss_mode not in POWER_LOSS_MODES:
        raise ScenarioError(f"{where}: field 'faults.power_loss_mode' must be one of "
                            f"{', '.join(POWER_LOSS_MODES)}, got {f.power_loss_mode[:60]!r}")
    if f.heartbeat_off_workers > r.workers:
        raise ScenarioError(f"{where}: faults.heartbeat_off_workers ({f.heartbeat_off_workers})"
                            f" exceeds run.workers ({r.workers})")
    if f.skewed_workers > r.workers:
        raise ScenarioError(f"{where}: faults.skewed_workers ({f.skewed_workers}) exceeds "
                            f"run.workers ({r.workers})")
    if f.kill and not r.workers + (r.senders if f.kill_senders else 0):
        raise ScenarioError(f"{where}: faults.kill is set but there is nothing to kill")
    _check_bounds(where, r, f)


def _check_bounds(where: str, r: Run, f: Faults, profile: str | None = None) -> None:
    """Raise ScenarioError naming the first count, duration or rate of `r` and `f` past its
    bound in chaos.spec.limits, or the fault events all rates plan over the chaos phase, and
    `profile` when it scaled them: a run past them would sit silent for hours."""
    scaled = f" (scaled by profile {profile!r})" if profile else ""
    durations = [f"run.{n}" for n in ("chaos", "heal", "drain")] + [
        f"faults.{x.name}" for x in fields(Faults)
        if x.type == "float" and x.name not in SHARES + RATES]
    bounds = [("run.jobs", MAX_JOBS, ""), ("run.workers", MAX_WORKERS, ""),
              ("run.senders", MAX_WORKERS, ""),
              *((name, MAX_SECONDS, " seconds (a day)") for name in durations),
              *((f"faults.{n}", MAX_RATE, " per second") for n in RATES)]
    for name, most, unit in bounds:
        table, key = name.split(".")
        value = getattr(r if table == "run" else f, key)
        if value > most:
            raise ScenarioError(f"{where}: field '{name}' must be at most {most:,g}{unit}, "
                                f"got {value!r}{scaled}")
    events = sum(getattr(f, n) for n in RATES) * r.chaos
    if events > MAX_FAULT_EVENTS:
        rates = ", ".join(f"faults.{n}" for n in RATES if getattr(f, n))
        raise ScenarioError(f"{where}: the fault rates ({rates}) over run.chaos "
                            f"({r.chaos:g} s) plan {events:,.0f} fault events, more than "
                            f"{MAX_FAULT_EVENTS:,}{scaled}")


def load_profiles() -> dict[str, dict[str, float]]:
    """The profiles, each a table of scale factors (jobs, duration, rates: finite numbers
    >= 0) and a description. Raises ScenarioError naming the field."""
    path = os.path.join(SCENARIO_DIR, "profiles.toml")
    where = shown(path)
    data = read_toml(path)
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ScenarioError(f"{where}: [{name}] must be a table")
        unknown = set(table) - {"jobs", "duration", "rates", "description"}
        if unknown:
            raise ScenarioError(f"{where}: unknown field "
                                f"'{name}.{sorted(unknown)[0]}' (known: jobs, duration, rates)")
        for factor in ("jobs", "duration", "rates"):
            if factor in table and not (finite(table[factor]) and table[factor] >= 0):
                raise ScenarioError(f"{where}: field '{name}.{factor}' must be a finite "
                                    f"number >= 0, got {table[factor]!r}")
    return data


def apply_profile(s: Scenario, profile: str) -> Scenario:
    """Scale job count, chaos duration (and outage windows) and fault rates by the profile."""
    profiles = load_profiles()
    if profile not in profiles:
        raise ScenarioError(f"unknown profile {profile!r} (known in "
                            f"{shown(os.path.join(SCENARIO_DIR, 'profiles.toml'))}: "
                            f"{', '.join(sorted(profiles))})")
    p = profiles[profile]
    jobs, duration, rates = p.get("jobs", 1.0), p.get("duration", 1.0), p.get("rates", 1.0)
    run = dataclasses.replace(s.run, jobs=max(1, round(s.run.jobs * jobs)),
                              chaos=s.run.chaos * duration)
    scaled = {name: getattr(s.faults, name) * rates for name in RATES}
    faults = dataclasses.replace(
        s.faults, **scaled,
        outages=tuple((a * duration, b * duration) for a, b in s.faults.outages))
    _check_bounds(shown(s.path), run, faults, profile)
    return dataclasses.replace(s, profile=profile, run=run, faults=faults)
