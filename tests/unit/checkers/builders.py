"""Small builders for hand-made histories and snapshots, so checker tests read like stories."""
from __future__ import annotations

from engine import DOCUMENT

W1 = "worker:host:101:aaaa"
W2 = "worker:host:102:bbbb"
S1 = "sender:host:201:cccc"
OP = "operator:alice"


def pipeline_json(pipeline=DOCUMENT) -> dict:
    return {
        "name": pipeline.name,
        "steps": [{"name": s.name, "ready": s.ready, "working": s.working, "done": s.done,
                   "parked": s.parked, "alternate": s.alternate} for s in pipeline.steps],
        "edges": {k: list(v) for k, v in pipeline.edges.items()},
        "operator_edges": {k: list(v) for k, v in pipeline.operator_edges.items()},
        "terminal": sorted(pipeline.terminal), "parked": sorted(pipeline.parked_states),
        "ready": sorted(pipeline.ready_states), "working": sorted(pipeline.working_states),
    }


def snapshot(**overrides) -> dict:
    """A snapshot of a clean run with no jobs; override any key."""
    base = {
        "pipeline": pipeline_json(),
        "settings": {"lease": 2.0, "heartbeat": True, "heartbeat_interval": 0.0,
                     "call_timeout": 1.0, "max_attempts": 4, "max_claims": 8,
                     "backoff_base": 0.1, "backoff_cap": 2.0, "outbox_max_attempts": 6,
                     "keep_job": True},
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
    return {"t": t, "src": "audit", "type": "job", "op": op, "job": job_id, "from": frm,
            "to": to, "writer": writer, "token": token,
            "old_token": token if old_token is None else old_token, "claims": claims,
            "attempts": attempts, "lease_until": lease_until,
            "lease_owner": writer if to.endswith("ing") else None, "next_run_at": next_run_at,
            "last_error": last_error, "payload_hash": payload_hash}


def memo(t, job_id, step, writer, token, cost=0.01, op="insert"):
    return {"t": t, "src": "audit", "type": "memo", "op": op, "job": job_id, "step": step,
            "writer": writer, "token": token, "cost": cost}


def outbox(t, row, job_id, kind, writer, token, *, op="update", old_token=None, attempts=0,
           sent_at=None, dead_at=None, last_error=None):
    return {"t": t, "src": "audit", "type": "outbox", "op": op, "row": row, "job": job_id,
            "kind": kind, "writer": writer, "token": token,
            "old_token": token if old_token is None else old_token, "attempts": attempts,
            "sent_at": sent_at, "dead_at": dead_at, "lease_owner": None, "last_error": last_error}


def spend(t, job_id, step, worker, token, outcome="ok", cost=0.01, started=None, error=None):
    return {"t": t, "src": "audit", "type": "spend", "job": job_id, "step": step,
            "worker": worker, "token": token, "started": t - 0.1 if started is None else started,
            "ended": t, "outcome": outcome, "cost": cost, "error": error}


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


def process(t, type_, name, pid, role="worker", code=None, signal=None):
    return {"t": t, "src": "process", "type": type_, "name": name, "role": role, "pid": pid,
            "code": code, "signal": signal}


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
        events.append(job(t + 0.06, job_id, done, nxt, worker, token, claims=1))
        t += 0.1
    events.append(memo(t, job_id, "deliver", worker, token, cost=0.0))
    events.append(job(t, job_id, "delivering", "delivered", worker, token))
    for row, kind in ((1, "charge"), (2, "notify")):
        events.append(outbox(t, row, job_id, kind, worker, 0, op="insert"))
    return events
