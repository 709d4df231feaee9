"""`python -m examples.article_engine init|submit|worker|sender`: the article engine's CLI.

The provider key comes from the environment (ARTICLE_PROVIDER_KEY), never from argv.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
from typing import Sequence

from chaos import probe

from . import calls, engine, sender

KEY_VARIABLE = "ARTICLE_PROVIDER_KEY"


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "1", "yes"):
        return True
    if text.lower() in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be on or off, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.article_engine",
                                     description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="create the article's schema")
    p.add_argument("--db", required=True)
    p = sub.add_parser("submit", help="submit one job (the same id twice is a no-op)")
    p.add_argument("--db", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--payload", required=True, help="the job's JSON payload")
    for name, text in (("worker", "claim jobs and run their steps"),
                       ("sender", "send unsent outbox rows")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--db", required=True)
        p.add_argument("--provider-url", default="http://127.0.0.1:8080/v1")
        p.add_argument("--receiver-url", default="http://127.0.0.1:8081/v1/effects")
        p.add_argument("--model", default="fake-model")
        p.add_argument("--lease", type=positive, default=120.0, help="LEASE_SECONDS")
        p.add_argument("--call-timeout", type=positive, default=60.0)
        p.add_argument("--send-timeout", type=positive, default=10.0)
        p.add_argument("--poll", type=positive, default=0.5, help="seconds between idle polls")
        p.add_argument("--max-attempts", type=int, default=5, help="MAX_ATTEMPTS")
        p.add_argument("--backoff-base", type=positive, default=1.0,
                       help="the article's 1.0: the wait is uniform(base, min(cap, base*2^n))")
        p.add_argument("--backoff-cap", type=positive, default=32.0, help="the article's 32.0")
        p.add_argument("--heartbeat", type=on_off, default=True,
                       help="on: heartbeat() from a thread while a model call runs")
        p.add_argument("--heartbeat-interval", type=positive, help="default lease / 3")
        p.add_argument("--busy-timeout", type=positive, default=5.0)
        p.add_argument("--clock-skew", type=float, default=0.0,
                       help="seconds this process's clock is off by")
        p.add_argument("--claim-moves", action="store_true",
                       help="the variant: the claim moves the job into its working state")
    return parser


def stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def configure(args: argparse.Namespace, module=engine) -> None:
    """Set the engine `module`'s settings from the worker or sender flags."""
    if args.max_attempts < 1:
        raise ValueError(f"--max-attempts must be >= 1, got {args.max_attempts}")
    module.configure(
        db=args.db, lease=args.lease, max_attempts=args.max_attempts,
        backoff_base=args.backoff_base, backoff_cap=args.backoff_cap,
        clock_skew=args.clock_skew, heartbeat=args.heartbeat,
        heartbeat_interval=args.heartbeat_interval, busy_timeout=args.busy_timeout,
        provider=calls.Provider(args.provider_url, args.model, args.call_timeout,
                                os.environ.get(KEY_VARIABLE, "")),
        claim_moves=args.claim_moves)


def cmd_submit(args: argparse.Namespace) -> int:
    payload = engine.canonical(json.loads(args.payload))
    conn = sqlite3.connect(args.db, timeout=engine.BUSY_TIMEOUT)
    try:
        with conn:
            created = conn.execute(engine.SUBMIT_SQL, (args.id, payload, engine.now(),
                                                       engine.now())).rowcount == 1
    finally:
        conn.close()
    print(f"job {args.id}: {'created' if created else 'already present'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (2 for bad input)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("ARTICLE_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(message)s")
    try:
        probe.arm_from_env(engine.POINTS)
        if args.command == "init":
            created = engine.init_db(args.db)
            print(f"{args.db}: {'schema created' if created else 'schema already there'}")
            return 0
        if args.command == "submit":
            return cmd_submit(args)
        configure(args)
        stop = stop_on_signals()
        print(f"{args.command} {engine.WORKER} on {args.db}", file=sys.stderr, flush=True)
        if args.command == "worker":
            engine.work(stop, args.poll)
        else:
            sender.send(stop, args.receiver_url, args.send_timeout, args.poll)
        return 0
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
