"""Planted bugs of the article engine: each ONE more mechanism removed from the article's
code, documented with the guarantee it breaks, and an adapter for `--engine`:

    ninelives sim lost-lease --engine examples.article_engine.planted:HEARTBEAT_ANY

The article's engine has bugs of its own (its README's table): a planted bug is caught when
the invariant its docstring names fails with the witness of this bug, which the published
engine does not give at the same seeds. A real run starts its processes as
`python -m examples.article_engine.planted NAME ROLE ...`: the article's command line with
the planted function in place of the article's.
"""
from __future__ import annotations

import json
import sys
from types import ModuleType
from typing import Any, Callable

from chaos import probe
from chaos.contract import Command, ProcessContext

from .adapter import ArticleEngine
from .inprocess import QUIET, ArticleInProcess, fresh


def heartbeat_any(engine: ModuleType) -> Callable:
    """The heartbeat extends the job's lease by the job's id alone, whoever holds it.

    Breaks: only a lease's holder renews it (the article's `AND lease_owner=?`). A zombie's
    heartbeat thread (its worker paused past its lease, its job claimed by another since)
    goes on moving the new holder's lease.

    Not caught, measured: the article's rows keep no writer, and its observer reads a
    renewal as its owner's (the published heartbeat writes only where `lease_owner` is the
    writer), so the zombie's renewal reads as the new holder's own. Under
    `scenarios/aim-zombie-heartbeat.toml` the zombie's beat lands on the new holder's lease
    and the history shows a heartbeat by that holder. A blind spot of an observer that
    trusts the engine's guard, kept here to be measured, not a bug the harness finds."""
    def heartbeat(conn, job_id):
        conn.execute("UPDATE job SET lease_until=? WHERE id=?",
                     (engine.now() + engine.LEASE_SECONDS, job_id))
        conn.commit()
    return heartbeat


def send_once_marked_first(engine: ModuleType, calls: ModuleType) -> Callable:
    """The sender sets a row's `sent_at` before it performs the effect.

    Breaks: a row is marked sent only once the receiver has it. A sender killed between the
    mark and the send, or whose send fails, leaves a row marked sent that the receiver never
    applied, and no pass sends it again (`effects-complete`)."""
    def send_once(conn, receiver_url, timeout, batch=50):
        rows = conn.execute("SELECT id, job_id, kind, payload FROM outbox WHERE sent_at IS NULL "
                            "ORDER BY id LIMIT ?", (batch,)).fetchall()
        sent = 0
        for row_id, job_id, kind, payload in rows:
            conn.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=?",
                         (engine.now(), row_id))
            conn.commit()
            probe.point("sender.before_send", job_id)
            try:
                calls.send_effect(receiver_url, row_id, job_id, kind, json.loads(payload),
                                  engine.WORKER, timeout)
            except Exception:
                continue     # already marked sent: no pass tries it again
            probe.point("sender.after_send", job_id)
            sent += 1
        return sent
    return send_once


#: name -> (what it replaces: "engine.heartbeat" or "sender.send_once", its maker)
PLANTED = {"heartbeat_any": "engine", "sent_before_send": "sender"}


def plant(name: str, engine: ModuleType, sender: ModuleType | None = None) -> None:
    """Put planted bug `name` into this process's copy of the article's modules."""
    from . import calls
    if name == "heartbeat_any":
        engine.heartbeat = heartbeat_any(engine)
    elif sender is not None:
        sender.send_once = send_once_marked_first(engine, calls)


class PlantedInProcess(ArticleInProcess):
    """The article's in-process hooks, each process's copy of its modules planted."""

    def __init__(self, adapter: "PlantedArticle") -> None:
        super().__init__(adapter)

    def _process(self, proc, role: str) -> tuple[ModuleType, Any]:
        engine, args = super()._process(proc, role)
        plant(self.adapter.planted, engine)
        return engine, args

    def sender(self, proc) -> None:
        engine, args = self._process(proc, "sender")
        sender = fresh("sender")
        sender.engine, sender.log = engine, QUIET
        plant(self.adapter.planted, engine, sender)
        sender.send(proc.stop, args.receiver_url, args.send_timeout, args.poll)


class PlantedArticle(ArticleEngine):
    """The article's adapter, whose processes run planted bug `planted`."""

    def __init__(self, planted: str) -> None:
        if planted not in PLANTED:
            raise ValueError(f"no planted bug {planted!r} (known: {', '.join(PLANTED)})")
        self.planted = planted
        super().__init__(f"article:{planted}")
        self.in_process = PlantedInProcess(self)

    def command(self, role: str, ctx: ProcessContext) -> Command:
        command = super().command(role, ctx)
        module = command.argv.index("examples.article_engine")
        return Command([*command.argv[:module], "examples.article_engine.planted",
                        self.planted, *command.argv[module + 1:]], command.env)


HEARTBEAT_ANY = PlantedArticle("heartbeat_any")
SENT_BEFORE_SEND = PlantedArticle("sent_before_send")


def main(argv: list[str]) -> int:
    """`python -m examples.article_engine.planted NAME ROLE [flags...]`: the article's command
    line with planted bug NAME."""
    if not argv or argv[0] not in PLANTED:
        print(f"usage: python -m examples.article_engine.planted NAME ROLE [flags...]; NAME "
              f"is one of: {', '.join(PLANTED)}", file=sys.stderr)
        return 2
    from . import __main__ as cli, engine, sender
    plant(argv[0], engine, sender)
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
