"""The article's outbox sender: select rows with sent_at IS NULL, perform the effect with the
row id as its idempotency key, set sent_at. A crash between performing and marking sends again
(at-least-once); the receiver's key makes that one effect.

The article is silent on the rest, completed here: a failed send counts an attempt and the row
waits for the next pass (there is no dead letter and no outbox lease, so two senders can send
the same row at once), and the sender names itself with the worker id, hostname:pid.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading

from chaos import probe

from . import calls, engine

log = logging.getLogger("article_engine.sender")


def send_once(conn: sqlite3.Connection, receiver_url: str, timeout: float,
              batch: int = 50) -> int:
    """One pass over the unsent rows (oldest first, at most `batch`); returns how many were
    sent."""
    rows = conn.execute("SELECT id, job_id, kind, payload FROM outbox WHERE sent_at IS NULL "
                        "ORDER BY id LIMIT ?", (batch,)).fetchall()
    sent = 0
    for row_id, job_id, kind, payload in rows:
        probe.point("sender.before_send", job_id)
        try:
            calls.send_effect(receiver_url, row_id, job_id, kind, json.loads(payload),
                              engine.WORKER, timeout)
        except Exception as exc:
            log.info("outbox row %s (%s %s): %r", row_id, job_id, kind, exc)
            conn.execute("UPDATE outbox SET attempts=attempts+1 WHERE id=?", (row_id,))
            conn.commit()
            continue
        probe.point("sender.after_send", job_id)
        conn.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=?",
                     (engine.now(), row_id))
        conn.commit()
        sent += 1
    return sent


def send(stop: threading.Event, receiver_url: str, timeout: float, poll: float) -> None:
    """Send until `stop` is set, sleeping `poll` seconds after a pass that sent nothing; an
    exception (a database locked past its timeout) is logged and the next pass tries again."""
    conn = engine.connect()
    try:
        while not stop.is_set():
            try:
                if send_once(conn, receiver_url, timeout):
                    continue
            except Exception:
                log.exception("outbox pass failed")
                conn.rollback()
            stop.wait(poll)
    finally:
        conn.close()
