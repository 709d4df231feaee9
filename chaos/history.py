"""The history: the only thing that crosses between the harness's roles.

Workers (through the audit triggers), the fakes (their ledgers), the nemesis and the
supervisor all append to it; checkers only read it. One event per line in history.jsonl,
ordered by time `t` (the machine's wall clock, never an engine's injected clock).

Every event has `t` (float seconds since the epoch), `src` and `type`. The sources:

audit (triggers in the engine database, written in the same transaction as the change):
  {"src":"audit","type":"job","op":"insert"|"update"|"delete","job":ID,"from":OLD_STATE|None,
   "to":NEW_STATE,"writer":UPDATED_BY,"token":NEW_LEASE_TOKEN,"old_token":OLD_LEASE_TOKEN,
   "claims":N,"attempts":N,"lease_until":T,"lease_owner":W|None,"next_run_at":T|None,
   "last_error":STR|None,"payload_hash":STR}
  {"src":"audit","type":"memo","op":"insert"|"delete","job":ID,"step":STEP,"writer":W,
   "token":LEASE_TOKEN|None,"cost":C}
  {"src":"audit","type":"outbox","op":"insert"|"update","row":ROW_ID,"job":ID,"kind":KIND,
   "writer":W,"token":T,"old_token":T,"attempts":N,"sent_at":T|None,"dead_at":T|None,
   "lease_owner":W|None,"last_error":STR|None}
  {"src":"audit","type":"spend","job":ID,"step":STEP,"worker":W,"token":T,"started":T,
   "ended":T,"outcome":"ok"|"retryable"|"timeout"|"poison","cost":C|None,"error":STR|None}
provider (the fake model provider's ledger, one event per request, t = t_start):
  {"src":"provider","type":"call","job":ID,"step":STEP,"worker":W,"n":N,"t_start":T,
   "t_end":T,"status":HTTP|None,"outcome":"ok"|"error"|"hang"|"reset"|"garbage"|
   "bad_content"|"schema","billed":C,"fault":KIND|None}
receiver (the fake receiver's ledger, one event per request, t = t_start):
  {"src":"receiver","type":"request","key":KEY|None,"job":ID,"kind":KIND,"worker":W,"n":N,
   "t_start":T,"t_end":T,"status":HTTP|None,"outcome":"applied"|"replayed"|"conflict"|
   "error"|"dropped"|"applied_late","applied":bool,"effect_id":ID|None}
nemesis (every fault it applied, and its healing):
  {"src":"nemesis","type":"kill"|"pause"|"resume"|"expire"|"skew"|"outage"|"outage_end"|
   "contention"|"contention_end"|"duplicate_submit"|"operator", ...details}
process (the supervisor's lifecycle records):
  {"src":"process","type":"spawn"|"exit","name":NAME,"role":"worker"|"sender",
   "pid":PID,"code":EXIT_CODE|None,"signal":SIGNAL_NAME|None}
runner (phases and submissions):
  {"src":"runner","type":"phase","phase":"chaos"|"heal"|"drain"|"check"}
  {"src":"runner","type":"submit","job":ID,"payload_hash":H,"result":"created"|"exists"|
   "rejected","duplicate":bool}

Worker ids embed the process id (`worker:HOST:PID:NONCE`), which ties audit writers to
process events. A killed process's open operation is indeterminate: it may or may not have
taken effect, and only the audit and the ledgers say which.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Iterator

Event = dict[str, Any]

#: The order sources sort in when two events carry the same time.
SOURCE_ORDER = {"runner": 0, "process": 1, "nemesis": 2, "audit": 3, "provider": 4, "receiver": 5}


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


def read_history(path: str | os.PathLike) -> list[Event]:
    """Read history.jsonl back; a torn last line (a run killed mid-write) is skipped."""
    events = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            if i >= len(lines) - 2:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON event") from None
    return events


def of(events: Iterable[Event], src: str, type_: str | None = None) -> Iterator[Event]:
    """The events from `src` (and of `type_`, when given)."""
    for event in events:
        if event["src"] == src and (type_ is None or event["type"] == type_):
            yield event


def pid_of(worker_id: str | None) -> int | None:
    """The process id inside a worker id (`role:host:pid:nonce`), or None."""
    if not worker_id:
        return None
    parts = worker_id.split(":")
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None
