"""The store backends every contract test runs on (see tests/conftest.py), and the
PostgreSQL server the tests start for them."""
from __future__ import annotations

from contextlib import contextmanager

from engine import open_store

BACKENDS = ("sqlite", "postgres")


@contextmanager
def started_pg_server():
    """A PostgreSQL server of the tests' own, stopped on leaving whatever happened; its
    template is migrated once, and every database made on it is a copy of that."""
    from chaos.run.pgserver import PostgresServer
    server = PostgresServer()
    try:
        yield server.start(prepare=lambda url: open_store(url).close())
    finally:
        server.stop()
