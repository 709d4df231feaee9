"""What `ninelives doctor` concludes from the evidence of one fault-free run: the adapter's
operations read against the history's vocabulary (every problem at once, not the first),
the evidence they leave out, what the declared capabilities promise and the history must
then show, and the facts every correct run shows. Pure functions over the evidence; each
returns `Finding`s. `chaos.engines.doctor` gathers the evidence and prints them.

Why not `chaos.engines.schema.read_operations`: it stops at the first operation it cannot read,
which is right for a run and wrong for a diagnosis, so the fields are checked here one by
one with the schema's own `check_value`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from chaos.contract import EngineSettings
from chaos.pipeline import Pipeline
from chaos.engines.schema import DEFAULTED, KINDS, REQUIRED, SCHEMA, check_value, missing_evidence

GAP, WARNING, NOTE, OK = "gap", "warning", "note", "ok"
ENGINES_DOC = "docs/engines.md"
HISTORY_DOC = "docs/history.md"


@dataclass(frozen=True)
class Finding:
    """One thing doctor found: `level` gap (the adapter is not ready), warning (it runs,
    some checks will be unknown), note (worth knowing) or ok (a check passed); `fix` says
    what to change and where the docs explain it."""

    level: str
    text: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "text": self.text, "fix": self.fix}


def gap(text: str, fix: str) -> Finding:
    return Finding(GAP, text, fix)


def see(section: str, page: str = ENGINES_DOC) -> str:
    return f'({page}, "{section}")'


def excerpt(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=repr, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class Evidence:
    """What one doctor run saw. ops: the operations doctor could read, defaulted fields
    filled in, in commit order; snapshot: the snapshot, or None when it could not be read;
    jobs: the ids doctor submitted; settled: every job finished and nothing unsent before
    the deadline; heartbeat_provoked: one call was slowed past the heartbeat interval;
    provider_calls: requests the fake provider answered."""

    pipeline: Pipeline
    capabilities: frozenset[str]
    settings: EngineSettings
    ops: list[dict[str, Any]] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    jobs: tuple[str, ...] = ()
    settled: bool = False
    heartbeat_provoked: bool = False
    provider_calls: int = 0
    #: operation types some of whose operations could not be read: the checks that count
    #: them wait until they can (their gaps are named already)
    unreadable: set[str] = field(default_factory=set)

    def of(self, kind: str) -> list[dict[str, Any]] | None:
        """The readable operations of type `kind`, or None when some were unreadable."""
        return None if kind in self.unreadable else _of(self.ops, kind)


# -- the vocabulary -------------------------------------------------------------------------

def read_all(ops: Any) -> tuple[list[Finding], list[dict[str, Any]], set[str]]:
    """(a gap for each operation type and field the vocabulary cannot read, counted, with an
    example; the operations it can read, copied, defaulted fields filled in, in commit
    order; the types of the operations it cannot read)."""
    if not isinstance(ops, list):
        return [gap(f"operations(db) returned {type(ops).__name__}, not a list of operations",
                    "return a list of dicts, one per committed write "
                    + see("The history: operations"))], [], set()
    problems: dict[tuple[str, str], list] = {}
    readable = []
    for op in ops:
        found = op_problems(op)
        for key, why in found:
            problems.setdefault(key, [why, 0, op])[1] += 1
        if not found:
            spec = SCHEMA[op["type"]]
            readable.append({**{f.name: f.fill(op) for f in spec.fields
                                if f.need == DEFAULTED and f.name not in op}, **op})
    readable.sort(key=lambda op: (op["t"], op["seq"]))
    findings = [gap(f"{why} ({n} of {len(ops)} operations; e.g. {excerpt(example)})",
                    field_fix(kind, name))
                for (kind, name), (why, n, example) in problems.items()]
    return findings, readable, {kind for kind, _ in problems}


def op_problems(op: Any) -> list[tuple[tuple[str, str], str]]:
    """((operation type, field), why) for every field of `op` the vocabulary cannot read."""
    if not isinstance(op, dict):
        return [(("", ""), f"an operation is {type(op).__name__}, not an object")]
    kind = op.get("type")
    if kind not in SCHEMA:
        return [((str(kind), "type"), f"operation type {kind!r} is none of the engine's "
                 f"operation types ({', '.join(SCHEMA)})")]
    found = []
    for f in SCHEMA[kind].fields:
        if f.name not in op:
            if f.need == REQUIRED:
                found.append(((kind, f.name), f"{kind!r} operations lack {f.name!r}, "
                              f"a required field"))
            continue
        why = check_value(f, op[f.name])
        if why:
            found.append(((kind, f.name), f"the {kind!r} operation's {f.name!r} {why}"))
    return found


def field_fix(kind: str, name: str) -> str:
    spec = SCHEMA.get(kind)
    f = spec.field(name) if spec else None
    if f is None:
        return ("return only the operation types of the vocabulary from operations(db) "
                + see(kind or "Engine operations", HISTORY_DOC))
    none = ", or None" if f.nullable else ""
    return (f"give every {kind!r} operation {name!r} as {KINDS[f.kind]}{none}: {f.doc} "
            + see(f"`{kind}`", HISTORY_DOC))


def evidence_left_out(ops: list[dict[str, Any]],
                      reads: dict[str, tuple[str, ...]]) -> list[Finding]:
    """A warning for each evidence field the operations leave out, naming the invariants it
    makes unknown (`reads`: the checkers' READS)."""
    findings = []
    for item in missing_evidence(ops, {f for fields in reads.values() for f in fields}):
        key = item.split(" ")[0]
        readers = [name for name, fields in reads.items() if key in fields]
        kind, _, name = key.partition(".")
        findings.append(Finding(
            WARNING, f"operations leave out the evidence {item}: "
                     f"{', '.join(readers) or 'no check'} will be unknown",
            field_fix(kind, name)))
    return findings


# -- the controls' answers ------------------------------------------------------------------

#: what each control must do, as a gap's fix says it
CONTROL_FIXES = {
    "operator": "have operator(db, action, job) carry out cancel, requeue and resolve and "
                "answer 'done' or 'refused: why'",
    "expire_leases": "have expire_leases(db) end every live lease and return how many (an "
                     "int)",
    "hold_write_lock": "have hold_write_lock(db) return a context manager that holds the "
                       "store's write lock while its block runs",
    "integrity": "have integrity(db) return 'ok' for a sound store, else its problems as "
                 "text",
}


def contract_fix(text: str) -> str:
    """The fix of one contract gap (`chaos.contract.contract_gaps`), by what it is about."""
    if "point_roles" in text or "crashpoints" in text:
        return ("map each role to points the adapter lists in crashpoints, and only roles of "
                "chaos.engines.crashpoints.ROLES " + see("Crash points by role"))
    if text.startswith("lacks "):
        return ("give the adapter the attribute the contract requires "
                + see("The contract, by role"))
    if text.startswith("declares "):
        return ("declare only known capabilities, each with its control "
                + see("Capabilities and what they enable"))
    return "give the adapter what the contract names " + see("The contract, by role")


def int_answer(answer: Any) -> str | None:
    if isinstance(answer, int) and not isinstance(answer, bool):
        return None
    return f"returned {shown(answer)}, not a count (an int)"


def ok_answer(answer: Any) -> str | None:
    if answer == "ok":
        return None
    if isinstance(answer, str):
        return f"found problems in the store after a clean run: {excerpt(answer)}"
    return f"returned {shown(answer)}, not 'ok' or a string of problems"


def hold(lock: Any) -> str | None:
    if not (hasattr(lock, "__enter__") and hasattr(lock, "__exit__")):
        return f"returned {type(lock).__name__}, not a context manager"
    with lock:
        pass
    return None


def progress_shape(state: Any) -> bool:
    return (isinstance(state, dict) and isinstance(state.get("states"), dict)
            and isinstance(state.get("unsent"), int))


def shown(value: Any) -> str:
    """A short value as Python writes it (None, 0), a long one as an excerpt."""
    text = repr(value)
    return text if len(text) <= 80 else excerpt(value)


# -- what the capabilities promise ----------------------------------------------------------

def capability_findings(ev: Evidence) -> list[Finding]:
    """Gaps where a declared capability or setting promises what the history or the
    snapshot does not show."""
    caps, ops, s = ev.capabilities, ev.ops, ev.settings
    out: list[Finding] = []
    if "fencing" in caps and ev.of("claimed") is not None:
        out += _fencing(ops, s)
    if "spend_records" in caps:
        if ev.provider_calls and ev.of("billed") == []:
            out.append(gap(f"'spend_records' is declared but no 'billed' operation records "
                           f"the {ev.provider_calls} provider calls the run made",
                           "have operations(db) return a 'billed' operation per billed call, "
                           "or leave out spend_records " + see("Capabilities and what they "
                                                               "enable")))
        if ev.snapshot is not None and ev.snapshot.get("spend") is None:
            out.append(gap("'spend_records' is declared but snapshot(db)['spend'] is None",
                           "give snapshot(db) its 'spend' rows " + see("The contract, by "
                                                                        "role")))
    if "outbox" in caps and ev.pipeline.effects and ev.settled:
        for kind in ("effect_queued", "effect_sent"):
            if ev.of(kind) == []:
                out.append(gap(f"'outbox' is declared but no {kind!r} operation was recorded "
                               f"while {len(ev.jobs)} jobs finished",
                               f"have operations(db) return {kind!r} for each outbox write "
                               + see(f"`{kind}`", HISTORY_DOC)))
    if "heartbeat" in caps:
        out += _heartbeat(ev)
    if "crash_loop_cap" in caps and s.max_claims is None:
        out.append(gap("'crash_loop_cap' is declared but settings() gives max_claims None",
                       "set EngineSettings.max_claims to the engine's claim cap "
                       + see("Mapping your engine's counters")))
    if "attempt_cap" in caps and s.max_attempts is None and s.cap_counts != "claims":
        out.append(gap("'attempt_cap' is declared but settings() gives max_attempts None",
                       "set EngineSettings.max_attempts, or cap_counts='claims' with "
                       "max_claims " + see("Mapping your engine's counters")))
    if "backoff" in caps and not s.backoff_bounds:
        out.append(gap("'backoff' is declared but settings() gives no backoff_bounds",
                       "set EngineSettings.backoff_bounds to each retry's (lowest, highest) "
                       "wait " + see("Capabilities and what they enable")))
    return out


def _of(ops: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [op for op in ops if op["type"] == kind]


def _fencing(ops: list[dict[str, Any]], s: EngineSettings) -> list[Finding]:
    claims = _of(ops, "claimed")
    bare = [op for op in claims if op.get("token") is None]
    if bare:
        return [gap(f"'fencing' is declared but {len(bare)} of {len(claims)} 'claimed' "
                    f"operations carry token None (e.g. {excerpt(bare[0])})",
                    "give each 'claimed' operation the fencing token of its holding, or "
                    "leave out fencing " + see("Fencing tokens"))]
    if s.token_order != "ordered":
        return []
    last: dict[str, dict[str, Any]] = {}
    for op in claims:
        before = last.get(op["job"])
        last[op["job"]] = op
        if before is not None and not _follows(before["token"], op["token"], op["continued"]):
            return [gap(f"job {op['job']}'s claims carry the tokens {before['token']!r} then "
                        f"{op['token']!r}, not increasing, while settings() says "
                        "token_order='ordered'",
                        "if the tokens only identify a holding (a random handle), declare "
                        "token_order='opaque' in the EngineSettings settings() returns; if "
                        "they are meant to be ordered, make each claim's token greater than "
                        "the last " + see("Fencing tokens"))]
    return []


def _follows(before: Any, after: Any, continued: bool) -> bool:
    try:
        return after >= before if continued else after > before
    except TypeError:  # a string after a number: no order at all
        return False


def _heartbeat(ev: Evidence) -> list[Finding]:
    if not ev.settings.heartbeat:
        return [Finding(NOTE, "'heartbeat' is declared but settings() says heartbeat is off "
                              "with these settings: lease renewals were not looked for")]
    if ev.of("state") is None:
        return []
    beats = [op for op in _of(ev.ops, "state") if op.get("heartbeat")]
    if beats:
        return [Finding(OK, f"heartbeat: {len(beats)} lease renewal(s) marked heartbeat")]
    if not ev.heartbeat_provoked:
        return [Finding(NOTE, f"heartbeat not exercised: no call outlasted the heartbeat "
                              f"interval ({ev.settings.heartbeat_interval} s); give "
                              "--engine-set with a short interval to check it")]
    return [gap("'heartbeat' is declared and one call was slowed past the heartbeat interval, "
                "but no 'state' operation is marked heartbeat=True",
                "mark each lease renewal's 'state' operation heartbeat=True in operations(db)"
                " " + see("`state`", HISTORY_DOC))]


# -- what every correct run shows ------------------------------------------------------------

def history_findings(ev: Evidence) -> list[Finding]:
    """Each job submitted once, claimed, finished; each claim for a pipeline step, into its
    working state; every state a state of the pipeline."""
    p, ops = ev.pipeline, ev.ops
    out = []
    submitted, claimed = ev.of("submitted"), ev.of("claimed")
    for job in ev.jobs:
        n = sum(op["job"] == job for op in submitted or ())
        if submitted is not None and n != 1:
            out.append(gap(f"job {job} was submitted once but {n} 'submitted' operations "
                           "record it", "have operations(db) return one 'submitted' "
                           "operation per job created " + see("`submitted`", HISTORY_DOC)))
        # unsettled, a job without a claim is the deadline's gap, named already
        if ev.settled and claimed is not None and not any(op["job"] == job for op in claimed):
            out.append(gap(f"job {job} has no 'claimed' operation",
                           "have operations(db) return a 'claimed' operation for each claim "
                           + see("`claimed`", HISTORY_DOC)))
    out += _finished(ev)
    steps = {s.name: s for s in p.steps}
    for op in claimed or ():
        step = steps.get(op["step"])
        if step is None:
            out.append(gap(f"a 'claimed' operation names step {op['step']!r}, not a step of "
                           f"pipeline {p.name!r} ({', '.join(steps)}): {excerpt(op)}",
                           "give each claim the name of the pipeline step it runs "
                           + see("`claimed`", HISTORY_DOC)))
            break
        if op["to"] == op["from"] != step.working:
            out.append(Finding(WARNING, f"claims of step {step.name!r} leave the job in "
                               f"{op['to']!r}: the engine does not move a claimed job into "
                               f"the step's working state {step.working!r} (its behaviour, "
                               f"which legal-transitions judges, unless the observer reads "
                               f"the claim wrong): {excerpt(op)}"))
            break
        if op["to"] != step.working:
            out.append(gap(f"a 'claimed' operation for step {step.name!r} moves the job to "
                           f"{op['to']!r}, not the step's working state {step.working!r}: "
                           f"{excerpt(op)}", "give a claim's 'to' the working state of its "
                           "step, as the pipeline declares it " + see("`claimed`",
                                                                       HISTORY_DOC)))
            break
    strange = sorted({s for op in ops for s in _states(op) if s not in p.states})
    if strange:
        out.append(gap(f"operations name states that pipeline {p.name!r} does not have: "
                       f"{', '.join(map(repr, strange))}",
                       "name states as the pipeline declares them, or add them to its "
                       "steps and edges " + see("The contract, by role")))
    return out


def _finished(ev: Evidence) -> list[Finding]:
    if ev.snapshot is None or not ev.settled:
        return []
    done = ev.pipeline.terminal | ev.pipeline.parked_states
    rows = ev.snapshot["jobs"]
    out = []
    for job in ev.jobs:
        state = rows.get(job, {}).get("state")
        if job not in rows:
            out.append(gap(f"snapshot(db)['jobs'] has no row for job {job}",
                           "give snapshot(db) a row for every job " + see("The snapshot",
                                                                           HISTORY_DOC)))
        elif state not in done:
            out.append(gap(f"progress(db) said every job had finished, but the snapshot "
                           f"leaves job {job} in {state!r}",
                           "count the same states in progress(db) and snapshot(db) "
                           + see("The contract, by role")))
    return out


def _states(op: dict[str, Any]) -> list[str]:
    if op["type"] not in ("submitted", "claimed", "state", "removed"):
        return []
    return [s for s in (op.get("state"), op.get("from"), op.get("to")) if s is not None]
