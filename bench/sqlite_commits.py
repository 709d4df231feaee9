"""A count of the SQLite transactions a process commits: at synchronous=FULL in WAL mode each
commit is one fsync of the log, so commits per job is what the disk is asked for a job.

CommitCounter patches sqlite3.connect in the process that installs it, so that every
connection opened afterwards (every slot's, the heartbeat's) reports each statement it runs
to a trace callback, which counts the COMMITs. It measures the engine as it is and changes
nothing it does; the callback costs well under a microsecond a statement.
"""
from __future__ import annotations

import sqlite3
import threading

#: How a statement that ends a write transaction begins (`END` is SQLite's synonym).
COMMIT_WORDS = ("COMMIT", "END")


class CommitCounter:
    """Commits by every SQLite connection this process opens after `install()`."""

    def __init__(self) -> None:
        self.commits = 0
        self._lock = threading.Lock()  # slots commit from several threads

    def _trace(self, statement: str) -> None:
        if statement.lstrip()[:6].upper().startswith(COMMIT_WORDS):
            with self._lock:
                self.commits += 1

    def install(self) -> "CommitCounter":
        """Count the commits of every connection sqlite3.connect opens from now on, in this
        process; returns self."""
        connect = sqlite3.connect

        def counting_connect(*args, **kwargs):
            conn = connect(*args, **kwargs)
            conn.set_trace_callback(self._trace)
            return conn

        sqlite3.connect = counting_connect
        return self
