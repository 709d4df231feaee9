"""The outside world of a simulation, in-process: the model provider, the side-effect receiver,
the heartbeat, and engine stores wired to the virtual clock.

The fakes answer exactly as `chaos.fakes` do over HTTP (the same step outputs, billing, fault
functions and ledger fields), but without a socket: the engine's one HTTP function
(`post_json`) is routed to them while a simulation runs, and they answer with what it would
return or raise (`engine.http`'s errors, Retry-After parsed). So the engine's own client
code runs: the chat client reading cost and content, the document steps checking schemas,
the outbox sender setting the idempotency key. A request takes virtual time (its latency,
or the client's timeout), during which other actors run. Ledgers record virtual times.
"""
from __future__ import annotations

import json
import math
import random
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

from engine import CallTimeout, PoisonError, RetryableError
from engine.http import parse_retry_after
from engine.retry import classify_status
from engine.store import SQLiteStore, StoreBusy, open_store

from ..reference import audit
from ..fakes.provider import _content, _error_body, _messages, _parse_input, step_output
from ..fakes.server import BadRequest
from .scheduler import INF, Scheduler, VirtualClock

#: Virtual seconds a provider call or receiver request takes when nothing slows it down.
LATENCY = 0.01
PRICE_PER_1K = (0.001, 0.003)  # the fake provider's default prices (prompt, completion)
PROVIDER_URL = "sim://provider/v1"
RECEIVER_URL = "sim://receiver/v1/effects"
NOW_FUNCTION = "ninelives_sim_now"


# -- stores ----------------------------------------------------------------------------------

def install_audit(conn, now_sql: str = f"{NOW_FUNCTION}()") -> None:
    """The audit triggers of `chaos.audit`, stamping `t` from the simulation's virtual clock
    (a function registered on every simulated connection) instead of SQLite's real one."""
    conn.execute("CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
                 " kind TEXT NOT NULL, op TEXT NOT NULL, data TEXT NOT NULL)")
    for (table, op), body in audit.TRIGGERS.items():
        conn.execute(
            f"CREATE TRIGGER IF NOT EXISTS audit_{table}_{op} AFTER {op.upper()} ON {table}"
            f" BEGIN INSERT INTO audit (t, kind, op, data)"
            f" VALUES ({now_sql}, '{audit.KIND[table]}', '{op}', {body}); END")


def sim_store(path: str, sched: Scheduler, busy_timeout: float, seed: str) -> SQLiteStore:
    """An engine store whose audit triggers and lock wait run on the virtual clock."""
    store = open_store(path, synchronous="NORMAL", busy_timeout=busy_timeout)
    store.conn.create_function(NOW_FUNCTION, 0, sched.now)
    store.wait_clock = VirtualClock(sched)
    store.wait_rng = random.Random(seed)
    return store


# -- the network: the engine's HTTP calls, answered in-process -------------------------------

@contextmanager
def routed(provider: "SimProvider", receiver: "SimReceiver") -> Iterator[None]:
    """Answer the engine's HTTP posts (`post_json` as `engine.provider` and `engine.outbox`
    import it) with the simulation's fakes, for the duration of the block. The engine's own
    client code (ChatClient, DocumentSteps, Sender.send) runs unchanged around them."""
    import engine.outbox
    import engine.provider

    def post_json(url: str, body: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        if url.startswith(PROVIDER_URL):
            return provider.post(url, body, headers, timeout)
        if url.startswith(RECEIVER_URL):
            return receiver.post(url, body, headers, timeout)
        raise PoisonError(f"not a simulated URL: {url!r}")

    saved = engine.provider.post_json, engine.outbox.post_json
    engine.provider.post_json = engine.outbox.post_json = post_json
    try:
        yield
    finally:
        engine.provider.post_json, engine.outbox.post_json = saved


def http_error(url: str, status: int, body: Any, retry_after: float | None = None) -> Exception:
    """What `engine.http.post_json` raises for a non-2xx answer."""
    text = body if isinstance(body, str) else json.dumps(body)
    message = f"POST {url} answered {status}: {text[:200]}"
    if classify_status(status):
        return RetryableError(message, retry_after=retry_after)
    return PoisonError(message)


def reset_error(url: str) -> Exception:
    """What `engine.http.post_json` raises when the connection is dropped."""
    return RetryableError(f"POST {url} failed: RemoteDisconnected: Remote end closed "
                          "connection without response")


# -- the model provider ------------------------------------------------------------------------

class SimProvider:
    """The fake provider (chaos.fakes.provider) in-process: call counts per (job, step), the
    ledger, and the fault policy (`provider_fault(job, step, n)`, e.g. FaultPolicy)."""

    def __init__(self, sched: Scheduler, faults: Any) -> None:
        self.sched, self.faults = sched, faults
        self.calls: Counter[tuple] = Counter()
        self.entries: list[dict] = []
        self._completions = 0

    def post(self, url: str, request: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        """One completion request: ledger it, take its virtual time, answer or raise."""
        job, step = headers.get("X-Ninelives-Job"), headers.get("X-Ninelives-Step")
        self.calls[(job, step)] += 1
        n = self.calls[(job, step)]
        fault = self.faults.provider_fault(job, step, n) if self.faults else None
        kind = fault["kind"] if fault else None
        sched, start = self.sched, self.sched.now_us
        entry = {"server": "provider", "t_start": sched.now(), "job": job, "step": step,
                 "worker": headers.get("X-Ninelives-Worker"), "n": n,
                 "auth": "Authorization" in headers, "fault": kind}
        answer = self._answer(url, entry, fault, kind, request, step)
        wait = fault["seconds"] if kind in ("hang", "slow") else LATENCY
        entry["t_end"] = sched.time_at(start + sched.us(wait))
        entry["seq"] = len(self.entries) + 1
        self.entries.append(entry)
        sched.sleep(min(wait, timeout))
        if wait >= timeout:
            raise CallTimeout(f"POST {url} timed out after {timeout} s")
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _answer(self, url: str, entry: dict, fault: dict | None, kind: str | None,
                request: Any, step: str) -> tuple[int, Any] | Exception:
        """Fill the ledger fields; return the client's answer or the error it will raise."""
        if kind == "reset":
            entry.update(_unbilled(None, "reset"))
            return reset_error(url)
        if kind == "status":
            return self._refusal(url, entry, fault["status"], fault.get("retry_after"))
        if kind == "garbage":
            entry.update(_unbilled(200, "garbage"))
            return 200, "<html>upstream garbage"
        try:
            system, user = _messages(request)
            content = _content(step_output(step, _parse_input(user)), kind)
        except BadRequest as exc:
            return self._refusal(url, entry, 400, None, str(exc))
        prompt, completion = math.ceil(len(system + user) / 4), math.ceil(len(content) / 4)
        cost = round(prompt / 1000 * PRICE_PER_1K[0] + completion / 1000 * PRICE_PER_1K[1], 8)
        self._completions += 1
        completion_id = f"chatcmpl-{self._completions}"
        entry.update(status=200, billed=cost, prompt_tokens=prompt, completion_tokens=completion,
                     completion_id=completion_id,
                     outcome=kind if kind in ("hang", "bad_content", "schema") else "ok")
        return 200, {
            "id": completion_id, "object": "chat.completion",
            "created": int(self.sched.now()), "model": request.get("model") or "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, "cost": cost}}

    @staticmethod
    def _refusal(url: str, entry: dict, status: int, retry_after: float | None,
                 message: str | None = None) -> Exception:
        entry.update({**_unbilled(status, "error"), "retry_after": retry_after})
        error_type = ("rate_limit_error" if status == 429 else
                      "invalid_request_error" if status < 500 else "server_error")
        body = _error_body(message or f"injected HTTP {status}", error_type, error_type)
        return http_error(url, status, body,
                          parse_retry_after(None if retry_after is None else str(retry_after)))


def _unbilled(status: int | None, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "billed": 0.0, "prompt_tokens": 0,
            "completion_tokens": 0, "completion_id": None}


# -- the side-effect receiver ------------------------------------------------------------------

class SimReceiver:
    """The fake receiver (chaos.fakes.receiver) in-process: applies an effect once per
    idempotency key (every time without one), faults from `faults.receiver_fault(job, kind,
    n)`, a ledger, and the applied effects."""

    def __init__(self, sched: Scheduler, faults: Any) -> None:
        self.sched, self.faults = sched, faults
        self.calls: Counter[tuple] = Counter()
        self.entries: list[dict] = []
        self.effects: list[dict] = []
        self._by_key: dict[str, dict] = {}

    def post(self, url: str, effect: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        """One effect request: applied, replayed, refused, dropped or answered too late."""
        key, job = headers.get("Idempotency-Key"), headers.get("X-Ninelives-Job")
        kind, worker = headers.get("X-Ninelives-Kind"), headers.get("X-Ninelives-Worker")
        self.calls[(job, kind)] += 1
        n = self.calls[(job, kind)]
        fault = self.faults.receiver_fault(job, kind, n) if self.faults else None
        fkind = fault["kind"] if fault else None
        sched = self.sched
        entry = {"server": "receiver", "t_start": sched.now(), "key": key, "job": job,
                 "kind": kind, "worker": worker, "n": n, "fault": fkind}
        who = (key, job, kind, worker, effect)
        if fkind == "timeout":
            return self._late(url, entry, fault["seconds"], who, timeout)
        if fkind == "status":
            entry.update(_not_applied(fault["status"]))
            answer: tuple | Exception = http_error(
                url, fault["status"], {"error": f"injected HTTP {fault['status']}"})
        else:
            answer = self._decide(url, entry, who)
            if fkind == "drop":
                entry.update(status=None, outcome="dropped")
                answer = reset_error(url)
        self._ledger(entry, sched.now_us + sched.us(LATENCY))
        sched.sleep(LATENCY)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _late(self, url: str, entry: dict, seconds: float, who: tuple,
              timeout: float) -> tuple[int, Any]:
        """The receiver holds the request `seconds`, then applies it; a client whose timeout
        is shorter gave up before (the "did it go?" case)."""
        sched = self.sched
        due = sched.now_us + sched.us(seconds)
        answer: list = []

        def apply() -> None:
            answer.append(self._decide(url, entry, who))
            if entry["outcome"] == "applied":
                entry["outcome"] = "applied_late"
            self._ledger(entry, due)

        sched.at(due, apply)
        sched.sleep(min(seconds, timeout))
        if seconds >= timeout:
            raise CallTimeout(f"POST {url} timed out after {timeout} s")
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    def _decide(self, url: str, entry: dict, who: tuple) -> tuple[int, Any] | Exception:
        key, job, kind, worker, effect = who
        fingerprint = json.dumps(effect, sort_keys=True)
        prior = self._by_key.get(key) if key is not None else None
        if prior is None:
            effect_id = f"eff_{len(self.effects) + 1}"
            self.effects.append({"id": effect_id, "key": key, "job": job, "kind": kind,
                                 "worker": worker, "body": effect, "t": self.sched.now()})
            if key is not None:
                self._by_key[key] = {"fingerprint": fingerprint, "id": effect_id}
            entry.update(status=201, outcome="applied", applied=True, effect_id=effect_id)
            return 201, {"id": effect_id, "applied": True}
        if prior["fingerprint"] != fingerprint:
            entry.update(_not_applied(422), outcome="conflict")
            return http_error(url, 422, {"error": "idempotency key reused with a different body"})
        entry.update(status=200, outcome="replayed", applied=False, effect_id=prior["id"])
        return 200, {"id": prior["id"], "applied": True}

    def _ledger(self, entry: dict, end_us: int) -> None:
        entry["t_end"] = self.sched.time_at(end_us)
        entry["seq"] = len(self.entries) + 1
        self.entries.append(entry)


def _not_applied(status: int) -> dict:
    return {"status": status, "outcome": "error", "applied": False, "effect_id": None}


# -- the heartbeat -----------------------------------------------------------------------------

class SimHeartbeat:
    """The engine's heartbeat, simulated: one actor per worker process with its own store that
    ticks every half interval on the virtual clock and, like `engine.worker.Heartbeat`,
    extends the lease of a step watched at least half an interval, and reports a lost lease.

    Between watches it does not wake (a tick with nothing watched changes nothing), but its
    ticks keep the real thread's grid: the worker's start plus a whole number of half
    intervals. Its store is opened at its first beat (`open_store`).
    """

    def __init__(self, sched: Scheduler, clock: VirtualClock, lease: float, every: float,
                 worker_id: str) -> None:
        self.sched, self.clock, self.lease, self.worker_id = sched, clock, lease, worker_id
        self.half_us = sched.us(every / 2)
        self.origin = sched.now_us
        self.actor = None
        self.store: SQLiteStore | None = None
        self.open_store: Any = None  # opens the heartbeat's own store, at its first beat
        self.watched: tuple | None = None
        self.next_tick = INF

    @contextmanager
    def watching(self, claim) -> Iterator[threading.Event]:
        lost = threading.Event()
        self.watched = (claim, lost, self.sched.now_us)
        self.next_tick = self._tick_after(self.sched.now_us)
        self.sched.wake_at(self.actor, self.next_tick)
        try:
            yield lost
        finally:
            self.watched = None

    def _tick_after(self, now_us: int) -> int:
        k = (now_us - self.origin) // self.half_us + 1
        return self.origin + k * self.half_us

    def run(self) -> None:
        """The actor's body."""
        while True:
            if self.next_tick == INF:
                self.sched.wait()
            else:
                self.sched.sleep_until(self.next_tick)
            watched = self.watched
            if watched is None:
                self.next_tick = INF
                continue
            self.next_tick = self._tick_after(self.sched.now_us)
            claim, lost, since = watched
            if self.sched.now_us - since < self.half_us:
                continue
            self._beat(claim, lost, watched)

    def _beat(self, claim, lost: threading.Event, watched: tuple) -> None:
        if self.store is None:
            self.store = self.open_store()
        try:
            if not self.store.heartbeat(claim.job_id, claim.lease_token, self.clock.now(),
                                        self.lease, self.worker_id):
                lost.set()
                if self.watched is watched:
                    self.watched = None
        except StoreBusy:
            pass  # the lease still runs; try again next tick
