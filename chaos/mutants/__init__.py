"""Broken engines: the reference engine with ONE safety mechanism removed each, so that every
invariant can be seen failing in a real run (`ninelives mutants`, tests/quality).

`load_engine("chaos.mutants:NAME")` (or `--engine chaos.mutants:NAME`) gives mutant NAME's
adapter; the catalog, with what each mutant removes, which invariants should catch it and
the scenario that provokes it, is `chaos.mutants.catalog.CATALOG`.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m chaos.mutants` (an engine process) imports no harness code.
    from .catalog import ENGINES
    try:
        return ENGINES[name]
    except KeyError:
        raise AttributeError(f"no mutant {name!r} in chaos.mutants (see "
                             "chaos.mutants.catalog.CATALOG)") from None
