"""`python -m chaos.docs --write` rewrites the generated reference pages under docs/;
`--check` lists the stale ones and exits 1."""
from __future__ import annotations

import argparse
import sys

from chaos.docs import DOCS, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.docs", description=__doc__)
    parser.add_argument("--docs", default=DOCS, help="the docs folder (default: the project's)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", action="store_true", help="rewrite every generated page")
    what.add_argument("--check", action="store_true", help="list stale pages; exit 1 if any")
    args = parser.parse_args(argv)
    if args.write:
        for path in write(args.docs):
            print(f"wrote {path}")
        return 0
    found = stale(args.docs)
    for path in found:
        print(f"stale: {path} (run python -m chaos.docs --write)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
