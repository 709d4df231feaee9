"""`python -m examples.dbos_pipeline worker|init --db PATH ...`: one DBOS process.

A worker launches DBOS on the SQLite system database at --db (which recovers the pending
workflows of its executor id), listens on the documents queue and runs workflows until it is
killed. `init` creates the system database and exits. The provider key comes only from
OPENAI_API_KEY.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from dbos import DBOS

from . import app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m examples.dbos_pipeline", description=__doc__)
    parser.add_argument("role", choices=("worker", "init"))
    parser.add_argument("--db", required=True)
    parser.add_argument("--executor-id", default="local")
    parser.add_argument("--provider-url", default=app.CONFIG["provider_url"])
    parser.add_argument("--receiver-url", default=app.CONFIG["receiver_url"])
    parser.add_argument("--model", default=app.CONFIG["model"])
    for name in ("call_timeout", "send_timeout", "interval_seconds", "backoff_rate"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=app.CONFIG[name])
    parser.add_argument("--max-attempts", type=int, default=app.CONFIG["max_attempts"])
    parser.add_argument("--worker-concurrency", type=int, default=4)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    app.CONFIG.update({k: getattr(args, k) for k in app.CONFIG})
    DBOS(config={"name": "ninelives-dbos-pipeline", "system_database_url": f"sqlite:///{args.db}",
                 "executor_id": args.executor_id, "run_admin_server": False})
    app.register()
    DBOS.launch()
    DBOS.register_queue(app.QUEUE, worker_concurrency=args.worker_concurrency,
                        polling_interval_sec=0.1)
    if args.role == "init":
        DBOS.destroy()
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"worker {args.executor_id} on {args.db}", file=sys.stderr, flush=True)
    stop.wait()
    DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
