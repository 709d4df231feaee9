"""Append-only JSONL ledgers: what a fake saw and did, one line per request, in completion order."""

import json
import os
import threading


def read_ledger(path) -> list[dict]:
    """Return every complete entry of the ledger at `path` in file order; opens it read-only.

    A last line without its newline is a write in progress or was torn by a crash: skipped.
    A missing file is an empty ledger. Raises ValueError (json.JSONDecodeError) if a complete line
    is not JSON.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    complete = data.split(b"\n")[:-1]  # the last piece is b"" or a torn line
    return [json.loads(line) for line in complete if line.strip()]


class Ledger:
    """An append-only JSONL file of dict entries, each stamped with a 1-based, monotonic `seq`.

    Takes the file `path` and `fsync` (fsync every line: for ledgers that must survive a machine
    crash, not just a process crash). Reopening an existing ledger continues its numbering; a torn
    last line left by a killed writer is cut off first so that new lines are not glued onto it.
    Thread-safe.
    """

    def __init__(self, path, fsync: bool = False):
        self.path = os.fspath(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._drop_torn_tail()
        self._seq = max((entry.get("seq", 0) for entry in self.entries()), default=0)
        self._file = open(self.path, "a", encoding="utf-8")

    def append(self, entry: dict) -> dict:
        """Write `entry` plus its `seq` as one line, flushed; return the written dict.

        Raises ValueError if the ledger is closed, TypeError if the entry is not JSON-serialisable.
        """
        with self._lock:
            if self._file.closed:
                raise ValueError(f"ledger {self.path} is closed")
            record = {**entry, "seq": self._seq + 1}
            line = json.dumps(record, sort_keys=True) + "\n"
            self._file.write(line)
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._seq = record["seq"]
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

    def _drop_torn_tail(self) -> None:
        try:
            with open(self.path, "rb+") as f:
                data = f.read()
                keep = data.rfind(b"\n") + 1
                if keep < len(data):
                    f.truncate(keep)
        except FileNotFoundError:
            pass
