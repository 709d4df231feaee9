"""Append-only JSONL ledgers: what a fake saw and did, one line per request, in completion order.

A ledger that cannot be written (a full disk, an I/O error) stops at its first failed line and
keeps that error (`Ledger.failure`): lines after a half-written one would be glued onto it.
Whoever runs a fake asks it, and says so once (chaos.fakes.__main__, chaos.run.runner).
"""

import errno
import json
import os
import stat
import threading


class LedgerWriteError(OSError):
    """A line could not be appended to a ledger: `errno`, `strerror` and `filename` are the
    write's; `written` is how many lines the ledger holds from this writer before it."""

    def __init__(self, cause: OSError, path: str, written: int):
        super().__init__(cause.errno, cause.strerror or str(cause), path)
        self.written = written


def read_ledger(path) -> list[dict]:
    """Return every complete entry of the ledger at `path` in file order; opens it read-only.

    A last line without its newline is a write in progress or was torn by a crash: skipped.
    A missing file is an empty ledger, and so is a device or a pipe (/dev/null, /dev/full:
    reading it would never end, or block). Raises ValueError (json.JSONDecodeError) if a
    complete line is not JSON, OSError if it cannot be read (a folder: IsADirectoryError).
    """
    if not _is_regular(path) and not os.path.isdir(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    complete = data.split(b"\n")[:-1]  # the last piece is b"" or a torn line
    return [json.loads(line) for line in complete if line.strip()]


class Ledger:
    """An append-only JSONL file of dict entries, each stamped with a 1-based, monotonic `seq`.

    Takes the file `path` and `fsync` (fsync every line: for ledgers that must survive a machine
    crash, not just a process crash). Reopening an existing ledger continues its numbering; a torn
    last line left by a killed writer is cut off first so that new lines are not glued onto it.
    Raises OSError when the file cannot be opened for appending (a folder, a missing parent
    folder, no permission). Thread-safe.
    """

    def __init__(self, path, fsync: bool = False):
        self.path = os.fspath(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._failure: LedgerWriteError | None = None
        self._written = 0
        # Opened first: a path that can never be a ledger fails here, before anything is read.
        # Unbuffered: each line is one write(2) with O_APPEND, and a failed one leaves nothing
        # behind in a buffer for close() to retry.
        self._file = open(self.path, "ab", buffering=0)
        try:
            self._drop_torn_tail()
            self._seq = max((entry.get("seq", 0) for entry in self.entries()), default=0)
        except BaseException:
            self._file.close()
            raise

    @property
    def failure(self) -> "LedgerWriteError | None":
        """The error of the first line that could not be written, None while every line was."""
        return self._failure

    def append(self, entry: dict) -> dict:
        """Write `entry` plus its `seq` as one line; return the written dict.

        Raises ValueError if the ledger is closed, TypeError if the entry is not JSON-serialisable,
        LedgerWriteError (an OSError) if the line cannot be written, and for every later append
        once one could not.
        """
        with self._lock:
            if self._file.closed:
                raise ValueError(f"ledger {self.path} is closed")
            if self._failure is not None:
                raise self._failure
            record = {**entry, "seq": self._seq + 1}
            line = (json.dumps(record, sort_keys=True) + "\n").encode()
            try:
                self._write(line)
            except OSError as exc:
                self._failure = LedgerWriteError(exc, self.path, self._written)
                raise self._failure from exc
            self._seq = record["seq"]
            self._written += 1
            return record

    def entries(self) -> list[dict]:
        """Return every complete entry in file order (see read_ledger)."""
        return read_ledger(self.path)

    def close(self) -> None:
        """Close the file; later appends raise ValueError. Idempotent."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:  # a short write (a disk filling up) is followed by the one that fails
            written = self._file.write(view)
            if not written:
                raise OSError(errno.EIO, "the ledger file took no byte of the line")
            view = view[written:]
        if self._fsync:
            os.fsync(self._file.fileno())

    def _drop_torn_tail(self) -> None:
        if not _is_regular(self.path):
            return  # a device (/dev/null, /dev/full) has no tail to read
        with open(self.path, "rb+") as f:
            data = f.read()
            keep = data.rfind(b"\n") + 1
            if keep < len(data):
                f.truncate(keep)


def _is_regular(path) -> bool:
    """Whether `path` is a regular file (False when missing); OSError if it cannot be looked at."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False
