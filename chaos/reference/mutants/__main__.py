"""`python -m chaos.reference.mutants NAME ROLE [flags...]`: one engine process (`worker`, `send`, ...)
of the reference engine broken as mutant NAME (see chaos.reference.mutants.patches), on the
backend of the database its flags name."""
from __future__ import annotations

import os
import sys

from engine.cli import main as engine_main
from engine.store import is_postgres_url

from chaos.reference.mutants.patches import BACKENDS, NAMES, apply


def backends_of(argv: list[str]) -> tuple[str, ...]:
    """The backend of the database this process opens: its `--db` flag, else NINELIVES_DB;
    both backends when neither names it (a --config file may), so the mutant is never
    silently the reference engine."""
    db = os.environ.get("NINELIVES_DB")
    for i, arg in enumerate(argv):
        if arg == "--db" and i + 1 < len(argv):
            db = argv[i + 1]
        elif arg.startswith("--db="):
            db = arg[len("--db="):]
    if db is None:
        return BACKENDS
    return ("postgres",) if is_postgres_url(db) else ("sqlite",)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in NAMES:
        print(f"usage: python -m chaos.reference.mutants NAME ROLE [flags...]; NAME is one of: "
              f"{', '.join(sorted(NAMES))}", file=sys.stderr)
        return 2
    apply(argv[0], backends_of(argv[2:]))
    return engine_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
