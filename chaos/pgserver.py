"""A PostgreSQL server of our own, for a chaos run (`ninelives run --backend postgres`) or a
test session: `initdb` and `pg_ctl start` in a temporary folder, on a unix socket in that
folder and 127.0.0.1 on a free port, stopped with `pg_ctl stop -m fast`; new databases made
from a template (empty, or prepared once by the caller: the tests' is migrated).

No orphan server: beside it runs a watchdog (this file run as a script) in its own session,
which polls the pid of the process that started the server and, when that process is gone
(a run or a test session killed with SIGKILL), stops the server and removes the folder. postgres cannot
have PR_SET_PDEATHSIG (pg_ctl daemonises it), so the watch is a pid check instead.

As root (postgres refuses to run as root) the folder belongs to `nobody` and initdb, pg_ctl
and the server run as that user through `runuser -u nobody --` (util-linux, on every Debian
system; it needs no password and no PAM session when root calls it).
"""
from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

INSTALL_HINT = ("PostgreSQL's server binaries (initdb, pg_ctl, postgres) were not found, through "
                "`pg_config --bindir` or in /usr/lib/postgresql/*/bin. `make test` installs them "
                "(apt-get install postgresql) where it runs as root; elsewhere install "
                "PostgreSQL yourself. The PostgreSQL backend tests never skip.")
SUPERUSER = "postgres"
TEMPLATE = "ninelives_template"


class ServerError(RuntimeError):
    """The server could not be found, started or used; the message says why (INSTALL_HINT
    when its binaries are missing)."""


def find_bindir() -> Path:
    """Where initdb and pg_ctl are. Raises ServerError with INSTALL_HINT when nowhere."""
    candidates = []
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)  # newest first
    for folder in candidates:
        if all(os.access(os.path.join(folder, tool), os.X_OK)
               for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    raise ServerError(INSTALL_HINT)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One server in a folder of its own, for the lifetime of a run or a test session.

    `start(prepare=None)` initialises and starts it (and its watchdog), and hands the URL of
    the template database to `prepare` (the tests migrate it once); `stop()` stops it and
    removes the folder, and is safe to call twice. `create_database()` returns the URL of a
    new database copied from the template (or an empty one with `empty=True`). Raises
    ServerError when the binaries are missing or a step fails (the server is then stopped).
    Also a context manager: started on entry, stopped on exit.
    """

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.as_root = os.geteuid() == 0
        self.folder = Path(tempfile.mkdtemp(prefix="ninelives-pg-"))
        self.data, self.log = self.folder / "data", self.folder / "server.log"
        self.port = free_port()
        self.watchdog: subprocess.Popen | None = None
        self._names = itertools.count(1)
        self.running = False

    @property
    def url(self) -> str:
        """The URL of the `postgres` maintenance database (superuser, trust auth)."""
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """The URL of database `dbname` on this server, over 127.0.0.1."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self.as_root:
            command = ["runuser", "-u", "nobody", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise ServerError(f"{' '.join(command)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}{log}")
        return done

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, prepare: Callable[[str], None] | None = None) -> "PostgresServer":
        """Start the server (see the class); on any failure it is stopped again."""
        try:
            self._start(prepare)
        except BaseException:
            self.stop()  # a half-started server is never left behind
            raise
        return self

    def _start(self, prepare: Callable[[str], None] | None) -> None:
        if self.as_root:
            shutil.chown(self.folder, "nobody")
        self.folder.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self._start_watchdog()
        self._pg_ctl_start()
        self.running = True
        self._execute(f"CREATE DATABASE {TEMPLATE}")
        if prepare is not None:
            prepare(self.url_for(TEMPLATE))  # done once, copied into every database

    def _pg_ctl_start(self) -> None:
        # fsync and full_page_writes off guard against an operating system's crash alone:
        # a crash of the server (`crash()`) loses nothing committed, its WAL being in the
        # system's cache; and a test server's durability across power loss is not under test.
        options = (f"-k {self.folder} -c listen_addresses=127.0.0.1 -p {self.port}"
                   " -c fsync=off -c full_page_writes=off -c max_connections=100")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")

    def crash(self) -> None:
        """Stop the server as a crash would (`pg_ctl stop -m immediate`: no checkpoint,
        every session cut; it recovers from its WAL at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def restart(self) -> None:
        """Start the server again after `crash()`, on the same port and folder."""
        self._pg_ctl_start()
        self.running = True

    def terminate_clients(self, pid: int, within: float = 0.5) -> list[dict]:
        """End, on the server (pg_terminate_backend), the connections that process `pid`
        holds to it: the first of them seen in a transaction within `within` seconds (a
        write cut halfway), else all of them as they are. Returns what each ended one was
        doing: [{"backend", "state", "in_transaction"}]."""
        busy = " AND state IN ('active', 'idle in transaction') LIMIT 1"
        ended = self._signal_clients(lambda: [pid], "pg_terminate_backend", busy, within)
        if ended is not None and not ended:
            ended = self._signal_clients(lambda: [pid], "pg_terminate_backend", "", 0.0)
        return [{"backend": b, "state": state,
                 "in_transaction": state in ("active", "idle in transaction")}
                for b, state, _, done in ended or () if done]

    def cancel_statements(self, pids: Callable[[], Iterable[int]], running_for: float,
                          within: float) -> list[dict]:
        """Cancel (pg_cancel_backend: SQLSTATE 57014, as a statement_timeout of
        `running_for` seconds does) every statement of the processes `pids()` names (asked
        again at each poll: processes come and go) running for longer than that, as soon as
        there is one, waiting up to `within` seconds for one. Returns what was cancelled:
        [{"backend", "state", "client"}] (client: the process's pid; empty: none ran that
        long)."""
        long = (" AND state = 'active' AND clock_timestamp() - query_start"
                f" > make_interval(secs => {float(running_for)})")
        cancelled = self._signal_clients(pids, "pg_cancel_backend", long, within)
        return [{"backend": b, "state": state, "client": client}
                for b, state, client, done in cancelled or () if done]

    def _signal_clients(self, pids: Callable[[], Iterable[int]], function: str, where: str,
                        within: float) -> list[tuple] | None:
        """Call `function` (pg_terminate_backend or pg_cancel_backend) on the connections of
        processes `pids()` matching `where`, polling for up to `within` seconds until one does;
        [(backend, state, client pid, done)], or None when they hold no connection to us.
        A process's connections are found by its TCP ports (psutil), read again at each
        poll: it may open one meanwhile."""
        import psycopg
        sql = (f"SELECT pid, state, client_port, {function}(pid) FROM pg_stat_activity WHERE"
               f" client_port = ANY(%s) AND client_addr = '127.0.0.1'{where}")
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            deadline = time.monotonic() + within
            while True:
                ports = {port: pid for pid in pids() for port in self._client_ports(pid)}
                found = conn.execute(sql, (list(ports),)).fetchall() if ports else None
                if found or time.monotonic() >= deadline:
                    return [(b, state, ports.get(port), done)
                            for b, state, port, done in found] if found is not None else None
                time.sleep(0.002)

    def _client_ports(self, pid: int) -> list[int]:
        """The local TCP ports of process `pid`'s connections to this server."""
        import psutil
        try:
            return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                    if c.raddr and c.raddr.port == self.port]
        except psutil.Error:
            return []

    def _start_watchdog(self) -> None:
        # Its own session: a signal to the test run's process group does not take it along
        # before it has stopped the server.
        self.watchdog = subprocess.Popen(
            [sys.executable, __file__, str(os.getpid()), str(self.bindir), str(self.data),
             str(self.folder), "1" if self.as_root else "0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _execute(self, sql: str) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, name: str | None = None, *, empty: bool = False) -> str:
        """A new database (named `name`, or test_<pid>_<n>): a copy of the template, or
        (empty) of template0. Returns its URL."""
        name = name or f"test_{os.getpid()}_{next(self._names)}"
        self._execute(f"CREATE DATABASE {name} TEMPLATE {'template0' if empty else TEMPLATE}")
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        """Drop a test's database (closing whatever still connects to it)."""
        self._execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server (fast: sessions are ended) and its watchdog; remove the folder."""
        try:
            if self.running:
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
                self.running = False
        finally:
            if self.watchdog is not None:
                self.watchdog.terminate()  # ours: started above, ended by its pid
                self.watchdog.wait(timeout=10)
                self.watchdog = None
            shutil.rmtree(self.folder, ignore_errors=True)


def watch(parent: int, bindir: str, data: str, folder: str, as_root: bool) -> None:
    """Stop the server in `data` once process `parent` is gone, then remove `folder`."""
    while True:
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass  # alive, under another user
        if not os.path.exists(data):
            return  # stopped and removed by its owner
        time.sleep(0.5)
    command = [os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"]
    if as_root:
        command = ["runuser", "-u", "nobody", "--", *command]
    subprocess.run(command, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
