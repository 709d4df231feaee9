"""`ninelives`: one command for the engine (`ninelives engine ...`) and the harness."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the engine CLI or a harness command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "engine":
        from engine.cli import main as engine_main
        return engine_main(argv[1:])
    parser = argparse.ArgumentParser(prog="ninelives", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("engine", help="the reference engine: worker, send, submit, status, ...")
    p = sub.add_parser("demo", help="run the engine end to end against the fakes")
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="reports/demo")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(args.jobs, args.workers, args.seed, args.out)
    return 2


if __name__ == "__main__":
    sys.exit(main())
