"""Command line: run one fake server until SIGTERM/SIGINT or until stdin reaches EOF.

    python -m chaos.fakes provider|receiver --ledger PATH [--port N] [--ignore-stdin]

Prints one JSON line {"url": ...} once serving. A parent that starts it with stdin=PIPE gets a
server that dies with it: the parent's exit closes the pipe.

Exit codes: 0 stopped as asked; 2 a bad option (a port outside 0..65535 or already taken, a
ledger path that cannot be a file or cannot be created), or a ledger that could not be written
while serving (a full disk): one line on stderr names the option and the reason.
"""

import argparse
import json
import os
import signal
import sys
import threading

from chaos.fakes.provider import FakeProvider
from chaos.fakes.receiver import FakeReceiver

_FAKES = {"provider": FakeProvider, "receiver": FakeReceiver}
PROG = "python -m chaos.fakes"
EXIT_ERROR = 2
#: Seconds between two looks at the ledger while serving: how soon a full disk stops the fake.
_LOOK = 0.1


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, as every other refusal of this command: the usage is in --help.
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """Serve one fake until told to stop; return the exit code (0, or 2 with one line said)."""
    args = _parse_args(argv)
    try:
        fake = _FAKES[args.server](args.ledger, port=args.port)
    except OSError as exc:
        return _refuse(f"--ledger {args.ledger}: {ledger_reason(exc, args.ledger)}")
    try:
        fake.start()
    except OSError as exc:  # start() closed the fake
        return _refuse(f"--port {args.port}: {port_reason(exc)}")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if not args.ignore_stdin:
        threading.Thread(target=_wait_for_eof, args=(stop,), name="stdin-eof", daemon=True).start()
    try:
        print(json.dumps({"url": fake.url}), flush=True)
        while not stop.wait(_LOOK) and fake.ledger_failure is None:
            pass
    finally:
        fake.close()
    failure = fake.ledger_failure
    if failure is not None:
        return _refuse(f"--ledger {args.ledger}: could not be written ({failure.strerror}) "
                       f"after {failure.written} line{'' if failure.written == 1 else 's'}; "
                       "the fake stopped serving")
    return 0


def ledger_reason(exc: OSError, path: str) -> str:
    """Why a ledger file cannot be opened at `path`, in words."""
    folder = os.path.dirname(os.path.abspath(path))
    if isinstance(exc, IsADirectoryError):
        return "is a folder; give a file path (it is created, or appended to)"
    if isinstance(exc, FileNotFoundError):
        return f"its folder {folder} does not exist"
    if isinstance(exc, NotADirectoryError):
        return "a part of the path before its file name is not a folder"
    if isinstance(exc, PermissionError):
        return ("the file is not writable" if os.path.exists(path)
                else f"cannot create a file in {folder} (permission denied)")
    return exc.strerror or str(exc)


def port_reason(exc: OSError) -> str:
    """Why a port cannot be bound, in words."""
    if isinstance(exc, OSError) and exc.errno == 98:  # EADDRINUSE on Linux
        return "already in use on 127.0.0.1 (another server listens there; choose another, or 0)"
    return (exc.strerror or str(exc)).lower()


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text[:40]!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 0..65535 (0: any free one), "
                                         f"got {value}")
    return value


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("server", choices=sorted(_FAKES))
    parser.add_argument("--ledger", required=True, help="JSONL ledger file (appended to)")
    parser.add_argument("--port", type=_port, default=0,
                        help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument("--ignore-stdin", action="store_true",
                        help="keep serving when stdin closes (e.g. when started in the background)")
    return parser.parse_args(argv)


def _refuse(line: str) -> int:
    print(f"{PROG}: error: {line}", file=sys.stderr, flush=True)
    return EXIT_ERROR


def _wait_for_eof(stop: threading.Event) -> None:
    try:
        while os.read(sys.stdin.fileno(), 65536):
            pass
    except (OSError, ValueError, AttributeError):
        pass  # no usable stdin counts as closed
    stop.set()


if __name__ == "__main__":
    sys.exit(main())
