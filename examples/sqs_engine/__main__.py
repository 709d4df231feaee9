"""`python -m examples.sqs_engine worker|sender|init|submit`: the SQS engine's command line.

Settings are flags (`--visibility 10`, ...); the provider key comes only from SQS_PROVIDER_KEY.
`--planted NAME` runs one of the planted bugs of `examples.sqs_engine.planted` instead.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from chaos import probe

from . import store
from .settings import KEY_VARIABLE, Settings, flag_names
from .worker import POINTS

_TYPES = {"float": float, "int": int, "str": str,
          "bool": lambda text: {"true": True, "false": False}[text.lower()]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.sqs_engine", description=__doc__)
    parser.add_argument("role", choices=("worker", "sender", "init", "submit"))
    parser.add_argument("--db", required=True)
    parser.add_argument("--provider-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--receiver-url", default="http://127.0.0.1:8001/v1/effects")
    parser.add_argument("--key", help="submit: the job's key")
    parser.add_argument("--payload", help="submit: the job's JSON payload")
    parser.add_argument("--planted", help="run this planted bug (examples.sqs_engine.planted)")
    for name, kind in flag_names():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_TYPES[kind])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    table = {name: getattr(args, name) for name, _ in flag_names()
             if getattr(args, name) is not None}
    try:
        settings = Settings.from_table({**table, "provider_key": os.environ.get(KEY_VARIABLE, "")})
        probe.arm_from_env(POINTS)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    conn = store.connect(args.db)
    try:
        return run(args, settings, conn)
    finally:
        conn.close()


def run(args: argparse.Namespace, settings: Settings, conn) -> int:
    if args.role == "init":
        store.init(conn)
        return 0
    if args.role == "submit":
        if args.key is None or args.payload is None:
            print("error: submit needs --key and --payload", file=sys.stderr)
            return 2
        result = store.submit(conn, args.key, json.loads(args.payload), time.time())
        print(result)
        return 1 if result == "rejected" else 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from .planted import loops
    worker_type, sender_type = loops(args.planted)
    loop = (worker_type(conn, settings, args.provider_url) if args.role == "worker"
            else sender_type(conn, settings, args.receiver_url))
    print(f"{args.role} {loop.id} on {args.db}", file=sys.stderr, flush=True)
    loop.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
