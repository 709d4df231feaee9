"""The history: the only thing that crosses between the harness's roles, as operations.

Format version 2 (`HISTORY_VERSION`). Every operation has `t` (float seconds since the epoch,
the machine's real clock, never an engine's injected one), `src` (who recorded it), `type`
(what happened) and, where a crash can leave it undecided, `completion`: "ok" (it happened),
"fail" (it did not), "info" (indeterminate: the process died or the answer was lost, so it
may or may not have taken effect). A killed process never completes an operation; its
restart is a new process.

src "engine": what the engine committed, mapped from its own rows by its adapter's observer.
Every engine operation completed "ok" (it was committed) and names who wrote it (`actor`,
`worker`, `pid`, `token`). Their types and fields (submitted, claimed, state, removed, memo,
effect_queued, effect_claimed, effect_sent, effect_state, billed), which fields are required,
what a field left out is read as, and which checks go unknown without it, are data in
`chaos.engines.schema`, the one source: the reference page docs/history.md is generated from it, and
what an adapter's `operations(db)` returns is checked against it as it is read.
src "provider": the fake model provider's ledger, one per request, t = t_start:
  call           job, step, worker, n, t_start, t_end, status, outcome ("ok" | "error" |
                 "hang" | "reset" | "garbage" | "bad_content" | "schema" | "cut"), billed,
                 fault, retry_after, retry_at, retry_after_header, trickle, client_gone_at,
                 stream, chunks, chunks_sent (a streamed answer: its pieces, and those sent
                 and billed before it ended or was cut),
                 completion ("info" when the caller cannot have had the answer)
                 a refusal's Retry-After: `retry_after` the seconds it asks for (None: no
                 guidance, also for a header no client can parse), `retry_at` the epoch time
                 of an HTTP date (only then), `retry_after_header` the header as sent; a hang
                 with `trickle` true sent its answer a byte at a time (`client_gone_at`: when
                 the fake found the client gone, None if it stayed)
src "receiver": the fake receiver's ledger, one per request, t = t_start:
  request        key, job, kind, worker, n, t_start, t_end, status, outcome ("applied" |
                 "replayed" | "conflict" | "error" | "dropped" | "applied_late"), applied,
                 effect_id, completion ("info" when the sender cannot know whether it applied)
src "nemesis": every fault it applied, and its healing (type is the fault: kill, pause,
  resume, expire, skew, heartbeat_off, outage, outage_end, contention, contention_end,
  duplicate_submit, operator, server_crash, server_restart (the database server crashed and
  started again: PostgreSQL), connection_kill (an engine process's connections ended by the
  server: pid, backends, in_transaction), statement_timeout and statement_timeout_end (the
  write lock held until engine statements have waited `seconds`, when the server cancels
  them as a statement_timeout does, SQLSTATE 57014; `cancelled`: how many, on the end),
  statement_cancelled (one statement cancelled: target, pid, backend), row_lock and
  row_lock_end (a row held locked by another transaction: table "job" or "outbox", row, job,
  seconds), row_lock_idle (nothing was left unfinished to lock), error)
src "process": the supervisor's lifecycle records and the probe's log:
  spawn | exit   name, role ("worker" | "sender"), slot, pid, code, signal, killed (exit:
                 True when the harness sent the signal), log_tail (exit by itself)
  crashpoint     pid, point, job                         the probe killed its process
  stall          pid, name, role, thread, seconds        (simulation only) one thread of the
                 process was left waiting `seconds`, as a loaded machine would
src "runner": phases (`phase`) and submissions (`submit`: job, payload_hash, result,
  duplicate).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

Event = dict[str, Any]

HISTORY_VERSION = 2

#: Engine operation types that write a job row, and those that write an outbox row.
JOB_OPS = frozenset({"submitted", "claimed", "state", "removed"})
EFFECT_OPS = frozenset({"effect_queued", "effect_claimed", "effect_sent", "effect_state"})

#: The order sources sort in when two events carry the same time.
SOURCE_ORDER = {"runner": 0, "process": 1, "nemesis": 2, "engine": 3, "provider": 4, "receiver": 5}


def canonical_json(value: Any) -> str:
    """The one JSON spelling of a payload the harness compares by (sorted keys, no spaces).
    Raises ValueError for what JSON cannot hold."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON-serialisable: {exc}") from None


def payload_hash(payload: Any) -> str:
    """The fingerprint `submitted` operations and snapshots carry for a payload (see
    `fingerprint`)."""
    return fingerprint(canonical_json(payload))


def fingerprint(canonical: str) -> str:
    """Length, first and last 40 characters of a payload's canonical JSON text: cheap enough
    for an observer to compute in SQL from the text an engine stored."""
    return f"{len(canonical)}:{canonical[:40]}:{canonical[-40:]}"


def sort_key(event: Event) -> tuple:
    return (event["t"], SOURCE_ORDER.get(event["src"], 9), event.get("seq", 0))


def merge(*streams: Iterable[Event]) -> list[Event]:
    """One time-ordered history from several sources' event lists."""
    events = [e for stream in streams for e in stream]
    events.sort(key=sort_key)
    return events


def write_history(path: str | os.PathLike, events: Iterable[Event]) -> int:
    """Write events as JSON lines (sorted keys, so equal histories are equal bytes)."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
            n += 1
    return n


@dataclass(frozen=True)
class Tear:
    """Where a history file stops short of its run: `line`, the record cut mid-way (None
    when the file ends at a record's end); `last_t`, the time of the last complete record;
    `end`, when the run ended (None if unknown)."""

    path: str
    line: int | None
    last_t: float | None
    end: float | None

    def describe(self) -> str:
        """One sentence for the report and the terminal."""
        where = (f"line {self.line} is cut mid-record" if self.line is not None
                 else "it ends at a complete record")
        last = "no complete record" if self.last_t is None else \
            f"the last complete record is at {self.last_t:.3f}"
        end = "" if self.end is None else (
            f", {self.end - (self.last_t or self.end):.3f} s before the run's end at "
            f"{self.end:.3f}")
        return f"the history {self.path} is torn: {where}; {last}{end}"


def read_history(path: str | os.PathLike) -> list[Event]:
    """Read history.jsonl back; a torn last line (a run killed mid-write) is skipped. Raises
    ValueError naming the file and line of a record that is not UTF-8 JSON."""
    return load_history(path)[0]


def load_history(path: str | os.PathLike, end: float | None = None
                 ) -> tuple[list[Event], Tear | None]:
    """(the events of history.jsonl, where it is torn or None), read a line at a time.

    The history is torn when its last line is cut mid-record (no newline, not JSON), or
    when `end` (the time the run ended, if known) comes after its last record: histories
    are written in time order, and a complete one reaches the run's end. Raises ValueError
    naming the file and the line of any other record that is not a UTF-8 JSON event."""
    events: list[Event] = []
    cut: int | None = None
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{n}: not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start})") from None
            except ValueError:
                if not raw.endswith(b"\n") and fh.read(1) == b"":
                    cut = n  # the last line, its write interrupted
                    break
                raise ValueError(f"{path}:{n}: not a JSON event") from None
            if not isinstance(event, dict) or not isinstance(event.get("t"), (int, float)):
                raise ValueError(f"{path}:{n}: not a history event (an object with a time "
                                 "'t')")
            events.append(event)
    last_t = max((e["t"] for e in events), default=None)
    # (an empty history is not torn: it holds nothing, and checkers say so)
    short = end is not None and last_t is not None and last_t < end
    tear = Tear(os.fspath(path), cut, last_t, end) if cut is not None or short else None
    return events, tear


def of(events: Iterable[Event], src: str, type_: str | None = None) -> Iterator[Event]:
    """The events from `src` (and of `type_`, when given)."""
    for event in events:
        if event["src"] == src and (type_ is None or event["type"] == type_):
            yield event

