"""A fake side-effect receiver on 127.0.0.1 that behaves like a payment API with idempotency keys:
it owns the list of applied effects, which is where a duplicated side effect becomes visible.

Attribution (chaos.fakes.attribution): job, kind and worker come from the X-Ninelives headers,
else from the JSON body's "job", "kind" and "worker" fields; the key only from Idempotency-Key.

Ledger. Each entry holds key, job, kind, worker, `attributed` ("headers" | "body" | "none"),
`caller_pid` (the process that sent it, from its socket: chaos.fakes.peer), n, the fault, `outcome` and `applied` (what the fake did), and `completion` (what the sender can
know): "ok" applied or replayed and answered; "fail" an error status answered, nothing applied
(an injected 5xx, a body that is not JSON, a key reused with another body); "info" a dropped
connection or a timeout, applied or not (a "lost" request is held past the timeout and never
applied), or a sender that had already gone when the answer was
ready: it cannot know whether the effect landed.

A first apply is answered 201 (created), or as real payment APIs sometimes do 200 or 202
(accepted), for a share of requests fixed by (job, kind, n) (apply_status); a replay is
answered 200 with Idempotent-Replayed: true.
"""

import copy
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from functools import partial

from chaos.fakes.attribution import effect_attribution
from chaos.fakes.server import FAIL, INFO, OK, Deliver, FakeServer, JsonHandler

RECEIVER_FAULTS = frozenset({"status", "timeout", "drop", "lost"})

_CONFLICT = {"error": "idempotency key reused with a different body"}
_NOT_JSON = object()  # a body that does not parse (JSON null is an effect like any other)
#: The statuses a first apply is answered with, drawn per request by apply_status.
_APPLY_STATUSES = (201, 201, 201, 201, 200, 202)


def apply_status(job, kind, n: int) -> int:
    """The 2xx the n-th request of (job, kind) is answered with if it applies its effect:
    201 for two thirds of them, 200 or 202 for a sixth each (a pure function of its args)."""
    digest = hashlib.blake2b(f"apply:{job}:{kind}:{n}".encode(), digest_size=8).digest()
    return _APPLY_STATUSES[int.from_bytes(digest, "big") % len(_APPLY_STATUSES)]


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
        t_start = http.received
        effect = _parse_json(http.read_body())
        who = effect_attribution(http.headers, effect)
        key, job, kind, worker = who["key"], who["job"], who["kind"], who["worker"]
        n = self.count_call((job, kind))
        fault = self.faults.receiver_fault(job, kind, n) if self.faults else None
        result, deliver = self._answer(http, effect, (key, job, kind, worker, n), fault)
        completion = INFO if http.client_gone() else _completion(result["outcome"], fault)
        self.settle(http, {
            "server": "receiver", "t_start": t_start, "t_end": time.time(), **who, "n": n,
            "caller_pid": http.caller_pid(),
            "fault": fault["kind"] if fault else None, **result, "completion": completion}, deliver)

    def _answer(self, http: JsonHandler, effect, who: tuple, fault) -> tuple[dict, Deliver]:
        """Decide the request: return (ledger fields, the action that answers the client)."""
        fault_kind = fault["kind"] if fault else None
        if fault_kind is not None and fault_kind not in RECEIVER_FAULTS:
            raise ValueError(f"unknown receiver fault {fault!r}")
        if fault_kind == "status":
            body = {"error": f"injected HTTP {fault['status']}"}
            return _not_applied(fault["status"], "error"), partial(http.send_json, fault["status"], body)
        if effect is _NOT_JSON:
            return _not_applied(400, "error"), partial(http.send_json, 400, {"error": "body is not JSON"})
        if fault_kind == "lost":  # held past the client's timeout, then thrown away
            self.pause(fault["seconds"])
            return ({"status": None, "outcome": "lost", "applied": False, "effect_id": None},
                    http.reset_connection)
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

    def _apply(self, key, job, kind, worker, n, effect) -> _Decision:
        fingerprint = json.dumps(effect, sort_keys=True)  # 1 and true differ, as on the wire
        with self._apply_lock:  # check-and-apply is atomic: one key applies at most once
            prior = self._by_key.get(key) if key is not None else None
            if prior is None:
                return self._record(key, job, kind, worker, effect, fingerprint,
                                    apply_status(job, kind, n))
            if prior["fingerprint"] != fingerprint:
                return _Decision(422, _CONFLICT, "conflict", False, None)
            return _Decision(200, prior["response"], "replayed", False, prior["response"]["id"],
                             {"Idempotent-Replayed": "true"})

    def _record(self, key, job, kind, worker, effect, fingerprint, status: int) -> _Decision:
        effect_id = f"eff_{len(self._effects) + 1}"
        self._effects.append({"id": effect_id, "key": key, "job": job, "kind": kind, "worker": worker,
                              "body": effect, "t": time.time()})
        response = {"id": effect_id, "applied": True}
        if key is not None:
            self._by_key[key] = {"fingerprint": fingerprint, "response": response}
        return _Decision(status, response, "applied", True, effect_id)


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


def _parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:  # includes UnicodeDecodeError
        return _NOT_JSON


def _completion(outcome: str, fault) -> str:
    """What a sender that got the answer can know: ok, fail (nothing applied), or info."""
    if fault is not None and fault["kind"] in ("timeout", "drop", "lost"):
        return INFO  # the answer outlasts the sender's timeout, or never comes
    return OK if outcome in ("applied", "replayed") else FAIL


def _not_applied(status: int, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "applied": False, "effect_id": None}
