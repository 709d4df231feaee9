"""The outbox as its checks read it, gathered in one pass: the receiver's requests and the
outbox rows per effect (job, kind), each sender's sends, the kills."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from chaos.history import Event
from chaos.checkers.ops import is_effect, is_engine, pids_by_worker


Effect = tuple[str, str]  # (job, kind)


@dataclass
class OutboxIndex:
    """What the outbox checks need from the history, gathered in one pass."""

    t0: float = 0.0
    requests: dict[Effect, list[Event]] = field(default_factory=lambda: defaultdict(list))
    rows: dict[Effect, list[Event]] = field(default_factory=lambda: defaultdict(list))
    sends: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    kills: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    pids: dict[str, int] = field(default_factory=dict)
    unattributed: int = 0


def read_outbox(history: list[Event]) -> OutboxIndex:
    idx = OutboxIndex(t0=history[0]["t"] if history else 0.0, pids=pids_by_worker(history))
    by_key = {e["key"]: (e["job"], e["kind"]) for e in history
              if is_engine(e, "effect_queued") and e.get("key") is not None}
    for e in history:
        src, type_ = e.get("src"), e.get("type")
        if src == "receiver" and type_ == "request":
            effect = effect_of(e, by_key)
            if effect is None:
                idx.unattributed += 1
                continue
            idx.requests[effect].append(e)
            if e.get("worker"):
                idx.sends[e["worker"]].append(e["t_start"])
        elif is_effect(e):
            idx.rows[(e["job"], e["kind"])].append(e)
        elif src == "process" and type_ == "exit" and e.get("signal") == "SIGKILL":
            idx.kills[e["pid"]].append(e["t"])
    for starts in idx.sends.values():
        starts.sort()
    return idx


def effect_of(request: Event, by_key: dict[str, Effect] | None = None) -> Effect | None:
    """(job, kind) of a receiver request, as the receiver attributed it, or else from the
    outbox row that queued its idempotency key."""
    job, kind = request.get("job"), request.get("kind")
    if (job is None or kind is None) and by_key and request.get("key") in by_key:
        key_job, key_kind = by_key[request["key"]]
        job, kind = job or key_job, kind or key_kind
    return None if job is None or kind is None else (job, kind)
