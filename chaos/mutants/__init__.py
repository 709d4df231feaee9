"""Broken engines: the reference engine with ONE safety mechanism removed each, so that every
invariant can be seen failing in a real run (`ninelives mutants`, tests/quality).

`load_engine("chaos.mutants:NAME")` (or `--engine chaos.mutants:NAME`) gives mutant NAME's
adapter. The mutants are adapters of the reference engine, so they live beside it: the
catalog, with what each mutant removes, which invariants should catch it and the scenario
that provokes it, is `chaos.reference.mutants.catalog.CATALOG`; `matrix` runs it.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    from chaos.reference.mutants.catalog import ENGINES  # lazy: `ninelives mutants` may not need it
    try:
        return ENGINES[name]
    except KeyError:
        raise AttributeError(f"no mutant {name!r} in chaos.mutants (see "
                             "chaos.reference.mutants.catalog.CATALOG)") from None
