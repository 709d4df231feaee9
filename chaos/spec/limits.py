"""The largest counts, durations and sizes the harness takes, from a scenario or a flag: one
place, read by the scenario loader (chaos.spec.scenario) and the flag parsers (chaos.commands.flags); and
`read_text`, which reads an input file within them.

A value past its bound is refused with an error naming it (exit 2), never run: `jobs =
100000000000` or `chaos = 1e300` would sit silent planning or submitting for hours. Each
bound is far past what a real run asks (the shipped scenarios stay under 100 jobs, 8
workers and a minute of chaos, ten times that under --profile soak).
"""
from __future__ import annotations

import os
import stat

#: Jobs a run submits (run.jobs, demo --jobs), after its profile scaled them.
MAX_JOBS = 100_000
#: Processes of one role a run starts (run.workers, run.senders, --workers, --parallel).
MAX_WORKERS = 256
#: Any duration in seconds (run.chaos, run.drain, faults.*_seconds, sweep --lease, ...): a day.
MAX_SECONDS = 86_400.0
#: Any fault rate, per second of the chaos phase (faults.kill, faults.pause, ...).
MAX_RATE = 100.0
#: Fault events the rates plan over the chaos phase, all rates together (rate x chaos).
MAX_FAULT_EVENTS = 100_000
#: Any other count a flag takes (--tries, --budget, --deep, how many --seeds).
MAX_COUNT = 100_000
#: The size of a scenario file read (a larger one is no scenario: /dev/zero, a log).
MAX_SCENARIO_BYTES = 1 << 20


def excerpt(text: str, most: int = 60) -> str:
    """`text` quoted (repr), cut to its first `most` characters with '...' when longer: what
    an error message shows of input, which may be anything and any size."""
    return repr(text[:most]) + ("..." if len(text) > most else "")


def shown(path: str) -> str:
    """`path` as an error or a command shows it: relative to where the command runs when it
    lies under it, else absolute (never '../../dev/zero', which names nothing the user gave)."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel == ".." or rel.startswith(".." + os.sep) else rel


def read_text(path: str, most: int = MAX_SCENARIO_BYTES) -> str:
    """The UTF-8 text of the regular file at `path`, of at most `most` bytes. Raises
    ValueError naming the file: one that is not a regular file (a FIFO would block the
    read forever, /dev/zero never end it), a larger one, or bytes that are not UTF-8 (with
    their offset); OSError as `open` does."""
    where = shown(path)
    mode = os.stat(path).st_mode  # before opening: opening a FIFO blocks until a writer
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
                if stat.S_ISSOCK(mode) else "a special file")
        raise ValueError(f"{where}: is {kind}, not a regular file")
    with open(path, "rb") as fh:
        raw = fh.read(most + 1)
    if len(raw) > most:
        raise ValueError(f"{where}: larger than {most:,} bytes, the most read")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset "
                         f"{exc.start} cannot be decoded") from None
