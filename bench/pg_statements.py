"""The benchmarks' PostgreSQL server, and a count of the statements an engine sends it.

BenchServer is chaos.run.pgserver's server with PostgreSQL's own durability defaults: fsync and
full_page_writes on, so `synchronous_commit=on` means a commit waits for the disk, as
SQLite's FULL does. (The tests' server turns fsync off: its durability is not under test.)

StatementCounter counts, inside an engine's process, every statement that process sends
through psycopg (sync and async cursors, every connection, every thread), the round trips
they took (statements batched in psycopg's pipeline mode share one) and the time it waited
for each. It patches psycopg's cursors and pipelines in that process only: it measures the
engine as it is and changes nothing the engine does.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.run.pgserver import PostgresServer  # noqa: E402


class BenchServer(PostgresServer):
    """A PostgreSQL server for a benchmark: PostgreSQL's durable defaults."""

    def _pg_ctl_start(self) -> None:
        options = (f"-k {self.folder} -c listen_addresses=127.0.0.1 -p {self.port}"
                   " -c max_connections=200")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")

    def version(self) -> str:
        """The server's version, e.g. "15.14"."""
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute("SHOW server_version").fetchone()[0].split()[0]

    def database(self, sync: str) -> str:
        """A new empty database whose sessions commit at `sync` unless they say otherwise:
        FULL is synchronous_commit=on, NORMAL off (a server crash may lose the last
        commits, never corrupt). Returns its URL."""
        url = self.create_database(empty=True)
        name = url.rsplit("/", 1)[1]
        self._execute(f"ALTER DATABASE {name} SET synchronous_commit = "
                      f"{'on' if sync == 'FULL' else 'off'}")
        return url


class StatementCounter:
    """Statements, round trips and seconds waited per statement text, for the process that
    installs it.

    A statement executed on its own is one round trip. Statements sent together in
    psycopg's pipeline mode share one: the batch's round trip, and the wait for it at the
    pipeline's end, are the last statement's of the batch (the one whose result was
    wanted), and the others count as statements with no round trip of their own.
    """

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
        self._lock = threading.Lock()
        self._batches = threading.local()  # the pipelines open in each thread

    def _record(self, query: object, seconds: float) -> None:
        text = " ".join(str(getattr(query, "as_string", lambda: query)()
                            if not isinstance(query, (str, bytes)) else query).split())
        batches = getattr(self._batches, "open", None)
        with self._lock:
            entry = self.calls[text]
            entry[0] += 1
            entry[2] += seconds
            if batches:
                batches[-1][0] = text  # its round trip is the batch's, counted at its end
            else:
                entry[1] += 1

    def _synced(self, batch: list, seconds: float) -> None:
        with self._lock:
            entry = self.calls[batch[0] if batch[0] is not None else "(pipeline sync)"]
            entry[1] += 1
            entry[2] += seconds

    def install(self) -> "StatementCounter":
        """Count every execute() of psycopg's Cursor and AsyncCursor in this process, and
        every pipeline of its Connection."""
        import psycopg
        sync_execute, async_execute = psycopg.Cursor.execute, psycopg.AsyncCursor.execute
        open_pipeline = psycopg.Connection.pipeline
        counter = self

        def execute(cur, query, *args, **kwargs):
            start = time.perf_counter()
            try:
                return sync_execute(cur, query, *args, **kwargs)
            finally:
                counter._record(query, time.perf_counter() - start)

        async def execute_async(cur, query, *args, **kwargs):
            start = time.perf_counter()
            try:
                return await async_execute(cur, query, *args, **kwargs)
            finally:
                counter._record(query, time.perf_counter() - start)

        @contextmanager
        def pipeline(conn):
            batch = [None, 0.0]  # the last statement sent, when the batch was sent
            batches = counter._batches.__dict__.setdefault("open", [])
            batches.append(batch)
            try:
                with open_pipeline(conn) as pipe:
                    try:
                        yield pipe
                    finally:
                        batch[1] = time.perf_counter()  # the sync (the wait) comes next
            finally:
                batches.pop()
                counter._synced(batch, time.perf_counter() - batch[1])

        psycopg.Cursor.execute, psycopg.AsyncCursor.execute = execute, execute_async
        psycopg.Connection.pipeline = pipeline
        return self

    def dump(self, folder: str) -> None:
        """Write the counts to `folder`/<pid>.json."""
        with self._lock:
            rows = [[text, int(n), int(trips), s] for text, (n, trips, s) in self.calls.items()]
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(rows))


def read_counts(folder: str) -> list[tuple[str, int, int, float]]:
    """Every process's counts in `folder`: (statement text, statements, round trips,
    seconds waited)."""
    return [tuple(row) for path in sorted(Path(folder).glob("*.json"))
            for row in json.loads(path.read_text())]


@dataclass
class Mechanism:
    """A share of the statements: what it is for, what it belongs to (a mechanism the
    benchmark reports apart, or "" for what any durable queue does), and how to know its
    statements (searched in the text, case-insensitive)."""

    name: str
    pattern: str
    part: str = ""


#: The reference engine's statements by what they serve, first match wins.
REFERENCE = [
    Mechanism("BEGIN", r"^begin\b"),
    Mechanism("COMMIT (waits for the disk at FULL)", r"^(commit|rollback)\b"),
    Mechanism("transaction id (for a lost COMMIT)", r"pg_current_xact_id"),
    # the claim reads the job's memos too (a join), in the one statement that leases it
    Mechanism("claim (leased, fenced)", r"skip locked|^with due as"),
    Mechanism("memo: the step's output", r"^insert into step_result\b", "memo"),
    Mechanism("memo: looked up before the call", r"\bfrom step_result\b", "memo"),
    Mechanism("spend record of each call", r"^insert into spend\b", "spend records"),
    Mechanism("outbox rows", r"\boutbox\b", "outbox"),
    Mechanism("lease: kept into the next step", r"^update job set state=\S+ claims=1,",
              "leases"),
    Mechanism("lease: heartbeat", r"^update job set lease_until", "leases"),
    Mechanism("state transition (fenced)", r"^update job set state"),
    Mechanism("idle check", r"count\(\*\)"),
    Mechanism("session setup", r"^set\b"),
]

#: procrastinate's statements by what they serve. Each is a transaction of its own
#: (autocommit): a defer, a fetch and a finish each commit, and wait for the disk at FULL.
PROCRASTINATE = [
    Mechanism("defer the next step", r"procrastinate_defer_jobs"),
    Mechanism("fetch (claim)", r"procrastinate_fetch_job"),
    Mechanism("finish (state transition)", r"procrastinate_finish_job"),
    Mechanism("worker register, heartbeat", r"procrastinate_\w*worker"),
    Mechanism("listen", r"^listen\b"),
    # the pool procrastinate makes checks each connection it hands out with an empty query
    Mechanism("pool's check of a connection", r"^$"),
]


def by_mechanism(rows: list[tuple[str, int, int, float]], mechanisms: list[Mechanism],
                 jobs: int) -> list[tuple[Mechanism, float, float, float]]:
    """(mechanism, statements, round trips and ms waited per job), in `mechanisms` order,
    then "other" for what none matches (left out when nothing is)."""
    other = Mechanism("other", "")
    totals: dict[str, list] = {m.name: [m, 0, 0, 0.0] for m in [*mechanisms, other]}
    for query, calls, trips, seconds in rows:
        found = next((m for m in mechanisms if re.search(m.pattern, query, re.IGNORECASE)),
                     other)
        totals[found.name][1] += calls
        totals[found.name][2] += trips
        totals[found.name][3] += seconds
    return [(m, calls / jobs, trips / jobs, 1000 * seconds / jobs)
            for m, calls, trips, seconds in totals.values() if calls or m is not other]
