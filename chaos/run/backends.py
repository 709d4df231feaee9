"""Where a run's engine database lives: a SQLite file in the run folder (`--backend sqlite`,
the default), or a new database on a PostgreSQL server (`--backend postgres`): one the run
starts for itself (chaos.run.pgserver), or the existing one `--pg-url` names. A command of many
runs (`mutants`, `sweep`) starts one server for all of them (`command_backend`), each run a
new database on it.

A URL's password never reaches an argv, a report or a log: the target the adapter and its
processes get has none, and the password travels in PGPASSWORD, set for the run only.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

BACKENDS = ("sqlite", "postgres")
SCHEMES = ("postgresql", "postgres")
SQLITE_FILE = "engine.db"
#: RunDatabase.server of a server the harness started: it ended with its run or command.
STARTED_FOR_RUN = "started for the run"
STARTED_FOR_COMMAND = "started for the command"
STARTED = (STARTED_FOR_RUN, STARTED_FOR_COMMAND)


class BackendError(ValueError):
    """A --backend or --pg-url that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class Backend:
    """The choice of `--backend` (and `--pg-url`), validated at construction."""

    name: str = "sqlite"
    pg_url: str | None = None
    #: pg_url is a server the command started for its runs (`command_backend`), not one
    #: the user named: it ends with the command.
    command_server: bool = False

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise BackendError(f"--backend must be one of {', '.join(BACKENDS)}, "
                               f"got {self.name!r}")
        if self.pg_url is None:
            return
        if self.name != "postgres":
            raise BackendError("--pg-url needs --backend postgres")
        parts = urlsplit(self.pg_url)
        if parts.scheme not in SCHEMES or not (parts.netloc or parts.query):
            raise BackendError(f"--pg-url must be a postgresql://user@host:port/dbname URL, "
                               f"got {redacted(self.pg_url)!r}")

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.name, "pg_url": redacted(self.pg_url) if self.pg_url else None}


@dataclass(frozen=True)
class RunDatabase:
    """One run's engine database. target: what the adapter is given (the file's path, or a
    URL without password); name: the file's or the database's; server: None for a file,
    "started for the run", or the --pg-url server (shown without its password)."""

    backend: str
    target: str
    name: str
    server: str | None = None
    #: the chaos.run.pgserver.PostgresServer the run started (its faults: crash, restart,
    #: terminate_clients), or None
    control: Any = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "name": self.name, "server": self.server,
                "target": redacted(self.target)}


def check_backend(engine: Any, backend: Backend) -> None:
    """Raise BackendError naming --backend when `engine` does not run on it: an adapter
    lists the backends it supports in `backends` (default: sqlite alone)."""
    supported = tuple(getattr(engine, "backends", ("sqlite",)))
    if backend.name not in supported:
        why = getattr(engine, "backend_note", None)
        raise BackendError(f"--backend {backend.name}: engine {getattr(engine, 'name', '?')} "
                           f"runs on {', '.join(supported)} only"
                           + (f" ({why})" if why else ""))


def saved_target(run_dir: str, report: dict[str, Any]) -> str:
    """The engine database of the saved run in `run_dir` (its report.json is `report`), to
    read a partial run's rows from. Raises ValueError where it is gone: a server started for
    the run ended with it."""
    database = report.get("database") or {}
    if database.get("backend") != "postgres":
        return os.path.join(run_dir, SQLITE_FILE)
    if database.get("server") in STARTED:
        raise ValueError(f"{run_dir} ran on a PostgreSQL server {database['server']}, which "
                         "ended with it: its rows are gone (a run with --pg-url keeps its "
                         "database)")
    return database["target"]


def redacted(url: str) -> str:
    """`url` with its password, in the user part or the query, replaced by ***."""
    url = re.sub(r"^([a-z]+://[^:/@?]*):[^@/?]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None)."""
    parts = urlsplit(url)
    password = None
    netloc = parts.netloc
    if "@" in netloc:
        user, _, hosts = netloc.rpartition("@")
        if ":" in user:
            user, _, password = user.partition(":")
        netloc = f"{user}@{hosts}"
    query = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "password":
            password = value
        else:
            query.append((key, value))
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), "")), password


def with_dbname(url: str, dbname: str) -> str:
    """`url` naming database `dbname` instead of its own."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k != "dbname"]
    return urlunsplit((parts.scheme, parts.netloc, f"/{dbname}", urlencode(query), ""))


def database_name(scenario: str, stamp: str, seed: int) -> str:
    """A new database's name for one run: ninelives_<scenario>_<stamp>_seed<N>, lower case,
    letters, digits and underscores only, at most PostgreSQL's 63 bytes."""
    name = re.sub(r"[^a-z0-9_]+", "_", f"ninelives_{scenario}_{stamp}_seed{seed}".lower())
    return name[-63:] if len(name) > 63 else name


@contextmanager
def run_database(backend: Backend, name: str) -> Iterator[RunDatabase]:
    """The engine database of one run, for the block's duration.

    sqlite: a file named SQLITE_FILE in the run folder (`target` is "" until the runner
    joins it to the folder). postgres: a new database `name` on a server started for the run
    (stopped when the block ends, however it ends; its watchdog stops it if this process is
    killed outright), or on the --pg-url server (created there; kept after the run, as a
    SQLite run keeps its file). Raises BackendError naming the flag when the server cannot
    be started or reached; nothing is left behind then.
    """
    if backend.name == "sqlite":
        yield RunDatabase("sqlite", "", SQLITE_FILE)
    elif backend.pg_url is None:
        with _own_server() as server:
            _create(server.url, name, "--backend postgres")
            yield RunDatabase("postgres", server.url_for(name), name, STARTED_FOR_RUN, server)
    elif backend.command_server:
        _create(backend.pg_url, name, "--backend postgres")
        yield RunDatabase("postgres", with_dbname(backend.pg_url, name), name,
                          STARTED_FOR_COMMAND)
    else:
        bare, password = split_password(backend.pg_url)
        with _password(password):
            _create(backend.pg_url, name, "--pg-url")
            yield RunDatabase("postgres", with_dbname(bare, name), name, redacted(bare))


def backend_for(scenario: Any, backend: Backend) -> Backend:
    """The backend a run of `scenario` is given `backend` by its command uses. A run that
    cuts the power starts a PostgreSQL server of its own rather than use the one its command
    (`mutants`, `sweep`) started for all its runs: a cut kills and restarts the server."""
    if backend.command_server and getattr(scenario.faults, "power_loss", 0):
        return Backend("postgres")
    return backend


@contextmanager
def command_backend(backend: Backend) -> Iterator[Backend]:
    """The backend every run of a command of many runs (`mutants`, `sweep`) is given, for the
    block's duration. `--backend postgres` without `--pg-url`: ONE server started for the
    command (stopped when the block ends, however it ends; its watchdog stops it if this
    process is killed outright), on which each run creates its own database. With
    `--pg-url`: that server, checked now, so that a server the runs cannot use is exit 2
    before any folder is made. sqlite: as given. Raises BackendError naming the flag."""
    if backend.name != "postgres":
        yield backend
    elif backend.pg_url is not None:
        bare, password = split_password(backend.pg_url)
        with _password(password):
            _check_can_create(backend.pg_url)
        yield backend
    else:
        with _own_server("the command's runs") as server:
            yield Backend("postgres", server.url, command_server=True)


def _check_can_create(url: str) -> None:
    """Raise BackendError naming --pg-url unless its server answers and lets its user
    create databases (each run creates one)."""
    import psycopg
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            allowed = conn.execute("SELECT rolcreatedb OR rolsuper FROM pg_roles"
                                   " WHERE rolname = current_user").fetchone()
    except psycopg.Error as exc:
        raise BackendError(f"--pg-url: cannot connect to {redacted(url)}: "
                           f"{str(exc).strip()}") from None
    if not (allowed and allowed[0]):
        raise BackendError(f"--pg-url: the user of {redacted(url)} may not create databases "
                           "(each run creates its own): grant it CREATEDB")


def add_backend_flags(parser: Any, runs: str = "the run") -> None:
    """--backend and --pg-url on an argparse parser (`runs`: whose database they choose)."""
    parser.add_argument("--backend", default="sqlite", choices=BACKENDS,
                        help=f"the engine's store for {runs}: sqlite (a file in each run's "
                             "folder, the default) or postgres (a new database per run, on a "
                             "server started for it, or on --pg-url's)")
    parser.add_argument("--pg-url", default=None, metavar="postgresql://...",
                        help="with --backend postgres: an existing server, on which each run "
                             "creates a database of its own (a password goes to the engine's "
                             "processes as PGPASSWORD, never on a command line)")


@contextmanager
def _own_server(serving: str = "the run") -> Iterator[Any]:
    from chaos.run.pgserver import PostgresServer, ServerError
    try:
        server = PostgresServer().start()
    except ServerError as exc:
        raise BackendError(f"--backend postgres: could not start a PostgreSQL server for "
                           f"{serving}: {exc} (or name an existing one with --pg-url)") from None
    try:
        yield server
    finally:
        server.stop()  # also on Ctrl-C, SIGTERM or a failed run: no server outlives its run


def _create(maintenance_url: str, name: str, flag: str) -> None:
    """CREATE DATABASE `name` through the database `maintenance_url` names."""
    import psycopg
    try:
        with psycopg.connect(maintenance_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        raise BackendError(f"{flag}: cannot create database {name} on "
                           f"{redacted(maintenance_url)}: {str(exc).strip()}") from None


@contextmanager
def _password(password: str | None) -> Iterator[None]:
    """PGPASSWORD set to `password` for the block (the engine's processes inherit it, and
    libpq reads it for the harness's own connections), then as it was."""
    if password is None:
        yield
        return
    before = os.environ.get("PGPASSWORD")
    os.environ["PGPASSWORD"] = password
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PGPASSWORD", None)
        else:
            os.environ["PGPASSWORD"] = before
