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
import signal
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
        #: fsync on: the data directory is on a disk that can lose power (`run_at`)
        self.durable = False
        self._killed = False  # by `kill()`: its postmaster.pid is stale

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

    def _own_folder(self) -> None:
        if self.as_root:
            shutil.chown(self.folder, "nobody")
        self.folder.chmod(0o700)

    def _start(self, prepare: Callable[[str], None] | None) -> None:
        self._own_folder()
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
        # `run_at` a disk that loses power, it runs as a production server would:
        # fsync and full_page_writes on (a torn page is rebuilt from the WAL's full image);
        # no 16 MB of zeros written through the file system for each new WAL segment; and
        # crash recovery begins with one syncfs, not an fsync of each of its thousands of
        # files (seconds through the FUSE file system): after a cut nothing is unsynced.
        durable = (" -c fsync=on -c full_page_writes=on -c wal_init_zero=off"
                   " -c recovery_init_sync_method=syncfs"
                   if self.durable else " -c fsync=off -c full_page_writes=off")
        options = (f"-k {self.folder} -c listen_addresses=127.0.0.1 -p {self.port}"
                   f"{durable} -c max_connections=100")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")

    def crash(self) -> None:
        """Stop the server as a crash would (`pg_ctl stop -m immediate`: no checkpoint,
        every session cut; it recovers from its WAL at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.running = False

    def restart(self) -> None:
        """Start the server again after `crash()` or `kill()`, on the same port and folder."""
        if self._killed:  # the killed postmaster may linger as a zombie a while: its lock
            (self.data / "postmaster.pid").unlink(missing_ok=True)  # files would stop us
            (self.folder / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)
            self._killed = False
        self._pg_ctl_start()
        self.running = True

    # -- power loss (chaos.powerloss.pg) ---------------------------------------------------

    def move_to(self, disk: Path) -> None:
        """Stop the server and copy its data directory to `disk` (a folder that does not
        exist yet: on the lost-fsync file system's backing disk, before it is mounted,
        where what is written is durable); `run_at` starts it there."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False
        _copy_owned(self.data, disk, self.as_root)
        shutil.rmtree(self.data)
        self.data = Path(disk)

    def run_at(self, data: Path) -> None:
        """Start the server, durable (fsync on), on the data directory `data` (where
        `move_to` put it, seen through the mount), its watchdog pointed there."""
        self.data, self.durable = Path(data), True
        self._stop_watchdog()
        self._start_watchdog()
        self.restart()

    def postmaster(self) -> int | None:
        """The postmaster's pid, from its postmaster.pid, or None."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> list[int]:
        """The server loses its power: SIGKILL to the postmaster and every process it
        started (each backend and auxiliary process leads a process group of its own, so
        one killpg would not reach them: the postmaster is stopped, its children listed,
        then all killed), then wait until every one of them is gone. Returns their pids."""
        import psutil
        leader = self.postmaster()
        if leader is None:
            raise ServerError(f"no postmaster.pid in {self.data}: is the server running?")
        os.kill(leader, signal.SIGSTOP)  # forks no one while its children are listed
        try:
            group = [leader] + [p.pid for p in psutil.Process(leader).children(recursive=True)]
        except psutil.Error:
            group = [leader]
        for pid in reversed(group):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.running, self._killed = False, True
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in group):
            if time.monotonic() > deadline:
                raise ServerError(f"the server's processes {group} outlived SIGKILL for 30 s")
            time.sleep(0.005)
        return group

    def stop_wal_writer(self) -> int | None:
        """SIGSTOP the server's WAL writer (its pid, or None when there is none): with
        synchronous_commit off it makes commits durable every wal_writer_delay, so a
        reading of what the server acknowledged, made just before `kill()`, is not made
        durable by it meanwhile. `kill()` ends it with the rest."""
        import psutil
        leader = self.postmaster()
        try:
            writers = [p for p in psutil.Process(leader).children()
                       if "walwriter" in " ".join(p.cmdline())] if leader else []
        except psutil.Error:
            writers = []
        for writer in writers:
            writer.send_signal(signal.SIGSTOP)
        return writers[0].pid if writers else None

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
            self._stop_watchdog()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _stop_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.terminate()  # ours: started above, ended by its pid
            self.watchdog.wait(timeout=10)
            self.watchdog = None


def _nobody() -> tuple[int, int]:
    import pwd
    user = pwd.getpwnam("nobody")
    return user.pw_uid, user.pw_gid


def _copy_owned(source: Path, target: Path, as_root: bool, skip: tuple[str, ...] = ()) -> None:
    """Copy a data directory, owned by the server's user (`nobody` when we are root)."""
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns(*skip))
    if as_root:
        uid, gid = _nobody()
        for folder, _, files in os.walk(target):
            os.chown(folder, uid, gid)
            for name in files:
                os.chown(os.path.join(folder, name), uid, gid)


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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
