"""The toy engine's observer: triggers that copy every job document's old and new text into
an audit table in the same transaction, and the diff that reads each pair as the history's
operations (see `chaos.history`). The engine knows nothing of it."""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from chaos.history import Event

from . import jobs

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
AUDIT = ("CREATE TABLE IF NOT EXISTS toy_audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
         " key TEXT NOT NULL, old TEXT, new TEXT)")
TRIGGERS = {
    "insert": "NULL, NEW.doc", "update": "OLD.doc, NEW.doc", "delete": "OLD.doc, NULL"}
#: the document fields whose change is a write to the job itself (not only to its effects).
JOB_FIELDS = ("status", "owner", "lease_expires", "not_before", "attempts", "claims", "error",
              "cause")


def install(conn: sqlite3.Connection, now: str = NOW) -> None:
    """Create the audit table and its triggers (idempotent), stamping with the SQL `now`."""
    conn.execute(AUDIT)
    for op, values in TRIGGERS.items():
        key = "OLD.key" if op == "delete" else "NEW.key"
        conn.execute(f"CREATE TRIGGER IF NOT EXISTS toy_audit_{op} AFTER {op.upper()} ON work"
                     f" BEGIN INSERT INTO toy_audit (t, key, old, new)"
                     f" VALUES ({now}, {key}, {values}); END")


def read(conn: sqlite3.Connection) -> list[Event]:
    """Every audit row as operations, in commit order."""
    events: list[Event] = []
    for seq, t, key, old, new in conn.execute(
            "SELECT seq, t, key, old, new FROM toy_audit ORDER BY seq"):
        base = {"t": t, "src": "engine", "seq": seq, "completion": "ok", "job": key}
        events += [{**base, **op} for op in diff(
            key, json.loads(old) if old else None, json.loads(new) if new else None)]
    return events


def pid_of(writer: str | None) -> int | None:
    """The process id inside a toy writer id (toy-<pid>-<random>), or None."""
    parts = (writer or "").split("-")
    try:
        return int(parts[1]) if len(parts) == 3 and parts[0] == "toy" else None
    except ValueError:
        return None


def diff(key: str, old: dict | None, new: dict | None) -> list[dict[str, Any]]:
    """The operations one document write stands for: memos and effects first (they commit
    with the state change that follows them), then the job's own change."""
    if old is None:
        return [{"type": "submitted", "state": new["status"], "from": None,
                 "to": new["status"], "payload_hash": new["payload_hash"]}]
    if new is None:
        return [{"type": "removed", "from": old["status"], "to": None}]
    ops = [_memo(step, memo) for step, memo in new["memo"].items() if step not in old["memo"]]
    ops += _effects(key, old, new)
    if any(old.get(f) != new.get(f) for f in JOB_FIELDS):
        ops.append(_job(old, new))
    return ops


def _who(writer: str | None) -> dict:
    return {"worker": writer, "pid": pid_of(writer), "token": None}


def _memo(step: str, memo: dict) -> dict:
    return {"type": "memo", "op": "insert", "step": step, "cost": memo["cost"],
            "actor": "worker", **_who(memo["by"])}


def _job(old: dict, new: dict) -> dict:
    common = {"from": old["status"], "to": new["status"], "attempts": new["attempts"],
              "claims": new["claims"], "lease_until": new["lease_expires"], **_who(new["by"])}
    if (new["actor"] == "worker" and new["status"] in jobs.WORKING and new["owner"]
            and new["claims"] != old["claims"]):
        return {"type": "claimed", "step": new["step"], "continued": False, **common}
    # A claim that finds a crash loop parks the job instead of taking it: counted all the same.
    took = new["actor"] == "worker" and new["claims"] > old["claims"]
    return {"type": "state", "actor": new["actor"], "next_run_at": new["not_before"],
            "last_error": new["error"], "cause": new["cause"], "heartbeat": False,
            "took_lease": took, **common}


def _effects(key: str, old: dict, new: dict) -> list[dict]:
    before = {e["kind"]: e for e in old["effects"]}
    ops = []
    for effect in new["effects"]:
        kind, prior = effect["kind"], before.get(effect["kind"])
        row = {"row": f"{key}/{kind}", "kind": kind}
        if prior is None:
            ops.append({"type": "effect_queued", "key": effect["key"], **row})
            continue
        if prior == effect:
            continue
        who = {**_who(effect["by"]), "actor": "harness" if effect["by"] == "harness"
               else "sender", "attempts": effect["attempts"]}
        if effect["sent"] and not prior["sent"]:
            ops.append({"type": "effect_sent", **row, **who})
        elif effect["owner"] and effect["owner"] != prior["owner"]:
            ops.append({"type": "effect_claimed", **row, **who,
                        "lease_until": effect["lease_expires"]})
        else:
            ops.append({"type": "effect_state", **row, **who, "sent": effect["sent"],
                        "dead": effect["dead"], "sent_at": effect.get("sent_at"),
                        "dead_at": effect.get("dead_at"), "last_error": effect["error"],
                        "lease_until": effect["lease_expires"]})
    return ops

