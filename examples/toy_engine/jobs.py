"""The toy engine's job document and its state machine: pure functions from (doc, now) to doc.

A job's whole state is one JSON document: its status, the lease (owner, expiry), the claims
and failed attempts of the step it is on, the memoized step outputs and the effects it must
send. Nothing here touches the database; `store` swaps whole documents.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

#: (step, ready, working, done, calls the model)
STEPS = (("summarize", "queued", "summarizing", "summarized", True),
         ("publish", "summarized", "publishing", "published", False))
INITIAL = "queued"
PARKED = "stuck"
TERMINAL = ("published", "dropped")
READY = tuple(s[1] for s in STEPS)
WORKING = tuple(s[2] for s in STEPS)
STATES = (INITIAL, "summarizing", "summarized", "publishing", "published", PARKED, "dropped")
EFFECT_KIND = "post"


def canonical(value: Any) -> str:
    """The one JSON spelling of a payload. Raises ValueError for what JSON cannot hold."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None


def fingerprint(text: str) -> str:
    """length:first 40:last 40 characters of a canonical payload."""
    return f"{len(text)}:{text[:40]}:{text[-40:]}"


def idempotency_key(job: str, kind: str) -> str:
    """The receiver's key for one effect: derived from the job and kind alone, so every
    resend of the effect carries the same key."""
    return "toy-" + hashlib.sha256(f"{job}\x00{kind}".encode()).hexdigest()[:32]


def step_of(status: str) -> tuple[str, str, str, str, bool] | None:
    """The step whose ready or working state `status` is, or None."""
    for step in STEPS:
        if status in (step[1], step[2]):
            return step
    return None


def new_doc(payload: Any, now: float) -> dict:
    text = canonical(payload)
    return {"status": INITIAL, "payload": json.loads(text), "payload_hash": fingerprint(text),
            "owner": None, "lease_expires": None, "not_before": now, "attempts": 0,
            "claims": 0, "error": None, "cause": None, "step": STEPS[0][0],
            "actor": "submitter", "by": "submitter", "memo": {}, "effects": []}


def claimable(doc: dict, now: float) -> bool:
    """A ready job whose backoff is over, or a working job whose lease has lapsed."""
    if doc["status"] in READY:
        return doc["not_before"] <= now
    return doc["status"] in WORKING and (doc["lease_expires"] or 0.0) < now


def _write(doc: dict, actor: str, by: str, **changes: Any) -> dict:
    new = copy.deepcopy(doc)
    new.update(changes, actor=actor, by=by)
    return new


def claim(doc: dict, worker: str, now: float, lease: float, max_claims: int) -> dict:
    """Take the lease for the job's step (a resume when it is already working); past
    `max_claims` claims of one step the job is parked instead (a crash loop)."""
    name, _, working, _, _ = step_of(doc["status"])
    claims = doc["claims"] + 1
    if claims > max_claims:
        return park(doc, worker, f"crash loop: step {name} claimed {doc['claims']} times "
                    "without finishing", "crash_loop", claims=claims)
    return _write(doc, "worker", worker, status=working, owner=worker,
                  lease_expires=now + lease, claims=claims, step=name)


def finish(doc: dict, worker: str, now: float, output: Any = None, cost: float = 0.0,
           effect: dict | None = None) -> dict:
    """The step is done: memo its output (if it has one), queue its effect (if any), move to
    the done state and release the lease; the next step starts with fresh counters."""
    name, _, _, done, _ = step_of(doc["status"])
    new = _write(doc, "worker", worker, status=done, owner=None, lease_expires=None,
                 not_before=now, attempts=0, claims=0, error=None, cause=None)
    following = step_of(done)
    new["step"] = following[0] if following else name
    if output is not None and name not in new["memo"]:
        new["memo"][name] = {"output": output, "cost": cost, "by": worker, "at": now}
    if effect is not None:
        kind = effect["kind"]
        if not any(e["kind"] == kind for e in new["effects"]):
            new["effects"].append({
                "kind": kind, "key": idempotency_key(effect["job"], kind), "body": effect,
                "sent": False, "dead": False, "sent_at": None, "dead_at": None,
                "attempts": 0, "owner": None, "lease_expires": None, "not_before": now,
                "error": None, "by": worker})
    return new


def retry(doc: dict, worker: str, error: str, now: float, wait: float,
          max_attempts: int) -> dict:
    """A retryable failure: back to the ready state after `wait`, or parked once the
    step has failed `max_attempts` times."""
    attempts = doc["attempts"] + 1
    if attempts >= max_attempts:
        return park(doc, worker, f"parked after {attempts} failed attempts: {error}",
                    "attempts", attempts=attempts)
    _, ready, _, _, _ = step_of(doc["status"])
    return _write(doc, "worker", worker, status=ready, owner=None, lease_expires=None,
                  not_before=now + wait, attempts=attempts, error=error)


def park(doc: dict, by: str, error: str, cause: str, actor: str = "worker",
         **changes: Any) -> dict:
    """Give up on the job until an operator acts (poison, attempts, crash loop)."""
    return _write(doc, actor, by, status=PARKED, owner=None, lease_expires=None, error=error,
                  cause=cause, **changes)


class Refused(ValueError):
    """An operator action the job's status does not allow; the message says why."""


def cancel(doc: dict, by: str) -> dict:
    """Drop a job that has not finished (whoever holds its lease loses the swap)."""
    if doc["status"] in TERMINAL:
        raise Refused(f"job is {doc['status']}")
    return _write(doc, "operator", by, status="dropped", owner=None, lease_expires=None)


def requeue(doc: dict, by: str, now: float) -> dict:
    """Send a parked job back to the ready state of the step it parked in, counters reset."""
    if doc["status"] != PARKED:
        raise Refused(f"job is {doc['status']}, not {PARKED}")
    ready = next(s[1] for s in STEPS if s[0] == doc["step"])
    return _write(doc, "operator", by, status=ready, not_before=now, attempts=0, claims=0,
                  error=None, cause=None)


def resolve(doc: dict, by: str, now: float) -> dict:
    """Move a parked job past its step when that step's output is already memoized."""
    if doc["status"] != PARKED:
        raise Refused(f"job is {doc['status']}, not {PARKED}")
    step = next(s for s in STEPS if s[0] == doc["step"])
    if step[0] not in doc["memo"]:
        raise Refused(f"step {step[0]} has no memoized output; requeue the job instead")
    following = step_of(step[3])
    return _write(doc, "operator", by, status=step[3], not_before=now, attempts=0, claims=0,
                  error=None, cause=None, step=following[0] if following else step[0])
