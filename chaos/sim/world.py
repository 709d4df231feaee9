"""The outside world of a simulation, in-process: the model provider and the side-effect
receiver, on the virtual clock.

The fakes answer exactly as `chaos.fakes` do over HTTP (the same step outputs, billing, fault
functions and ledger fields), but without a socket: an engine's in-process driver routes its
HTTP function to `post()`, which answers with what that function would return, or raises
what it would raise (the driver's `ClientErrors` say which), so the engine's own client code
runs around them. A request takes virtual time (its latency, or the client's timeout),
during which other actors run. Ledgers record virtual times.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, Protocol


from chaos.fakes.attribution import call_attribution, effect_attribution
from chaos.fakes.answers import reply, step_from_prompt, tokens
from chaos.fakes.provider import PRICE_PER_1K, _error_body, retry_after_header
from chaos.fakes.receiver import apply_status
from chaos.fakes.server import BadRequest
from chaos.sim.scheduler import Scheduler

#: Virtual seconds a provider call or receiver request takes when nothing slows it down.
LATENCY = 0.01
PROVIDER_URL = "sim://provider/v1"
RECEIVER_URL = "sim://receiver/v1/effects"


class ClientErrors(Protocol):
    """What the engine's HTTP function raises, for the fakes to raise in its place."""

    def status(self, url: str, status: int, body: Any, retry_after: str | None,
               now: float) -> Exception:
        """A non-2xx answer (`retry_after`: the Retry-After header, if any, as sent: seconds,
        an HTTP date or junk), arriving at virtual time `now`: what `time.time()` would
        give the client then, the clock an HTTP date is read against."""

    def reset(self, url: str) -> Exception:
        """The connection was dropped before an answer."""

    def timeout(self, url: str, seconds: float) -> Exception:
        """No answer within the client's timeout."""


# -- the model provider ------------------------------------------------------------------------

class SimProvider:
    """The fake provider (chaos.fakes.provider) in-process: call counts per (job, step), the
    ledger, and the fault policy (`provider_fault(job, step, n)`, e.g. FaultPolicy)."""

    def __init__(self, sched: Scheduler, faults: Any, errors: ClientErrors) -> None:
        self.sched, self.faults, self.errors = sched, faults, errors
        self.calls: Counter[tuple] = Counter()
        self.entries: list[dict] = []
        self._completions = 0

    def post(self, url: str, request: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        """One completion request: ledger it, take its virtual time, answer or raise."""
        who = call_attribution(headers, request, step_from_prompt(request))
        job, step = who["job"], who["step"]
        self.calls[(job, step)] += 1
        n = self.calls[(job, step)]
        fault = self.faults.provider_fault(job, step, n) if self.faults else None
        kind = fault["kind"] if fault else None
        sched, start = self.sched, self.sched.now_us
        entry = {"server": "provider", "t_start": sched.now(), "job": job, "step": step,
                 "worker": who["worker"], "n": n,
                 "auth": "Authorization" in headers, "fault": kind}
        # A trickling hang (fault "trickle") is a hang here: the fake answers in place of
        # the engine's HTTP function, so no bytes trickle; the virtual time passes the same.
        wait = fault["seconds"] if kind in ("hang", "slow") else LATENCY
        answered = sched.time_at(start + sched.us(wait))
        answer = self._answer(url, entry, fault, kind, request, step, answered)
        entry["t_end"] = answered
        entry["seq"] = len(self.entries) + 1
        self.entries.append(entry)
        if entry.get("trickle") and wait >= timeout:
            # The fake stands in for the engine's HTTP function: its client leaves at its
            # deadline (or sooner, killed), which the ledger says as a real fake would see it.
            entry["client_gone_at"] = sched.time_at(start + sched.us(timeout))
        sched.sleep(min(wait, timeout))
        if wait >= timeout:
            raise self.errors.timeout(url, timeout)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _answer(self, url: str, entry: dict, fault: dict | None, kind: str | None,
                request: Any, step: str, answered: float) -> tuple[int, Any] | Exception:
        """Fill the ledger fields; return the client's answer (which reaches it at virtual
        time `answered`) or the error it will raise."""
        if kind == "reset":
            entry.update(_unbilled(None, "reset"))
            return self.errors.reset(url)
        if kind == "status":
            return self._refusal(url, entry, fault["status"], fault.get("retry_after"),
                                 answered, form=fault.get("retry_after_form"))
        if kind == "garbage":
            entry.update(_unbilled(200, "garbage"))
            return 200, "<html>upstream garbage"
        try:
            content, prompt = reply(request, step, kind)
        except BadRequest as exc:
            return self._refusal(url, entry, 400, None, answered, str(exc))
        completion = tokens(content)
        cost = round(prompt / 1000 * PRICE_PER_1K[0] + completion / 1000 * PRICE_PER_1K[1], 8)
        self._completions += 1
        completion_id = f"chatcmpl-{self._completions}"
        entry.update(status=200, billed=cost, prompt_tokens=prompt, completion_tokens=completion,
                     completion_id=completion_id,
                     outcome=kind if kind in ("hang", "bad_content", "schema") else "ok")
        if kind == "hang" and fault.get("trickle"):
            entry["trickle"] = True
        return 200, {
            "id": completion_id, "object": "chat.completion",
            "created": int(self.sched.now()), "model": request.get("model") or "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, "cost": cost}}

    def _refusal(self, url: str, entry: dict, status: int, retry_after: float | None,
                 answered: float, message: str | None = None,
                 form: str | None = None) -> Exception:
        header, fields = retry_after_header(retry_after, form, self.sched.now())
        entry.update({**_unbilled(status, "error"), **fields})
        error_type = ("rate_limit_error" if status == 429 else
                      "invalid_request_error" if status < 500 else "server_error")
        body = _error_body(message or f"injected HTTP {status}", error_type, error_type)
        return self.errors.status(url, status, body, header, now=answered)


def _unbilled(status: int | None, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "billed": 0.0, "prompt_tokens": 0,
            "completion_tokens": 0, "completion_id": None}


# -- the side-effect receiver ------------------------------------------------------------------

class SimReceiver:
    """The fake receiver (chaos.fakes.receiver) in-process: applies an effect once per
    idempotency key (every time without one), faults from `faults.receiver_fault(job, kind,
    n)`, a ledger, and the applied effects."""

    def __init__(self, sched: Scheduler, faults: Any, errors: ClientErrors) -> None:
        self.sched, self.faults, self.errors = sched, faults, errors
        self.calls: Counter[tuple] = Counter()
        self.entries: list[dict] = []
        self.effects: list[dict] = []
        self._by_key: dict[str, dict] = {}

    def post(self, url: str, effect: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        """One effect request: applied, replayed, refused, dropped, answered too late or lost."""
        who = effect_attribution(headers, effect)
        key, job, kind, worker = who["key"], who["job"], who["kind"], who["worker"]
        self.calls[(job, kind)] += 1
        n = self.calls[(job, kind)]
        fault = self.faults.receiver_fault(job, kind, n) if self.faults else None
        fkind = fault["kind"] if fault else None
        sched = self.sched
        entry = {"server": "receiver", "t_start": sched.now(), "key": key, "job": job,
                 "kind": kind, "worker": worker, "n": n, "fault": fkind}
        who = (key, job, kind, worker, n, effect)
        if fkind == "timeout":
            return self._late(url, entry, fault["seconds"], who, timeout)
        if fkind == "lost":  # held past the client's timeout, then thrown away
            seconds = fault["seconds"]
            entry.update(status=None, outcome="lost", applied=False, effect_id=None)
            self._ledger(entry, sched.now_us + sched.us(seconds))
            sched.sleep(min(seconds, timeout))
            raise (self.errors.timeout(url, timeout) if seconds >= timeout
                   else self.errors.reset(url))
        if fkind == "status":
            entry.update(_not_applied(fault["status"]))
            answer: tuple | Exception = self.errors.status(
                url, fault["status"], {"error": f"injected HTTP {fault['status']}"}, None,
                now=sched.now())
        else:
            answer = self._decide(url, entry, who)
            if fkind == "drop":
                entry.update(status=None, outcome="dropped")
                answer = self.errors.reset(url)
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
            raise self.errors.timeout(url, timeout)
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    def _decide(self, url: str, entry: dict, who: tuple) -> tuple[int, Any] | Exception:
        key, job, kind, worker, n, effect = who
        fingerprint = json.dumps(effect, sort_keys=True)
        prior = self._by_key.get(key) if key is not None else None
        if prior is None:
            effect_id = f"eff_{len(self.effects) + 1}"
            self.effects.append({"id": effect_id, "key": key, "job": job, "kind": kind,
                                 "worker": worker, "body": effect, "t": self.sched.now()})
            if key is not None:
                self._by_key[key] = {"fingerprint": fingerprint, "id": effect_id}
            status = apply_status(job, kind, n)
            entry.update(status=status, outcome="applied", applied=True, effect_id=effect_id)
            return status, {"id": effect_id, "applied": True}
        if prior["fingerprint"] != fingerprint:
            entry.update(_not_applied(422), outcome="conflict")
            return self.errors.status(url, 422, {"error": "idempotency key reused with a "
                                                 "different body"}, None,
                                      now=self.sched.now())
        entry.update(status=200, outcome="replayed", applied=False, effect_id=prior["id"])
        return 200, {"id": prior["id"], "applied": True}

    def _ledger(self, entry: dict, end_us: int) -> None:
        entry["t_end"] = self.sched.time_at(end_us)
        entry["seq"] = len(self.entries) + 1
        self.entries.append(entry)


def _not_applied(status: int) -> dict:
    return {"status": status, "outcome": "error", "applied": False, "effect_id": None}


