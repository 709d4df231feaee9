"""What every mutant's patch is made with: the store classes of the backends a process may
open, a mutant's SQL edits for a store's backend, and the wrapping of one method."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from engine.store import SQLiteStore

from chaos.reference.mutants.sql import SQLEdit, sql_edits


BACKENDS = ("sqlite", "postgres")


def store_classes(backends: Iterable[str] = BACKENDS) -> list[type]:
    """The store classes of `backends` (PostgreSQL's imported only when named: it brings
    psycopg)."""
    classes = []
    for backend in backends:
        if backend == "postgres":
            from engine.store.postgres import PostgresStore
            classes.append(PostgresStore)
        else:
            classes.append(SQLiteStore)
    return classes


def edits_of(store: type, mutant: str) -> tuple[SQLEdit, ...]:
    """Mutant `mutant`'s SQL edits for `store`'s backend."""
    return sql_edits(store.backend)[mutant]


def wrap(owner: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace `owner.name` (owner: a class, or one object) by `make(original)`."""
    setattr(owner, name, make(getattr(owner, name)))
