"""A fake side-effect receiver on 127.0.0.1 that behaves like a payment API with idempotency keys:
it owns the list of applied effects, which is where a duplicated side effect becomes visible."""

import copy
import json
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from .server import JOB_HEADER, WORKER_HEADER, Deliver, FakeServer, JsonHandler

KIND_HEADER = "X-Ninelives-Kind"
KEY_HEADER = "Idempotency-Key"
RECEIVER_FAULTS = frozenset({"status", "timeout", "drop"})

_CONFLICT = {"error": "idempotency key reused with a different body"}


@dataclass
class _Decision:
    """What one request did to the applied list and what it should be answered."""

    status: int
    body: dict
    outcome: str
    applied: bool
    effect_id: str | None
    headers: dict = field(default_factory=dict)


class FakeReceiver(FakeServer):
    """A fake effects API: POST applies an effect once per idempotency key (every time without one).

    Takes the ledger path, an optional fault policy (`receiver_fault(job, kind, n) -> dict | None`),
    host and port. `url` is the effects endpoint. Every POST writes one ledger entry.
    """

    base_path = "/v1/effects"

    def __init__(self, ledger_path, faults=None, host: str = "127.0.0.1", port: int = 0):
        super().__init__(ledger_path, faults, host, port)
        self._effects: list[dict] = []
        self._by_key: dict[str, dict] = {}
        self._apply_lock = threading.Lock()

    def applied(self) -> list[dict]:
        """Return a copy of the applied effects, oldest first: {id, key, job, kind, worker, body, t}."""
        with self._apply_lock:
            return copy.deepcopy(self._effects)

    def calls_for(self, job: str | None, kind: str | None) -> int:
        """Return how many effect requests were received for (job, kind)."""
        return self.calls((job, kind))

    def serve_effect(self, http: JsonHandler) -> None:
        """Apply (or replay, refuse, drop) one effect request as the fault policy says, and ledger it."""
        t_start = time.time()
        raw = http.read_body()
        key, job = http.headers.get(KEY_HEADER), http.headers.get(JOB_HEADER)
        kind, worker = http.headers.get(KIND_HEADER), http.headers.get(WORKER_HEADER)
        n = self.count_call((job, kind))
        fault = self.faults.receiver_fault(job, kind, n) if self.faults else None
        result, deliver = self._answer(http, raw, (key, job, kind, worker), fault)
        self.ledger.append({
            "server": "receiver", "t_start": t_start, "t_end": time.time(), "key": key, "job": job,
            "kind": kind, "worker": worker, "n": n, "fault": fault["kind"] if fault else None, **result})
        deliver()  # after the ledger line: whatever a client saw, its entry can already be read

    def _answer(self, http: JsonHandler, raw: bytes, who: tuple, fault) -> tuple[dict, Deliver]:
        """Decide the request: return (ledger fields, the action that answers the client)."""
        fault_kind = fault["kind"] if fault else None
        if fault_kind is not None and fault_kind not in RECEIVER_FAULTS:
            raise ValueError(f"unknown receiver fault {fault!r}")
        if fault_kind == "status":
            body = {"error": f"injected HTTP {fault['status']}"}
            return _not_applied(fault["status"], "error"), partial(http.send_json, fault["status"], body)
        try:
            effect = json.loads(raw)
        except ValueError:
            return _not_applied(400, "error"), partial(http.send_json, 400, {"error": "body is not JSON"})
        if fault_kind == "timeout":
            self.pause(fault["seconds"])  # the client gives up first; the effect still lands
        decision = self._apply(*who, effect)
        if fault_kind == "drop":
            return {"status": None, "outcome": "dropped", "applied": decision.applied,
                    "effect_id": decision.effect_id}, http.reset_connection
        late = fault_kind == "timeout" and decision.outcome == "applied"
        return ({"status": decision.status, "outcome": "applied_late" if late else decision.outcome,
                 "applied": decision.applied, "effect_id": decision.effect_id},
                partial(http.send_json, decision.status, decision.body, decision.headers))

    def _apply(self, key, job, kind, worker, effect) -> _Decision:
        fingerprint = json.dumps(effect, sort_keys=True)  # 1 and true differ, as on the wire
        with self._apply_lock:  # check-and-apply is atomic: one key applies at most once
            prior = self._by_key.get(key) if key is not None else None
            if prior is None:
                return self._record(key, job, kind, worker, effect, fingerprint)
            if prior["fingerprint"] != fingerprint:
                return _Decision(422, _CONFLICT, "conflict", False, None)
            return _Decision(200, prior["response"], "replayed", False, prior["response"]["id"],
                             {"Idempotent-Replayed": "true"})

    def _record(self, key, job, kind, worker, effect, fingerprint) -> _Decision:
        effect_id = f"eff_{len(self._effects) + 1}"
        self._effects.append({"id": effect_id, "key": key, "job": job, "kind": kind, "worker": worker,
                              "body": effect, "t": time.time()})
        response = {"id": effect_id, "applied": True}
        if key is not None:
            self._by_key[key] = {"fingerprint": fingerprint, "response": response}
        return _Decision(201, response, "applied", True, effect_id)


class _ReceiverHandler(JsonHandler):
    def do_GET(self):
        if self.route == FakeReceiver.base_path:
            self.send_json(200, {"data": self.fake.applied()})
        elif self.route == "/healthz":
            self.send_json(200, {"ok": True})
        else:
            self.send_json(404, {"error": f"no route {self.route}"})

    def do_POST(self):
        if self.route == FakeReceiver.base_path:
            self.serve(self.fake.serve_effect)
            return
        self.read_body()
        self.send_json(404, {"error": f"no route {self.route}"})


FakeReceiver.handler_class = _ReceiverHandler


def _not_applied(status: int, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "applied": False, "effect_id": None}
