"""The history's vocabulary as data: every operation type, its fields, their types, which
are required, and what leaving each out costs.

One source for three uses: the reference page `docs/history.md` is generated from it
(`python -m chaos.docs.history_page --write docs/history.md`; a test fails when the page is
stale);
what an adapter's `operations(db)` returns is checked against it as it is read
(`read_operations`: a missing or mistyped required field ends the run with exit 2, naming
the operation type, the field, an example and the method); and each checker module
declares the fields it reads (its `READS`), so a field an engine leaves out makes exactly
the checks that read it `unknown`, naming the field (`missing_evidence`).

A field is one of three kinds, by what its absence would mean:
  required   the operation means nothing without it (a claim's job and step): absent or of
             the wrong type, the adapter is at fault and the run stops (exit 2);
  defaulted  absent has one true reading, filled in when read (`continued` False: a claim
             that takes a new lease; `to` of a submission: the state it was created in);
  evidence   absent has no true reading (a claim's `lease_until`: None would mean "no lease",
             which is not what an engine that does not report it means), so the checks that
             read it are `unknown`, naming it.
A field that may be None says so (`nullable`): None is the engine's word that it does not
keep the value for that write (a write made by no worker has `worker` None).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

Event = dict[str, Any]

#: the field kinds and the Python values each admits (a bool is never a number here)
KINDS: dict[str, str] = {
    "str": "a string",
    "int": "a whole number",
    "number": "a finite number",
    "time": "seconds since the epoch (a finite number, the machine's clock)",
    "bool": "true or false",
    "id": "a string or a whole number",
    "json": "any JSON value",
}

#: who may write an engine operation (its `actor`)
ACTORS = ("worker", "sender", "operator", "harness", "submitter")

REQUIRED = "required"
DEFAULTED = "defaulted"
EVIDENCE = "evidence"


@dataclass(frozen=True)
class Derived:
    """A default computed from the operation itself; `text` says how, for the docs."""

    fn: Callable[[Event], Any]
    text: str


@dataclass(frozen=True)
class Field:
    """One field of an operation type (see the module docstring for the three needs)."""

    name: str
    kind: str
    doc: str
    need: str = DEFAULTED
    default: Any = None
    nullable: bool = True
    choices: tuple[str, ...] = ()

    def describe_default(self) -> str:
        if isinstance(self.default, Derived):
            return self.default.text
        return repr(self.default) if self.default is None or isinstance(self.default, bool) \
            else json.dumps(self.default)

    def fill(self, op: Event) -> Any:
        return self.default.fn(op) if isinstance(self.default, Derived) else self.default


@dataclass(frozen=True)
class OpType:
    """One operation type: who records it, what it means, and its fields."""

    src: str
    type: str
    doc: str
    fields: tuple[Field, ...]

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


def req(name: str, kind: str, doc: str, nullable: bool = False, **kw: Any) -> Field:
    return Field(name, kind, doc, REQUIRED, nullable=nullable, **kw)


def opt(name: str, kind: str, doc: str, default: Any = None, **kw: Any) -> Field:
    return Field(name, kind, doc, DEFAULTED, default, **kw)


def ev(name: str, kind: str, doc: str, **kw: Any) -> Field:
    return Field(name, kind, doc, EVIDENCE, **kw)


# -- the fields engine operations share -----------------------------------------------------

def _common(actor: Any) -> tuple[Field, ...]:
    """t, src, type, completion, seq and who wrote (actor, worker, pid, token)."""
    who = (req("actor", "str", "who wrote: " + ", ".join(ACTORS), choices=ACTORS)
           if actor is None else
           opt("actor", "str", "who wrote: " + ", ".join(ACTORS), actor, nullable=False,
               choices=ACTORS))
    return (
        req("t", "time", "when the write committed, on the machine's clock (never an "
            "engine's injected one)"),
        req("src", "str", "always \"engine\"", choices=("engine",)),
        req("type", "str", "the operation type"),
        opt("completion", "str", "\"ok\": it was committed", "ok", nullable=False,
            choices=("ok",)),
        opt("seq", "int", "the commit order among operations of one time (an audit row's "
            "id, say); absent: the order `operations()` returned them in", 0,
            nullable=False),
        who,
        opt("worker", "str", "the writer's id as the engine spells it; None where the "
            "observer cannot tell (the write is then counted as unattributed, never "
            "guessed)"),
        opt("pid", "int", "the writer's process id; None when the adapter cannot tell "
            "(the harness then ties writes to processes through `pid_of`, `worker_of` or "
            "`write_points`)"),
        opt("token", "id", "the fencing token the write was made under (`fencing`); None "
            "for an engine without one. Ordered tokens compare with `<`; see "
            "`EngineSettings.token_order` for opaque ones"),
    )


def _job_state(leased: bool = True) -> tuple[Field, ...]:
    """The job row's counters and times a job write carries; `leased`: the write may leave
    a lease (a new job's row holds none)."""
    lease = (ev("lease_until", "time", "when the job's lease ends after the write; None: it "
                "holds no lease", nullable=True) if leased else
             opt("lease_until", "time", "None: a new job holds no lease"))
    return (
        opt("attempts", "int", "the job's failed attempts at its current step after the "
            "write; None: the engine keeps no such count"),
        opt("claims", "int", "the job's claims of its current step after the write (the "
            "crash-loop counter); None: the engine keeps no such count"),
        lease,
        opt("next_run_at", "time", "when the job is due again after the write (a retry's "
            "backoff); None: it is due at once, or not waiting"),
    )


def _effect_ids() -> tuple[Field, ...]:
    return (
        req("row", "id", "the outbox row's id"),
        req("job", "str", "the job the effect belongs to"),
        req("kind", "str", "the effect's kind (one of the pipeline's `effects`)"),
    )


def _sent_at(op: Event) -> Any:
    return op.get("t")


ENGINE: tuple[OpType, ...] = (
    OpType("engine", "submitted", "a job row created by a submission",
           _common("submitter") + (
               req("job", "str", "the job's id (the caller's)"),
               req("state", "str", "the state the job was created in (the pipeline's "
                   "initial state)"),
               opt("from", "str", "always None: a submission comes from no state"),
               opt("to", "str", "the state the job was created in",
                   Derived(lambda op: op.get("state"), "the operation's `state`"),
                   nullable=False),
               opt("payload_hash", "str", "`chaos.history.payload_hash` of the payload it "
                   "stored (`submissions-idempotent` compares it with what was submitted)"),
           ) + _job_state(leased=False)),
    OpType("engine", "claimed",
           "a worker took the job's lease for `step` (from may equal to: a resume), or "
           "moved on to `step` under the lease it held (`continued`)",
           _common("worker") + (
               req("job", "str", "the job's id"),
               req("step", "str", "the step the claim is for (a pipeline step's name); None "
                   "for a claim that entered no step's working state (an engine's illegal "
                   "claim, which `legal-transitions` judges)", nullable=True),
               req("from", "str", "the state before the claim"),
               req("to", "str", "the step's working state"),
               opt("continued", "bool", "True: the worker moved on under the lease it held, "
                   "no new lease was taken", False, nullable=False),
               opt("payload_hash", "str", "the stored payload's fingerprint, if the row "
                   "carries it"),
           ) + _job_state()),
    OpType("engine", "state",
           "any other committed write to a job: a step done, a failure, a retry scheduled, "
           "a park, a lease renewal (`heartbeat`), an operator's or the harness's move",
           _common(None) + (
               req("job", "str", "the job's id"),
               req("from", "str", "the state before the write"),
               req("to", "str", "the state after the write (equal to `from` for a write "
                   "that changes no state)"),
               opt("heartbeat", "bool", "True for a write that only extends the lease "
                   "(a renewal); an engine with the `heartbeat` capability must mark them",
                   False, nullable=False),
               opt("took_lease", "bool", "True for a worker's write that took the job's "
                   "lease without running a step (a claim that parks a crash loop)", False,
                   nullable=False),
               opt("last_error", "str", "the error the write recorded, as the engine wrote "
                   "it"),
               opt("cause", "str", "why a job was parked, in the adapter's reading of the "
                   "engine's error: \"crash_loop\", \"poison\", \"attempts\", or None",
                   choices=("crash_loop", "poison", "attempts")),
               opt("payload_hash", "str", "the stored payload's fingerprint, if the row "
                   "carries it"),
           ) + _job_state()),
    OpType("engine", "removed", "a job row deleted",
           _common(None) + (req("job", "str", "the job's id"),
                            opt("from", "str", "the state it was deleted in"),
                            opt("to", "str", "always None"))),
    OpType("engine", "memo", "a step's result (its memo) written, or deleted",
           _common("worker") + (
               req("job", "str", "the job's id"),
               req("step", "str", "the step whose result it is"),
               opt("cost", "number", "the billed cost of the call whose result this is "
                   "(`cost-accounted` sums it); None: not recorded"),
               opt("op", "str", "\"insert\" or \"delete\" (an operator's rerun or resolve)",
                   "insert", nullable=False, choices=("insert", "delete")),
           )),
    OpType("engine", "effect_queued", "an outbox row written (a side effect to send)",
           _common("worker") + _effect_ids() + (
               req("key", "str", "the idempotency key the receiver will see"),
               opt("attempts", "int", "the row's send attempts (0 when written)"),
               opt("lease_until", "time", "the row's sender lease (None: unleased)"),
               opt("next_run_at", "time", "when the row is first due (None: at once)"),
               opt("sent_at", "time", "None: a new row is not sent"),
               opt("dead_at", "time", "None: a new row is not dead-lettered"),
           )),
    OpType("engine", "effect_claimed", "a sender took an outbox row's lease to send it",
           _common("sender") + _effect_ids() + (
               opt("attempts", "int", "the row's send attempts after the claim"),
               ev("lease_until", "time", "when the sender's lease on the row ends",
                  nullable=True),
               opt("sent_at", "time", "None: a row is claimed to be sent"),
               opt("dead_at", "time", "set when the claim dead-letters the row past its "
                   "cap instead of sending it"),
               opt("next_run_at", "time", "when the row is due again (None: not waiting)"),
               opt("last_error", "str", "the row's last error"),
           )),
    OpType("engine", "effect_sent", "the row marked sent (the receiver answered)",
           _common("sender") + _effect_ids() + (
               opt("attempts", "int", "the row's send attempts"),
               opt("sent_at", "time", "when the engine marked it sent",
                   Derived(_sent_at, "the operation's time `t`"), nullable=False),
               opt("lease_until", "time", "the row's lease after the mark"),
               opt("dead_at", "time", "None: a sent row is not dead-lettered"),
               opt("last_error", "str", "the row's last error"),
           )),
    OpType("engine", "effect_state",
           "any other write to an outbox row: a retry scheduled, dead-lettered, released; "
           "by actor \"harness\": its lease cut short",
           _common(None) + _effect_ids() + (
               opt("attempts", "int", "the row's send attempts after the write"),
               ev("sent_at", "time", "when the row was sent, if it was (None: not sent)",
                  nullable=True),
               ev("dead_at", "time", "when the row was dead-lettered, if it was (None: not)",
                  nullable=True),
               opt("last_error", "str", "the error the write recorded"),
               ev("lease_until", "time", "the row's lease after the write (None: released)",
                  nullable=True),
               opt("next_run_at", "time", "when the row is due again (a failed send's "
                   "backoff); None: due when its lease ends, or at once. A sender that "
                   "waits between tries must give it, or its waits read as slowness"),
           )),
    OpType("engine", "billed",
           "one billed provider call as the engine recorded it (`spend_records` only)",
           _common("worker") + (
               req("job", "str", "the job's id"),
               req("step", "str", "the step that made the call"),
               req("started", "time", "when the call started (the engine's reading)"),
               req("ended", "time", "when it ended", nullable=True),
               req("outcome", "str", "how it ended, in the engine's words (\"ok\" for an "
                   "answer used)"),
               opt("cost", "number", "what the provider billed for it"),
               opt("error", "str", "the error, for a call that failed"),
           )),
)

SCHEMA: dict[str, OpType] = {op.type: op for op in ENGINE}


class OperationError(ValueError):
    """An operation from an adapter that the vocabulary cannot read: the message names the
    operation type, the field, an example operation and the adapter method."""


def check_value(f: Field, value: Any) -> str | None:
    """Why `value` is not a value of field `f`, or None when it is."""
    if value is None:
        return None if f.nullable else "is None, which this field may not be"
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        "time": isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(value),
        "bool": isinstance(value, bool),
        "id": isinstance(value, (str, int)) and not isinstance(value, bool),
        "json": True,
    }[f.kind]
    if not ok:
        return f"is {type(value).__name__} {_excerpt(value, 40)}, not {KINDS[f.kind]}"
    if f.choices and value not in f.choices:
        return f"is {value!r}, not one of {', '.join(map(repr, f.choices))}"
    return None


def _excerpt(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, default=repr, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + "..."


def read_operations(ops: Any, method: str = "operations(db)") -> list[Event]:
    """The engine operations an adapter returned, checked against the vocabulary and with
    every absent defaulted field filled in (in place). Evidence fields left out stay absent:
    the checks that read them say so (`missing_evidence`). Raises OperationError naming the
    first operation type and field at fault, with an example, and the method."""
    if not isinstance(ops, list):
        raise OperationError(f"{method}: returned {type(ops).__name__}, not a list of "
                             "operations (see docs/history.md)")
    for i, op in enumerate(ops):
        problem = _problem(op)
        if problem:
            raise OperationError(f"{method}: {problem}; operation {i + 1} of {len(ops)}: "
                                 f"{_excerpt(op, 120)} (see docs/history.md)")
        for f in SCHEMA[op["type"]].fields:
            if f.need == DEFAULTED and f.name not in op:
                op[f.name] = f.fill(op)
    return ops


def _problem(op: Any) -> str | None:
    if not isinstance(op, dict):
        return f"it is {type(op).__name__}, not an object"
    kind = op.get("type")
    if kind not in SCHEMA:
        return (f"type {kind!r} is none of the engine's operation types "
                f"({', '.join(SCHEMA)})")
    spec = SCHEMA[kind]
    for f in spec.fields:
        if f.name not in op:
            if f.need == REQUIRED:
                return f"a {kind!r} operation lacks {f.name!r} (required: {KINDS[f.kind]})"
            continue
        why = check_value(f, op[f.name])
        if why:
            return f"a {kind!r} operation's {f.name!r} {why}"
    return None


def missing_evidence(history: Iterable[Event], reads: Iterable[str]) -> list[str]:
    """The evidence fields among `reads` ("type.field") that some engine operation of that
    type left out, each as "type.field (N of M operations)"."""
    wanted: dict[str, set[str]] = {}
    for item in reads:
        kind, _, name = item.partition(".")
        spec = SCHEMA.get(kind)
        f = spec.field(name) if spec else None
        if f is not None and f.need == EVIDENCE:
            wanted.setdefault(kind, set()).add(name)
    if not wanted:
        return []
    seen: dict[str, int] = {}
    lacking: dict[tuple[str, str], int] = {}
    for e in history:
        if e.get("src") != "engine" or e.get("type") not in wanted:
            continue
        seen[e["type"]] = seen.get(e["type"], 0) + 1
        for name in wanted[e["type"]]:
            if name not in e:
                lacking[(e["type"], name)] = lacking.get((e["type"], name), 0) + 1
    return [f"{kind}.{name} ({n} of {seen[kind]} operations)"
            for (kind, name), n in sorted(lacking.items())]


# -- the snapshot ----------------------------------------------------------------------------

#: The final rows `snapshot(db)` returns, table by table: (what the table is, its fields).
#: `jobs` maps each job id to its row; the others are lists of rows. A field an engine does
#: not keep is None; a table it does not keep (`spend` without `spend_records`) is None.
SNAPSHOT: dict[str, tuple[str, tuple[Field, ...]]] = {
    "jobs": ("every job row, by id", (
        req("state", "str", "its state now"),
        req("attempts", "int", "its failed attempts at its current step", nullable=True),
        req("claims", "int", "its claims of its current step", nullable=True),
        req("last_error", "str", "its last error", nullable=True),
        req("payload_hash", "str", "`chaos.history.payload_hash` of its stored payload",
            nullable=True),
        req("cause", "str", "why it was parked (as on `state` operations)", nullable=True),
    )),
    "memos": ("every memo row", (
        req("job", "str", "its job"), req("step", "str", "its step"),
        req("cost", "number", "the committed call's cost", nullable=True),
    )),
    "outbox": ("every outbox row", (
        req("row", "id", "its id"), req("job", "str", "its job"),
        req("kind", "str", "its kind"), req("key", "str", "its idempotency key"),
        req("sent_at", "time", "when it was sent", nullable=True),
        req("dead_at", "time", "when it was dead-lettered", nullable=True),
        req("attempts", "int", "its send attempts", nullable=True),
        req("last_error", "str", "its last error", nullable=True),
    )),
    "spend": ("every billed call's record (None without `spend_records`)", (
        req("job", "str", "its job"), req("step", "str", "its step"),
        req("worker", "str", "who made the call", nullable=True),
        req("pid", "int", "its process", nullable=True),
        req("started", "time", "when it started"),
        req("ended", "time", "when it ended", nullable=True),
        req("outcome", "str", "how it ended"),
        req("cost", "number", "what it cost", nullable=True),
    )),
    "orphans": ("rows that outlived their job, counted by kind ({name: count})", ()),
}


def read_snapshot(snap: Any, method: str = "snapshot(db)") -> dict[str, Any]:
    """The snapshot an adapter returned, checked against SNAPSHOT, a field that may be None
    and is left out read as None (the engine does not keep it); raises OperationError
    naming the table, the row and the field at fault, and the method."""
    def fault(text: str) -> OperationError:
        return OperationError(f"{method}: {text} (see docs/history.md, \"The snapshot\")")
    if not isinstance(snap, dict):
        raise fault(f"it is {type(snap).__name__}, not an object")
    for table, (_, spec) in SNAPSHOT.items():
        if table not in snap:
            raise fault(f"it lacks the table {table!r}")
        rows = snap[table]
        if rows is None and table == "spend":
            continue
        if table == "orphans":
            if not isinstance(rows, dict) or not all(
                    isinstance(n, int) and not isinstance(n, bool) for n in rows.values()):
                raise fault(f"'orphans' is {_excerpt(rows, 80)}, not an object of counts")
            continue
        want = dict if table == "jobs" else list
        if not isinstance(rows, want):
            raise fault(f"{table!r} is {type(rows).__name__}, not "
                        f"{'an object of rows by job id' if want is dict else 'a list of rows'}")
        items = rows.items() if table == "jobs" else enumerate(rows)
        for key, row in items:
            where = f"{table}[{key!r}]"
            if not isinstance(row, dict):
                raise fault(f"{where} is {type(row).__name__}, not an object")
            for f in spec:
                if f.name not in row and f.nullable:
                    row[f.name] = None  # left out: the engine keeps no such value, as None says
                    continue
                if f.name not in row:
                    raise fault(f"{where} lacks {f.name!r} (required: {KINDS[f.kind]}): "
                                + _excerpt(row, 120))
                why = check_value(f, row[f.name])
                if why:
                    raise fault(f"{where}'s {f.name!r} {why}")
    return snap


def reads(**by_type: str) -> tuple[str, ...]:
    """A checker's declaration of the engine fields it reads, by operation type (field names
    separated by spaces), as "type.field" items. Raises ValueError at import for a type or
    field the vocabulary does not have: a checker reads nothing the schema does not state."""
    items = []
    for kind, names in by_type.items():
        spec = SCHEMA.get(kind)
        if spec is None:
            raise ValueError(f"reads(): {kind!r} is not an engine operation type")
        for name in names.split():
            if spec.field(name) is None:
                raise ValueError(f"reads(): a {kind!r} operation has no field {name!r} in "
                                 "chaos.engines.schema")
            items.append(f"{kind}.{name}")
    return tuple(items)
