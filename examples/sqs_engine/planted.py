"""Planted bugs of the SQS engine: each a subclass of its Worker with ONE mechanism removed,
documented with the guarantee it breaks, and an adapter for `--engine`:

    ninelives sim lost-lease --engine examples.sqs_engine.planted:UNFENCED_DELETE

The engine itself (`examples.sqs_engine.adapter:SQS`) is correct; these are not.
"""
from __future__ import annotations

import sqlite3

from chaos import probe

from . import store
from .adapter import SqsEngine
from .sender import Sender
from .worker import Worker


class UnfencedDeleteWorker(Worker):
    """The completion deletes its task by id alone, without checking the receipt.

    Breaks: a receipt fences its holder. A worker whose visibility ran out and whose task
    another worker has received since (a zombie: paused, or slower than its heartbeat) still
    deletes the task and completes the step, over the new holder's lease
    (`fenced-writes`)."""

    def complete(self, held, output=None, cost=0.0, effects=()) -> None:
        with store.write(self.conn):
            if self.conn.execute("DELETE FROM task WHERE id=?", (held.task,)).rowcount != 1:
                raise store.Lost(f"task {held.step} of {held.job} is gone")
            store.finish_job(self.conn, held, self.id, self.clock(), output, cost, effects)


class HeartbeatAnyWorker(Worker):
    """The heartbeat extends the task's visibility by its id alone, whoever holds it now.

    Breaks: only a task's holder keeps it. A zombie's heartbeat (its task received by
    another worker since) goes on moving the new holder's lease, under its own stale receipt
    (`fenced-writes`, `lease-kept`)."""

    def extend(self, conn: sqlite3.Connection, held) -> bool:
        with store.write(conn):
            return conn.execute(
                "UPDATE task SET visible_at=?, beats=beats+1, beat_by=?, beat_receipt=?"
                " WHERE id=?", (self.clock() + self.settings.visibility, self.id, held.receipt,
                                held.task)).rowcount == 1


#: How long a popped task stays invisible: for good, within any run.
FOREVER = 1e9


class PopOnReceiveWorker(Worker):
    """A received task is popped off the queue: invisible for good, not for a visibility
    timeout (a consumer that acknowledges a task as it takes it, as a list pop or an
    auto-acknowledging subscription does).

    Breaks: a task outlives a holder that dies. A worker SIGKILLed mid-step takes its task
    with it: no other worker ever receives it again, and its job stays in its working state
    for good (`all-jobs-settle`)."""

    def tick(self) -> bool:
        held = store.receive(self.conn, self.id, self.clock(), FOREVER,
                             self.settings.max_receives, store.new_receipt(self.rng))
        if held is None:
            return False
        probe.point("after_receive", held.job)
        try:
            self.work(held)
        except store.Lost:
            pass
        return True

    def extend(self, conn: sqlite3.Connection, held) -> bool:
        return True  # nothing to extend: the task is never visible again


PLANTED = {"unfenced_delete": (UnfencedDeleteWorker, Sender),
           "heartbeat_any": (HeartbeatAnyWorker, Sender),
           "pop_on_receive": (PopOnReceiveWorker, Sender)}


def loops(name: str | None) -> tuple[type, type]:
    """The (Worker, Sender) classes of planted bug `name`, or the engine's for None."""
    if name is None:
        return Worker, Sender
    try:
        return PLANTED[name]
    except KeyError:
        raise ValueError(f"no planted bug {name!r} (known: {', '.join(PLANTED)})") from None


UNFENCED_DELETE = SqsEngine("unfenced_delete")
HEARTBEAT_ANY = SqsEngine("heartbeat_any")
POP_ON_RECEIVE = SqsEngine("pop_on_receive")
