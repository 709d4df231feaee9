"""The contract between the harness and an engine: what an adapter provides, by role.

The harness knows an engine only through an adapter: an object with a name, a pipeline
(`chaos.pipeline.Pipeline`), the capabilities it declares, and three roles.

processes  `command(role, ctx) -> Command`: the argv and environment that start one
           process of `role` ("worker" or "sender") from harness-neutral settings (a
           `ProcessContext`). Secrets go in the environment, never argv.
           `settings(table) -> EngineSettings`: the scenario's `[engine]` table read in the
           engine's own terms, raising ValueError that names the field at fault.
observer   `install(db)` into a fresh store; `operations(db)` the history's engine
           operations (see `chaos.history`) committed so far; `progress(db)` states and
           unsent effects now; `snapshot(db)` the final rows in the neutral form below.
controls   `submit(db, job, payload)` -> "created" | "exists" | "rejected" (a `submit`
           with a parameter named `settings` is also given the scenario's `[engine]` table
           as written, the one `settings(table)` read: for an engine that fixes a job's
           retries or delays when it is enqueued; see `submitter`);
           and, each only with its capability: `operator(db, action, job)` -> "done" or
           "refused: why"; `expire_leases(db)` -> how many; `hold_write_lock(db)` a context
           manager holding the store's write lock; `integrity(db)` -> "ok" or the problems.

Optional: `secret_settings`, names of settings whose values are secrets besides those whose
names say key, token, secret or password (`chaos.run.runfiles.is_secret`): the harness redacts
them in every record it writes, and the adapter passes them to processes by environment;
`pid_of(worker_id) -> int | None`, the process id inside the engine's own worker
ids, so that calls and effects in the fakes' ledgers (which name only the worker id) are
tied to their processes; `worker_of(spawn) -> str | None`, for an engine whose requests
name no worker: the worker id that the process the harness started (its spawn record:
name, role, slot, pid) writes under, so that a request the fakes tied to its process
(by its socket) is tied to the worker too; and `write_points`, the probe points after which a process writes to the job it names
(with crash_points), for an engine whose rows do not say who wrote: the harness traces every
point and attributes such writes itself (`chaos.engines.writers`); `store_settings(db) -> dict`, the
`EngineSettings` fields whose values depend on the store at `db` (an engine with several
backends: whose clock places leases, `lease_clock`; which claim order it keeps there);
`point_roles`, with crash_points: role -> the engine's points that play it, for the roles
of `chaos.engines.crashpoints.ROLES` the engine has (a scenario names `role:after_call`; a role
the adapter leaves out is one the engine lacks); `durability(settings) -> (promised,
setting)`: whether, with the scenario's `[engine]` table `settings`, every transaction the
engine acknowledges survives a power cut (the data fsynced before the acknowledgement), and
a short text naming the setting that decides it ("synchronous=FULL, journal_mode=WAL"):
the `durable-commits` check fails on a lost acknowledged transaction only where it is
promised, and otherwise reports what the cuts lost (chaos.powerloss).

With in_process: `in_process`, the hooks `ninelives sim` runs the engine's own loops through
(`chaos.sim.threads`), and `submit`, `operator` and `expire_leases` taking `now=` (the time to
write); or `simulate(spec, choices, keep_db=None)`, an adapter's own whole simulation.

Fencing tokens (`fencing`): the `token` of a claim identifies that holding, and every write
made under it carries it. `EngineSettings.token_order` says whether the values are ordered
too ("ordered": a newer claim carries a greater token, a counter) or only identify
("opaque": a random handle, such as a queue's receipt handle): the checkers then compare
tokens for equality alone, and take the newer holding from the order the claims committed.
`EngineSettings.cap_counts` says what `max_claims` counts: crashes in a row ("separate",
beside `max_attempts`) or every claim of a step ("claims": one counter for retries and
crashes, as a queue's receive count is).

The snapshot: {"jobs": {id: row}, "memos": [row], "outbox": [row], "spend": [row] or None
(without spend_records), "orphans": {name: count}}; each table's fields are in
`chaos.engines.schema.SNAPSHOT` (docs/history.md), and a snapshot is checked against it as it is read.
`operations(db)` is checked against `chaos.engines.schema.SCHEMA` the same way. A field an engine does
not keep is None.

`load_engine(spec)` loads `module:object` and validates the whole adapter at once, naming
every missing piece; `CAPABILITIES` says what each capability promises and enables.
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ContextManager, Protocol

# AdapterError: re-exported for adapters
from chaos.engines.adapter_guard import AdapterError, guard, raise_adapter_error
from chaos.engines.crashpoints import role_gaps
from chaos.history import Event
from chaos.pipeline import Pipeline

CONTRACT_VERSION = 1
ROLES = ("worker", "sender")
#: what `--engine reference` loads
REFERENCE_SPEC = "chaos.reference:REFERENCE"

#: capability -> (what the engine promises, the invariants and faults it enables).
CAPABILITIES: dict[str, tuple[str, str]] = {
    "fencing": ("each claim carries a fencing token (`token` on claimed operations)",
                "token-level witnesses in fenced-writes and lease-exclusive"),
    "spend_records": ("the engine records every billed provider call, committed or not "
                      "(`billed` operations)", "cost-accounted, waste by cause"),
    "crash_points": ("the engine's processes arm the probe (`chaos.probe`) from the "
                     "NINELIVES_CRASH_* environment", "crash-point faults, crash-loop payloads"),
    "outbox": ("effects leave through an outbox the observer reports (effect_queued, "
               "effect_sent)", "outbox-bounded, effects-complete"),
    "operator": ("controls.operator cancels, requeues and resolves jobs, answering done or "
                 "refused", "operator faults; operator-moves; parked states are left only by "
                 "an operator"),
    "heartbeat": ("a worker extends its lease while a step runs",
                  "lease-kept; lease-exclusive expects no overlap with heartbeat on"),
    "lease_expiry": ("controls.expire_leases forces every in-flight lease to expire",
                     "the lease_expiry fault"),
    "write_lock": ("controls.hold_write_lock holds the store's write lock",
                   "the contention fault"),
    "integrity": ("controls.integrity checks the store after every kill", "db-intact"),
    "crash_loop_cap": ("claims per step are bounded by settings.max_claims and a crash-looping "
                       "job is parked (cause \"crash_loop\")", "bounded-work"),
    "attempt_cap": ("failed attempts per step are bounded by settings.max_attempts",
                    "retry-discipline's caps"),
    "backoff": ("settings.backoff_bounds gives each retry's wait bounds",
                "retry-discipline's backoff and jitter checks"),
    "clock_skew": ("a worker can be started with a skewed clock (ProcessContext.clock_skew)",
                   "the skew fault"),
    "in_process": ("the engine's loops run as scheduled threads: through `in_process` hooks "
                   "(chaos.sim.threads), or an adapter's own `simulate(spec, choices, "
                   "keep_db=None)` returning its SimResult", "ninelives sim"),
}

#: what a capability requires the adapter to have; a tuple names alternatives (one suffices).
NEEDS: dict[str, tuple[str | tuple[str, ...], ...]] = {
    "operator": ("operator",), "lease_expiry": ("expire_leases",),
    "write_lock": ("hold_write_lock",), "integrity": ("integrity",),
    "crash_points": ("crashpoints", "crash_loop_point"),
    "in_process": (("in_process", "simulate"),),
}
REQUIRED = ("name", "pipeline", "capabilities", "command", "settings", "install",
            "operations", "progress", "snapshot", "submit")


#: The numeric settings: (int or float, the lowest value, whether that value is excluded,
#: whether None is allowed: the engine has no such setting).
_NUMBERS: dict[str, tuple[type, float, bool, bool]] = {
    "lease": (float, 0, True, True), "heartbeat_interval": (float, 0, True, True),
    "call_timeout": (float, 0, True, True), "outbox_lease": (float, 0, True, True),
    "send_timeout": (float, 0, True, True), "claim_latency": (float, 0, False, True),
    "finish_retry_slack": (float, 0, False, True), "max_attempts": (int, 1, False, True),
    "max_claims": (int, 1, False, True), "outbox_max_attempts": (int, 1, False, True),
    "slots": (int, 1, False, False),
}
#: The settings that are True or False.
_FLAGS = ("heartbeat", "keep_job", "id_per_slot", "lease_from_write")


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings in the harness's terms; None where the engine has no such
    setting. `backoff_bounds[i]` is the (lowest, highest) wait after failed attempt i + 1."""

    lease: float | None = None
    heartbeat: bool = False
    heartbeat_interval: float | None = None
    call_timeout: float | None = None
    max_attempts: int | None = None
    max_claims: int | None = None
    backoff_bounds: tuple[tuple[float, float], ...] = ()
    outbox_max_attempts: int | None = None
    #: like backoff_bounds, for the sender: the wait after failed send attempt i + 1
    outbox_backoff_bounds: tuple[tuple[float, float], ...] = ()
    outbox_lease: float | None = None
    send_timeout: float | None = None
    keep_job: bool = False
    slots: int = 1
    #: each job slot writes under a worker id of its own, so a worker id works one job at a
    #: time (lease-abandoned then judges each id as well as each process); False: the ids
    #: say nothing of slots (one id for the whole process, say)
    id_per_slot: bool = False
    #: "due": a claim takes the job that fell due first (claims-prompt checks it exactly);
    #: "due-unless-locked": first among those no other transaction holds locked (a claim
    #: that skips locked rows, `FOR UPDATE SKIP LOCKED`); None: no order is promised
    claim_order: str | None = None
    #: seconds a free worker takes at most to claim a due job: its longest poll, plus the
    #: claim (claims-prompt adds the machine's scheduling slack)
    claim_latency: float | None = None
    #: seconds before its lease ends at most that a finishing write, kept from the database
    #: by its write lock, gives up on a result it paid for (cost-accounted's
    #: "result-discarded"); None: the engine makes no such promise
    finish_retry_slack: float | None = None
    #: a lease (a claim's, a renewal's) runs a whole lease from when it is written, however
    #: long the writer waited for the write lock (lease-kept checks it to the machine's
    #: slack); False: only at least half a lease is expected
    lease_from_write: bool = False
    #: whose clock places a lease: "worker" (the `now` each worker writes with: a worker on
    #: a skewed clock can take a live lease or keep an expired one) or "store" (the
    #: database's own clock: a skewed worker cannot); see the adapter's `store_settings(db)`
    lease_clock: str = "worker"
    #: what a fencing token's value says: "ordered" (a later claim carries a greater token,
    #: as a counter bumped on every claim does) or "opaque" (a random handle: equal tokens
    #: are one holding, and no order follows from the values; which holding is newer is
    #: then the order in which the claims that carried them committed)
    token_order: str = "ordered"
    #: what max_claims counts: "separate" (claims of a step in a row that ended without a
    #: write, the crashes, while max_attempts counts failed attempts apart) or "claims"
    #: (every claim of a step, whatever ended the ones before: one counter, like a queue's
    #: receive count, bounds retries and crashes together; see docs/engines.md)
    cap_counts: str = "separate"

    def __post_init__(self) -> None:
        if self.lease_clock not in ("worker", "store"):
            raise ValueError(f"engine setting lease_clock must be 'worker' or 'store', "
                             f"got {self.lease_clock!r}")
        if self.token_order not in ("ordered", "opaque"):
            raise ValueError(f"engine setting token_order must be 'ordered' or 'opaque', "
                             f"got {self.token_order!r}")
        if self.claim_order not in (None, "due", "due-unless-locked"):
            raise ValueError(f"engine setting claim_order must be 'due', 'due-unless-locked' "
                             f"or None, got {self.claim_order!r}")
        if self.cap_counts not in ("separate", "claims"):
            raise ValueError(f"engine setting cap_counts must be 'separate' or 'claims', "
                             f"got {self.cap_counts!r}")
        if self.cap_counts == "claims" and self.max_claims is None:
            raise ValueError("engine setting cap_counts='claims' needs max_claims, the one "
                             "counter's cap")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"engine setting {f.name} must be a finite number, got {value}")
        self._check_values()

    def _check_values(self) -> None:
        """Each number, flag and list of wait bounds is of its kind and within its range: a
        lease of "2" or -1, or a cap of 0, would make the checks misjudge every run."""
        for name, (kind, lowest, strict, optional) in _NUMBERS.items():
            value = getattr(self, name)
            if value is None and optional:
                continue
            number = isinstance(value, int) if kind is int else isinstance(value, (int, float))
            if isinstance(value, bool) or not number or value < lowest or (
                    strict and value == lowest):
                what = "a whole number" if kind is int else "a number of seconds"
                bound = f"above {lowest:g}" if strict else f"of at least {lowest:g}"
                raise ValueError(f"engine setting {name} must be {what} {bound}"
                                 f"{' or None' if optional else ''}, got {value!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"engine setting {name} must be True or False, "
                                 f"got {getattr(self, name)!r}")
        for name in ("backoff_bounds", "outbox_backoff_bounds"):
            bounds = getattr(self, name)
            if not isinstance(bounds, (tuple, list)):
                raise ValueError(f"engine setting {name} must be a sequence of (lowest, "
                                 f"highest) waits, got {bounds!r}")
            for i, pair in enumerate(bounds):
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
                        isinstance(w, (int, float)) and not isinstance(w, bool)
                        and math.isfinite(w) for w in pair) and 0 <= pair[0] <= pair[1]):
                    raise ValueError(f"engine setting {name}[{i}] must be a (lowest, highest) "
                                     f"pair of waits in seconds, 0 <= lowest <= highest, "
                                     f"got {pair!r}")
            # kept as tuples whatever sequence came: the settings are frozen, and hashable
            object.__setattr__(self, name, tuple((float(a), float(b)) for a, b in bounds))

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["backoff_bounds"] = [list(b) for b in self.backoff_bounds]
        data["outbox_backoff_bounds"] = [list(b) for b in self.outbox_backoff_bounds]
        return data

    def backoff(self, attempt: int) -> tuple[float, float] | None:
        """The wait bounds after failed attempt `attempt` (1-based), or None if undeclared."""
        if not self.backoff_bounds or attempt < 1:
            return None
        return self.backoff_bounds[min(attempt, len(self.backoff_bounds)) - 1]


@dataclass(frozen=True)
class ProcessContext:
    """Harness-neutral settings for one process: where things are, and per-slot faults."""

    db: str
    provider_url: str
    receiver_url: str
    engine: dict[str, Any]              # the scenario's [engine] table, as written
    slot: int = 0
    clock_skew: float = 0.0             # seconds; only with clock_skew
    heartbeat: bool | None = None       # False: this worker runs without heartbeat
    call_timeout: float | None = None   # a per-slot call timeout
    poll_interval: float = 0.02


@dataclass(frozen=True)
class Command:
    """How to start one engine process."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


class Engine(Protocol):
    """What an adapter provides (see the module docstring)."""

    name: str
    pipeline: Pipeline
    capabilities: frozenset[str]

    def command(self, role: str, ctx: ProcessContext) -> Command: ...
    def settings(self, table: dict[str, Any]) -> EngineSettings: ...
    def install(self, db: str) -> None: ...
    def operations(self, db: str) -> list[Event]: ...
    def progress(self, db: str) -> dict[str, Any]: ...
    def snapshot(self, db: str) -> dict[str, Any]: ...
    def submit(self, db: str, job_id: str, payload: Any) -> str: ...
    def operator(self, db: str, action: str, job_id: str) -> str: ...
    def expire_leases(self, db: str) -> int: ...
    def hold_write_lock(self, db: str) -> ContextManager[None]: ...
    def integrity(self, db: str) -> str: ...


class ContractError(ValueError):
    """An adapter that does not meet the contract; the message lists every gap."""


def names(need: str | tuple[str, ...]) -> tuple[str, ...]:
    """The attribute names that meet one of NEEDS' requirements (any one of them)."""
    return (need,) if isinstance(need, str) else need


def validate(engine: Any, spec: str = "engine") -> Any:
    """Check `engine` against the contract as a whole; returns it, or raises ContractError
    naming every missing attribute and every capability without its control."""
    gaps = contract_gaps(engine)
    if gaps:
        raise ContractError(f"{spec} does not meet the engine contract: " + "; ".join(gaps)
                            + " (see docs/engines.md)")
    return engine


def contract_gaps(engine: Any) -> list[str]:
    """Every way `engine` falls short of the contract, one phrase each (`validate` joins
    them; `ninelives doctor` lists them one by one)."""
    gaps = [f"lacks {name!r}" for name in REQUIRED if not hasattr(engine, name)]
    caps = getattr(engine, "capabilities", frozenset())
    unknown = sorted(set(caps) - set(CAPABILITIES))
    if unknown:
        gaps.append(f"declares unknown capabilities {unknown} (known: {', '.join(CAPABILITIES)})")
    for cap in sorted(set(caps) & set(NEEDS)):
        gaps += [f"declares {cap!r} but lacks {' or '.join(map(repr, names(need)))}"
                 for need in NEEDS[cap] if not any(hasattr(engine, n) for n in names(need))]
    pipeline = getattr(engine, "pipeline", None)
    if pipeline is not None and not isinstance(pipeline, Pipeline):
        gaps.append("its pipeline is not a chaos.pipeline.Pipeline")
    return gaps + role_gaps(engine)


def load_engine(spec: str | None) -> Any:
    """The adapter named by `--engine`: None or "reference", or `module:object` (an object,
    or a class called with no argument), validated and guarded (`chaos.engines.adapter_guard`: what
    its methods raise becomes AdapterError). Raises ContractError naming what is wrong, or
    AdapterError when its module raises on import (other than ImportError) or its class
    raises when built."""
    given, engine = import_adapter(spec)
    resolved = REFERENCE_SPEC if given == "reference" else given
    return guard(validate(engine, f"--engine {resolved!r}"), given)


def import_adapter(spec: str | None) -> tuple[str, Any]:
    """(the spec as given, the adapter object) of `--engine`, imported and built but not
    validated nor guarded (`load_engine` does both). Raises as `load_engine` does."""
    given = spec or "reference"
    if spec in (None, "", "reference"):
        spec = REFERENCE_SPEC
    module, _, attr = spec.partition(":")
    if not attr:
        raise ContractError(f"--engine must be 'reference' or module:object, got {spec!r}")
    try:
        target = getattr(_import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ContractError(f"--engine {spec!r}: cannot load it: {exc}") from None
    except Exception:
        raise_adapter_error(given, "import")
    try:
        engine = target() if isinstance(target, type) else target
    except Exception:
        raise_adapter_error(given, "constructor")
    return given, engine


def _import_module(name: str) -> Any:
    """`importlib.import_module(name)`, looking in the current folder last when the module is
    nowhere else: `python -m` puts that folder on the path, the `ninelives` script does not,
    and an adapter beside the user's project (`--engine myengine.adapter:ENGINE`) is found
    either way. Appended, never first: it shadows no installed module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = name.split(".")[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(name)


def process_counts(run: Any, engine: Any) -> dict[str, int]:
    """The processes of each role a run starts: the scenario's workers, and its senders only
    for an engine that declares an outbox (one without has no sender to start)."""
    return {"worker": run.workers, "sender": run.senders if has(engine, "outbox") else 0}


def has(engine: Any, capability: str) -> bool:
    """Whether `engine` declares `capability`."""
    return capability in getattr(engine, "capabilities", ())


def submitter(engine: Any, table: dict[str, Any]) -> Callable[..., str]:
    """`engine.submit` as the harness calls it, `(db, job_id, payload, **keywords)`: where the
    adapter's `submit` has a parameter named `settings` (asked once, here), each call also
    passes `settings=` a copy of `table`, the scenario's `[engine]` table as written (after
    --engine-set), the one `settings(table)` read; otherwise `engine.submit` itself, so an
    adapter written before this keyword is called as it always was."""
    try:
        parameter = inspect.signature(engine.submit).parameters.get("settings")
    except (TypeError, ValueError):  # a callable whose signature Python cannot read
        parameter = None
    if parameter is None or parameter.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY):
        return engine.submit

    def submit(db: str, job_id: str, payload: Any, **keywords: Any) -> str:
        return engine.submit(db, job_id, payload, settings=dict(table), **keywords)
    return submit
