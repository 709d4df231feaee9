"""`python -m chaos.reference.mutants NAME ROLE [flags...]`: one engine process (`worker`, `send`, ...)
of the reference engine broken as mutant NAME (see chaos.reference.mutants.patches)."""
from __future__ import annotations

import sys

from engine.cli import main as engine_main

from .patches import PATCHES, apply


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in PATCHES:
        print(f"usage: python -m chaos.reference.mutants NAME ROLE [flags...]; NAME is one of: "
              f"{', '.join(sorted(PATCHES))}", file=sys.stderr)
        return 2
    apply(argv[0])
    return engine_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
