"""Small builders for hand-made histories and snapshots, so checker tests read like stories."""
from __future__ import annotations


from chaos.reference import ReferenceEngine, backoff_bounds, chaos_pipeline
from chaos.reference.observer import Mapper
from engine import DOCUMENT

W1 = "worker:host:101:aaaa"
W2 = "worker:host:102:bbbb"
S1 = "sender:host:201:cccc"
OP = "operator:alice"


def pipeline_json(pipeline=DOCUMENT) -> dict:
    effects = ReferenceEngine().pipeline.effects if pipeline is DOCUMENT else ()
    return chaos_pipeline(pipeline, effects).to_json()


_MAPPER = Mapper(chaos_pipeline(DOCUMENT))


def as_operation(row: dict) -> dict:
    """An audit row of the reference engine's form, read as the history's operation by the
    reference adapter's observer (the same reading a real run makes)."""
    return _MAPPER.map({"seq": 0, **row})


def snapshot(**overrides) -> dict:
    """A snapshot of a clean run with no jobs; override any key."""
    base = {
        "pipeline": pipeline_json(),
        "settings": {"lease": 2.0, "heartbeat": True, "heartbeat_interval": 0.0,
                     "call_timeout": 1.0, "max_attempts": 4, "max_claims": 8,
                     "backoff_bounds": [list(b) for b in backoff_bounds(0.1, 2.0, 4)],
                     "outbox_max_attempts": 6, "keep_job": True},
        "jobs": {}, "memos": [], "outbox": [], "spend": [],
        "integrity": [{"t": 100.0, "after": "end", "result": "ok"}],
        "orphans": {"memos_without_job": 0, "outbox_without_job": 0, "spend_without_job": 0},
        "receiver_applied": [],
        "plan": {"poison": {}, "crash_loop": [], "needs_review": [],
                 "duplicates": {"same": [], "different": []},
                 "expect": {"duplicate_spend_allowance": 0.0, "lease_exclusive": True,
                            "settle": True}},
        "phases": {"chaos_start": 0.0, "heal_start": 50.0, "drain_start": 51.0,
                   "drain_end": 60.0, "drained": True},
        "submitted": [],
    }
    base.update(overrides)
    return base


def job(t, job_id, frm, to, writer, token, *, op="update", old_token=None, claims=0,
        attempts=0, lease_until=0.0, next_run_at=None, last_error=None, payload_hash="h1"):
    return as_operation({
        "t": t, "table": "job", "op": op, "job": job_id, "from": frm,
        "to": to, "writer": writer, "token": token,
        "old_token": token if old_token is None else old_token, "claims": claims,
        "attempts": attempts, "lease_until": lease_until,
        "lease_owner": writer if to.endswith("ing") else None, "next_run_at": next_run_at,
        "last_error": last_error, "payload_hash": payload_hash})


def memo(t, job_id, step, writer, token, cost=0.01, op="insert"):
    return as_operation({"t": t, "table": "memo", "op": op, "job": job_id, "step": step,
                         "writer": writer, "token": token, "cost": cost})


def outbox(t, row, job_id, kind, writer, token, *, op="update", old_token=None, attempts=0,
           sent_at=None, dead_at=None, last_error=None, was_sent=None, lease_until=None,
           next_attempt_at=None):
    return as_operation({
        "t": t, "table": "outbox", "op": op, "row": row, "job": job_id,
        "kind": kind, "writer": writer, "token": token, "key": f"{job_id}:{kind}",
        "old_token": token if old_token is None else old_token, "attempts": attempts,
        "sent_at": sent_at, "dead_at": dead_at, "lease_owner": None, "last_error": last_error,
        "was_sent": was_sent, "lease_until": lease_until, "next_attempt_at": next_attempt_at})


def spend(t, job_id, step, worker, token, outcome="ok", cost=0.01, started=None, error=None):
    return as_operation({
        "t": t, "table": "spend", "op": "insert", "job": job_id, "step": step,
        "worker": worker, "token": token, "started": t - 0.1 if started is None else started,
        "ended": t, "outcome": outcome, "cost": cost, "error": error})


def call(t_start, t_end, job_id, step, worker, *, n=1, status=200, outcome="ok", billed=0.01,
         fault=None, retry_after=None):
    return {"t": t_start, "src": "provider", "type": "call", "job": job_id, "step": step,
            "worker": worker, "n": n, "t_start": t_start, "t_end": t_end, "status": status,
            "outcome": outcome, "billed": billed, "fault": fault, "retry_after": retry_after}


def request(t_start, t_end, job_id, kind, *, key="auto", worker=S1, n=1, status=201,
            outcome="applied", applied=True, effect_id=None):
    return {"t": t_start, "src": "receiver", "type": "request",
            "key": f"{job_id}:{kind}" if key == "auto" else key, "job": job_id, "kind": kind,
            "worker": worker, "n": n, "t_start": t_start, "t_end": t_end, "status": status,
            "outcome": outcome, "applied": applied, "effect_id": effect_id}


def nemesis(t, type_, **details):
    return {"t": t, "src": "nemesis", "type": type_, **details}


def process(t, type_, name, pid, role="worker", code=None, signal=None, killed=None):
    event = {"t": t, "src": "process", "type": type_, "name": name, "role": role, "pid": pid,
             "code": code, "signal": signal}
    if type_ == "exit":
        event["killed"] = signal is not None if killed is None else killed
    return event


def submit(t, job_id, result="created", payload_hash="h1", duplicate=False):
    return {"t": t, "src": "runner", "type": "submit", "job": job_id,
            "payload_hash": payload_hash, "result": result, "duplicate": duplicate}


def delivered_job(job_id, t0=1.0, worker=W1, token=1):
    """The full audit and ledger story of one job delivered cleanly by one worker."""
    events = [submit(t0, job_id), job(t0, job_id, None, "pending", "submit", 0, op="insert")]
    t = t0 + 0.1
    events.append(job(t, job_id, "pending", "fetching", worker, token, old_token=token - 1,
                      claims=1, lease_until=t + 2))
    for step, working, done, nxt in (("fetch", "fetching", "fetched", "extracting"),
                                     ("extract", "extracting", "extracted", "verifying"),
                                     ("verify", "verifying", "verified", "delivering")):
        events.append(call(t + 0.01, t + 0.05, job_id, step, worker))
        events.append(memo(t + 0.06, job_id, step, worker, token))
        events.append(spend(t + 0.06, job_id, step, worker, token, started=t + 0.01))
        events.append(job(t + 0.06, job_id, working, done, worker, token))
        events.append(job(t + 0.06, job_id, done, nxt, worker, token, claims=1,
                          lease_until=t + 2.06))  # moving on renews the lease, as it does
        t += 0.1
    events.append(memo(t, job_id, "deliver", worker, token, cost=0.0))
    events.append(job(t, job_id, "delivering", "delivered", worker, token))
    for row, kind in ((1, "charge"), (2, "notify")):
        events.append(outbox(t, row, job_id, kind, worker, 0, op="insert"))
    return events


# -- added for the outbox and liveness checkers ----------------------------------------------

def sent_effect(t, job_id, kind, row, *, sender=S1, token=1, status=201, outcome="applied",
                applied=True, key="auto", mark=True, lease_until=None):
    """A sender's claim of an outbox row, its receiver request and (mark) its sent_at mark."""
    claim = outbox(t, row, job_id, kind, sender, token, old_token=token - 1, attempts=token,
                   lease_until=lease_until)
    events = [claim, request(t + 0.01, t + 0.02, job_id, kind, key=key, worker=sender, n=token,
                             status=status, outcome=outcome, applied=applied)]
    if mark:
        events.append(outbox(t + 0.03, row, job_id, kind, sender, token, attempts=token,
                             sent_at=t + 0.03))
    return events


def delivered_with_effects(job_id, t0=1.0, sender=S1, **job_kw):
    """`delivered_job` plus a clean send of its charge and notify effects."""
    events = delivered_job(job_id, t0, **job_kw)
    for row, kind in ((1, "charge"), (2, "notify")):
        events += sent_effect(t0 + 0.5 + row * 0.1, job_id, kind, row, sender=sender)
    return events


def snapshot_with_effects(history, **overrides) -> dict:
    """`snapshot_of(history)` plus the outbox rows as last audited, the spend the audit
    recorded and the receiver's applied list from its ledger; override any key."""
    rows, spends, applied = {}, [], []
    for e in history:
        kind = (e["src"], e["type"])
        if e["src"] == "engine" and e["type"].startswith("effect_"):
            rows[(e["job"], e["kind"])] = {
                "row": e["row"], "job": e["job"], "kind": e["kind"],
                "key": f"{e['job']}:{e['kind']}", "sent_at": e["sent_at"], "dead_at": e["dead_at"],
                "attempts": e["attempts"], "last_error": e["last_error"]}
        elif kind == ("engine", "billed"):
            spends.append({"job": e["job"], "step": e["step"], "worker": e["worker"],
                           "pid": e["pid"], "token": e["token"], "started": e["started"],
                           "ended": e["ended"], "outcome": e["outcome"], "cost": e["cost"]})
        elif kind == ("receiver", "request") and e["applied"]:
            applied.append({"id": e["effect_id"] or f"eff_{len(applied) + 1}", "key": e["key"],
                            "job": e["job"], "kind": e["kind"], "t": e["t"]})
    derived = {"outbox": list(rows.values()), "spend": spends, "receiver_applied": applied}
    return snapshot_of(history, **{**derived, **overrides})


# -- snapshots from histories, and a recorded audit of a real store ---------------------------

def snapshot_of(history, **overrides) -> dict:
    """A snapshot whose jobs, memos and submitted ids are what `history` leaves behind."""
    jobs, memos = {}, {}
    for e in history:
        if e["src"] == "engine" and e["type"] in ("submitted", "claimed", "state"):
            jobs[e["job"]] = {"state": e["to"], "attempts": e.get("attempts", 0),
                              "claims": e.get("claims", 0), "token": e["token"],
                              "last_error": e.get("last_error"), "cause": e.get("cause"),
                              "payload_hash": e.get("payload_hash"),
                              "next_run_at": e.get("next_run_at"),
                              "lease_until": e.get("lease_until", 0.0)}
        elif e["src"] == "engine" and e["type"] == "memo":
            if e["op"] == "insert":
                memos[(e["job"], e["step"])] = {"job": e["job"], "step": e["step"],
                                                "cost": e["cost"], "worker": e["worker"],
                                                "token": e["token"], "at": e["t"]}
            else:
                memos.pop((e["job"], e["step"]), None)
    submitted = list(dict.fromkeys(e["job"] for e in history
                                   if e["src"] == "runner" and e["type"] == "submit"))
    base = {"jobs": jobs, "memos": list(memos.values()), "submitted": submitted}
    return snapshot(**{**base, **overrides})


_AUDIT_JOB = ("json_object('t', audit_now(), 'src', 'audit', 'type', 'job', 'op', '{op}',"
              " 'job', NEW.id, 'from', {frm}, 'to', NEW.state, 'writer', NEW.updated_by,"
              " 'token', NEW.lease_token, 'old_token', {old}.lease_token, 'claims', NEW.claims,"
              " 'attempts', NEW.attempts, 'lease_until', NEW.lease_until, 'lease_owner',"
              " NEW.lease_owner, 'next_run_at', NEW.next_run_at, 'last_error', NEW.last_error,"
              " 'payload_hash', NEW.payload)")
_AUDIT_MEMO = ("json_object('t', audit_now(), 'src', 'audit', 'type', 'memo', 'op', '{op}',"
               " 'job', {r}.job_id, 'step', {r}.step, 'writer', {r}.worker, 'token',"
               " {r}.lease_token, 'cost', {r}.cost)")
_AUDIT_OUTBOX = ("json_object('t', audit_now(), 'src', 'audit', 'type', 'outbox', 'op', '{op}',"
                 " 'row', NEW.id, 'job', NEW.job_id, 'kind', NEW.kind, 'writer', NEW.updated_by,"
                 " 'token', NEW.lease_token, 'old_token', {old}.lease_token, 'attempts',"
                 " NEW.attempts, 'sent_at', NEW.sent_at, 'dead_at', NEW.dead_at, 'lease_owner',"
                 " NEW.lease_owner, 'last_error', NEW.last_error)")
_AUDIT_SPEND = ("json_object('t', audit_now(), 'src', 'audit', 'type', 'spend', 'job',"
                " NEW.job_id, 'step', NEW.step, 'worker', NEW.worker, 'token', NEW.lease_token,"
                " 'started', NEW.started, 'ended', NEW.ended, 'outcome', NEW.outcome, 'cost',"
                " NEW.cost, 'error', NEW.error)")
_AUDIT_TRIGGERS = {
    "job_insert": ("AFTER INSERT ON job",
                   _AUDIT_JOB.format(op="insert", old="NEW", frm="NULL")),
    "job_update": ("AFTER UPDATE ON job",
                   _AUDIT_JOB.format(op="update", old="OLD", frm="OLD.state")),
    "memo_insert": ("AFTER INSERT ON step_result", _AUDIT_MEMO.format(op="insert", r="NEW")),
    "memo_delete": ("AFTER DELETE ON step_result", _AUDIT_MEMO.format(op="delete", r="OLD")),
    "outbox_insert": ("AFTER INSERT ON outbox", _AUDIT_OUTBOX.format(op="insert", old="NEW")),
    "outbox_update": ("AFTER UPDATE ON outbox", _AUDIT_OUTBOX.format(op="update", old="OLD")),
    "spend_insert": ("AFTER INSERT ON spend", _AUDIT_SPEND),
}


def install_audit(store, clock) -> None:
    """Record every committed change of `store`'s tables as history events (in a table of the
    same database, in the same transaction), stamped with `clock`: a stand-in for the
    runner's audit observer, so checker tests can read what the real engine writes.
    Only writes through `store`'s own connection are stamped (the function lives there)."""
    store.conn.create_function("audit_now", 0, clock.now)
    statements = ["CREATE TABLE IF NOT EXISTS audit_log (seq INTEGER PRIMARY KEY, event TEXT)"]
    for name, (when, event) in _AUDIT_TRIGGERS.items():
        statements.append(f"CREATE TRIGGER audit_{name} {when} BEGIN"
                          f" INSERT INTO audit_log (event) VALUES ({event}); END")
    store.conn.executescript(";\n".join(statements) + ";")


def audit_events(store) -> list[dict]:
    """The events install_audit recorded, in commit order, as operations."""
    import json
    rows = store.conn.execute("SELECT event FROM audit_log ORDER BY seq").fetchall()
    events = []
    for (text,) in rows:
        row = json.loads(text)
        row.pop("src")
        row.setdefault("op", "insert")
        events.append(as_operation({**row, "table": row.pop("type")}))
    return events


class Ledger:
    """A stand-in for the provider's ledger when a test drives the real store by hand: each
    call advances the clock and is recorded as a provider call event."""

    def __init__(self, clock) -> None:
        self.clock, self.events = clock, []

    def call(self, job_id, step, worker, seconds=0.5, billed=0.01):
        """Make one call; returns the engine's Spend for it (started, ended, cost)."""
        from engine.store import Spend
        started = self.clock.now()
        self.clock.advance(seconds)
        ended = self.clock.now()
        self.events.append(call(started, ended, job_id, step, worker, billed=billed))
        return lambda claim: Spend(job_id, step, worker, claim.lease_token, started, ended,
                                   "ok", billed)


def fence_by_id_only(store) -> None:
    """Mutate `store` like the article's engine: its step completion is fenced by the job id
    only, so it matches whatever lease token the job holds now."""
    import dataclasses
    real = store.complete

    def complete(claim, *args, **kwargs):
        now_token = store.job(claim.job_id)["lease_token"]
        return real(dataclasses.replace(claim, lease_token=now_token), *args, **kwargs)
    store.complete = complete


def zombie_finish(store, clock, pipeline, lease=5.0):
    """The real engine's story of a takeover: W1 claims doc-1 and calls for 'fetch'; its lease
    expires; W2 re-claims and calls; then W1 finishes (its memo wins, its state update is
    fenced unless the store is mutated) and W2 finishes. Returns the merged history."""
    import json
    from engine.store import LeaseLost
    from chaos.history import merge
    install_audit(store, clock)
    ledger = Ledger(clock)
    store.submit("doc-1", pipeline, {"title": "t", "body": "b"}, clock.now())
    first = store.claim(pipeline, W1, clock.now(), lease, 8)
    spend_first = ledger.call("doc-1", "fetch", W1)
    clock.advance(lease)
    second = store.claim(pipeline, W2, clock.now(), lease, 8)
    spend_second = ledger.call("doc-1", "fetch", W2)
    output = json.dumps({"title": "t", "text": "b", "chars": 1})
    for claim, worker, spend in ((first, W1, spend_first), (second, W2, spend_second)):
        try:
            store.complete(claim, pipeline, worker, clock.now(), output=output, cost=0.01,
                           spend=spend(claim))
        except LeaseLost:
            pass
        clock.advance(0.1)
    return merge(audit_events(store), ledger.events)
