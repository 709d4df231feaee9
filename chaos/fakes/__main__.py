"""Command line: run one fake server until SIGTERM/SIGINT or until stdin reaches EOF.

    python -m chaos.fakes provider|receiver --ledger PATH [--port N] [--ignore-stdin]

Prints one JSON line {"url": ...} once serving. A parent that starts it with stdin=PIPE gets a
server that dies with it: the parent's exit closes the pipe.
"""

import argparse
import json
import os
import signal
import sys
import threading

from .provider import FakeProvider
from .receiver import FakeReceiver

_FAKES = {"provider": FakeProvider, "receiver": FakeReceiver}


def main(argv: list[str] | None = None) -> int:
    """Serve one fake until told to stop; return the exit code (0)."""
    args = _parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if not args.ignore_stdin:
        threading.Thread(target=_wait_for_eof, args=(stop,), name="stdin-eof", daemon=True).start()
    with _FAKES[args.server](args.ledger, port=args.port) as fake:
        print(json.dumps({"url": fake.url}), flush=True)
        stop.wait()
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m chaos.fakes", description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=sorted(_FAKES))
    parser.add_argument("--ledger", required=True, help="JSONL ledger file (appended to)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--ignore-stdin", action="store_true",
                        help="keep serving when stdin closes (e.g. when started in the background)")
    return parser.parse_args(argv)


def _wait_for_eof(stop: threading.Event) -> None:
    try:
        while os.read(sys.stdin.fileno(), 65536):
            pass
    except (OSError, ValueError, AttributeError):
        pass  # no usable stdin counts as closed
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
