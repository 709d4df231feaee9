"""A fake OpenAI-compatible model provider on 127.0.0.1: a deterministic answer to any
chat-completions request (plain or streamed), billing, injected faults, a ledger line per call.

Answers (chaos.fakes.answers): the document pipeline's steps keep their own outputs, whose
schema the reference engine checks; any other named step gets a digest and summary of its
input; any other prompt (an unmodified client's: no step named, or a document step asked in
prose) gets a free-form answer drawn from a hash of its model and messages. The same request
always gets the same answer. A body that is no JSON object, or has no messages, is refused (400).

Streaming. A request with `stream: true` is answered as server-sent events in OpenAI's
`chat.completion.chunk` format ending with `data: [DONE]` (chaos.fakes.stream), billed for
the pieces streamed. Faults apply to it as to any call: a refusal, reset or garbage is sent
instead of the stream; a hang or slow answer sends nothing until its seconds pass (a
trickling hang sends its headers at once, then a comment line per interval); "cut" ends the
stream after `after` pieces (default: half) by closing the connection before [DONE], and
bills only those. (A completion not streamed is cut after its headers and half its body,
billed whole.)

Attribution (chaos.fakes.attribution): job, step and worker come from the X-Ninelives headers,
else from the body's `metadata` ({"job", "step", "worker"}) and `user` (the job), the step last
from the system prompt's first line "step: NAME". None of them is required.

Ledger. Each entry holds job, step, worker, `attributed` ("headers" | "body" | "none"),
`caller_pid` (the process that sent it, from its socket: chaos.fakes.peer), n, the fault,
`outcome` (what the fake did), billing (`billed`, `prompt_tokens`, `completion_tokens`), and
`completion` (what the caller can know): "ok" a 200 completion delivered; "fail" a definite
answer it cannot use (429, 5xx, 4xx, garbage, bad content, schema-breaking content); "info"
it cannot have had the answer (a hang, a reset, a cut, or a client that had already gone
when the answer was ready). A streamed call's entry also holds `stream` true, `chunks` (the
answer's pieces), `chunks_sent` (those sent before a cut or the client's leaving) and
`client_gone_at`. The ledger never holds the API key: `auth` says whether a bearer was sent.

A refusal's Retry-After. `retry_after` is the wait it asks for, in seconds (None: no
guidance). A fault's `retry_after_form` says how the header carries it, as real providers
and proxies do: delta-seconds (no form: "0.5"); "date", an HTTP date (RFC 9110, one-second
resolution) rounded up so that it is never earlier than the seconds promised, its epoch
time ledgered as `retry_at`; "junk", a header no client can parse ("soon", ledgered with
`retry_after` None). `retry_after_header` is the header as sent, whenever one is.

A hang whose fault has `trickle` True sends the status line and headers at once, then the
body one byte every TRICKLE_INTERVAL seconds (shorter than any client timeout) for the
hang's seconds, then the rest: a client that bounds each socket read, not the whole
exchange, waits it out. Its ledger entry says `trickle` true, and `client_gone_at` the time
a write found the client gone (None: it stayed to the end); its t_end is still when the
hang ended, as for any hang.
"""

import email.utils
import json
import math
import threading
import time
from functools import partial

from chaos.fakes import stream
from chaos.fakes.answers import parse_json, reply, step_from_prompt, tokens
from chaos.fakes.attribution import call_attribution
from chaos.fakes.server import FAIL, INFO, OK, BadRequest, Deliver, FakeServer, JsonHandler
from chaos.fakes.stream import Chunks, EventStream, wants_usage

PROVIDER_FAULTS = frozenset({"status", "hang", "slow", "reset", "garbage", "bad_content", "schema",
                             "cut"})
_COMPLETION_PATHS = ("/v1/chat/completions", "/chat/completions")
_MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
_GARBAGE = b"<html>upstream garbage"
#: The Retry-After a "junk" refusal carries: what some proxies send, and no client can parse.
JUNK_RETRY_AFTER = "soon"
#: Seconds between two bytes of a trickling hang: shorter than any client's socket timeout.
TRICKLE_INTERVAL = 0.2


#: Prices per 1,000 prompt and completion tokens, a small model's as real providers list
#: them: not round multiples of 1e-6, so that an engine that rounds or truncates a cost is
#: seen by cost-accounted.
PRICE_PER_1K = (0.00015, 0.0006)


# --- the provider ---------------------------------------------------------------------------------

class FakeProvider(FakeServer):
    """A fake OpenAI chat-completions API answering any request (see the module docstring).

    Takes the ledger path, an optional fault policy (`provider_fault(job, step, n) -> dict | None`),
    `price_per_1k` = (prompt, completion) dollars per 1000 tokens, host and port. `url` is the
    OpenAI base URL (".../v1"). Every POST to the completions path writes one ledger entry.
    """

    base_path = "/v1"

    def __init__(self, ledger_path, faults=None, price_per_1k=PRICE_PER_1K,
                 host: str = "127.0.0.1", port: int = 0):
        super().__init__(ledger_path, faults, host, port)
        self.price_in, self.price_out = price_per_1k
        self._completions = 0

    def calls_for(self, job: str | None, step: str | None) -> int:
        """Return how many completion calls were received for (job, step)."""
        return self.calls((job, step))

    def serve_completion(self, http: JsonHandler) -> None:
        """Answer one completion request (or misbehave as the fault policy says) and ledger it."""
        t_start = http.received
        request = parse_json(http.read_body())
        who = call_attribution(http.headers, request, step_from_prompt(request))
        job, step = who["job"], who["step"]
        n = self.count_call((job, step))
        fault = self.faults.provider_fault(job, step, n) if self.faults else None
        result, deliver = self._answer(http, request, step, fault)
        completion = INFO if http.client_gone() else _completion(result["outcome"])
        self.settle(http, {
            "server": "provider", "t_start": t_start, "t_end": time.time(), **who, "n": n,
            "caller_pid": http.caller_pid(),
            "auth": _has_bearer(http.headers), "fault": fault["kind"] if fault else None,
            **result, "completion": completion}, deliver)

    def unrecorded_body(self, message: str) -> dict:
        return _error_body(message, "server_error", "ledger_unwritable")

    def _answer(self, http: JsonHandler, request, step, fault) -> tuple[dict, Deliver]:
        """Decide the call: return (ledger fields, the action that answers the client)."""
        kind = fault["kind"] if fault else None
        if kind is not None and kind not in PROVIDER_FAULTS:
            raise ValueError(f"unknown provider fault {fault!r}")
        if kind == "reset":
            return _unbilled(None, "reset"), http.reset_connection
        if kind == "status":
            return _refusal(http, fault["status"], fault.get("retry_after"),
                            form=fault.get("retry_after_form"))
        if kind == "garbage":
            return _unbilled(200, "garbage"), partial(http.send_bytes, 200, _GARBAGE, "text/html")
        try:
            content, prompt_tokens = reply(request, step, kind)
        except BadRequest as exc:
            return _refusal(http, 400, None, str(exc))
        if request.get("stream") is True:
            return self._stream(http, request, content, prompt_tokens, fault)
        completion, usage = self._complete(request, content, prompt_tokens)
        if kind == "cut":
            return self._cut(http, completion, usage)
        if kind == "hang" and fault.get("trickle"):
            return self._trickle(http, completion, usage, fault)
        if kind in ("hang", "slow"):
            self.pause(fault["seconds"])  # the work is done and billed; only the answer is late
        return {"status": 200, "outcome": _outcome(kind), **usage}, \
            partial(http.send_json, 200, completion)

    def _trickle(self, http: JsonHandler, completion: dict, usage: dict, fault: dict
                 ) -> tuple[dict, Deliver]:
        """A hang that keeps the connection busy: headers now, a byte per interval for the
        hang's seconds, the rest of the body once the ledger line is written."""
        interval = fault.get("interval", TRICKLE_INTERVAL)
        body = json.dumps(completion).encode()
        # Leading whitespace leaves the JSON as it was; enough that one byte is left to the end.
        body = b" " * max(0, math.ceil(fault["seconds"] / interval) + 1 - len(body)) + body
        sent, gone_at = http.trickle(200, body, fault["seconds"], interval, self.pause)
        deliver = partial(http.send_rest, body[sent:]) if gone_at is None else (lambda: False)
        return ({"status": 200, "outcome": "hang", **usage, "trickle": True,
                 "client_gone_at": gone_at}, deliver)

    def _cut(self, http: JsonHandler, completion: dict, usage: dict) -> tuple[dict, Deliver]:
        """A completion cut in transit: its head and half its body, then the connection
        closes. Billed whole: the provider made all of it."""
        body = json.dumps(completion).encode()
        if http.send_head(200, {"Content-Type": "application/json",
                                "Content-Length": str(len(body))}):
            http.send_rest(body[: len(body) // 2])
        http.close_connection = True
        return {"status": 200, "outcome": "cut", **usage}, lambda: None

    def _stream(self, http: JsonHandler, request: dict, content: str, prompt_tokens: int,
                fault: dict | None) -> tuple[dict, Deliver]:
        """Stream the answer as server-sent events (chaos.fakes.stream), all but its end; a
        "cut" fault ends it after `after` pieces (default: half). Billed for what was sent."""
        kind = fault["kind"] if fault else None
        completion_id = f"chatcmpl-{self._next_completion()}"
        chunks = Chunks(completion_id, request.get("model") or "fake-model", int(time.time()))
        parts = stream.pieces(content)
        stop = min(len(parts), int(fault.get("after", len(parts) // 2))) if kind == "cut" \
            else len(parts)
        trickle = kind == "hang" and bool(fault.get("trickle"))
        if kind in ("hang", "slow") and not trickle:
            self.pause(fault["seconds"])  # nothing sent until the hang ends
        out = EventStream(http)
        if out.open() and trickle:
            out.wait(fault["seconds"], fault.get("interval", TRICKLE_INTERVAL), self.pause)
        sent = out.send_all(map(chunks.piece, parts[:stop])) if out.event(chunks.role()) else 0
        usage = self._usage(prompt_tokens, tokens("".join(parts[:sent])), completion_id)
        fields = {"status": 200, "outcome": "cut" if kind == "cut" else _outcome(kind),
                  **usage, "stream": True, "chunks": len(parts), "chunks_sent": sent,
                  "client_gone_at": out.gone_at}
        if trickle:
            fields["trickle"] = True
        if kind == "cut":
            return fields, out.cut
        last = [chunks.finish()] + ([chunks.usage(_usage_document(usage))]
                                    if wants_usage(request) else [])
        return fields, partial(out.end, last)

    def _complete(self, request, content: str, prompt_tokens: int) -> tuple[dict, dict]:
        completion_id = f"chatcmpl-{self._next_completion()}"
        usage = self._usage(prompt_tokens, tokens(content), completion_id)
        completion = {
            "id": completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model") or "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": _usage_document(usage)}
        return completion, usage

    def _usage(self, prompt_tokens: int, completion_tokens: int, completion_id: str) -> dict:
        """The ledger's billing fields for one completion."""
        cost = round(prompt_tokens / 1000 * self.price_in + completion_tokens / 1000 * self.price_out, 8)
        return {"billed": cost, "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "completion_id": completion_id}

    def _next_completion(self) -> int:
        with self._counts_lock:
            self._completions += 1
            return self._completions


class TimedOutage:
    """A fault policy for a provider that is down for a while: every call from `start` (the
    machine's clock, time.time(); None: the first call asked about) for `seconds` is refused
    with `status` (503, no Retry-After unless given), as a real provider's outage answers;
    outside that window `inner`'s faults apply (None: none). Raises ValueError for a negative
    or non-finite duration."""

    def __init__(self, seconds: float, start: float | None = None, inner=None,
                 status: int = 503, retry_after: float | None = None):
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"an outage lasts a finite number of seconds >= 0, not {seconds!r}")
        self.seconds, self.start = seconds, start
        self.inner, self.status, self.retry_after = inner, status, retry_after
        self._lock = threading.Lock()

    def down(self, now: float | None = None) -> bool:
        """Whether the outage holds at `now` (default: the clock now); the first question
        starts an outage that was given no start."""
        now = time.time() if now is None else now
        with self._lock:
            if self.start is None:
                self.start = now
        return self.start <= now < self.start + self.seconds

    def provider_fault(self, job: str, step: str, n: int) -> dict | None:
        """The refusal while down, else the inner policy's fault for this call."""
        if self.down():
            return {"kind": "status", "status": self.status, "retry_after": self.retry_after}
        return self.inner.provider_fault(job, step, n) if self.inner is not None else None


class _ProviderHandler(JsonHandler):
    def do_GET(self):
        if self.route in ("/v1/models", "/models"):
            self.send_json(200, _MODELS)
        elif self.route == "/healthz":
            self.send_json(200, {"ok": True})
        else:
            self.send_json(404, _error_body(f"no route {self.route}", "invalid_request_error", "not_found"))

    def do_POST(self):
        if self.route in _COMPLETION_PATHS:
            self.serve(self.fake.serve_completion)
            return
        self.read_body()
        self.send_json(404, _error_body(f"no route {self.route}", "invalid_request_error", "not_found"))


FakeProvider.handler_class = _ProviderHandler


def _outcome(kind: str | None) -> str:
    """The outcome of a completion that was made: the fault that shaped it, or ok."""
    return kind if kind in ("hang", "bad_content", "schema") else "ok"


def _usage_document(usage: dict) -> dict:
    """The `usage` object of a completion (or of a stream's last chunk) from its billing."""
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "cost": usage["billed"]}


def _completion(outcome: str) -> str:
    """What a caller that got the answer can know: ok, fail (definite but unusable), or info."""
    if outcome == "ok":
        return OK
    if outcome in ("hang", "reset", "cut"):  # a hang outlasts the client's timeout by design
        return INFO
    return FAIL  # an error status, garbage, bad content, schema-breaking content


def _has_bearer(headers) -> bool:
    authorization = headers.get("Authorization", "")
    return authorization.startswith("Bearer ") and bool(authorization[len("Bearer "):].strip())


def _error_body(message: str, error_type: str, code: str) -> dict:
    return {"error": {"message": message, "type": error_type, "code": code}}


def retry_after_header(retry_after: float | None, form: str | None, now: float
                       ) -> tuple[str | None, dict]:
    """The Retry-After header a refusal sends at time `now` (None: none) and its ledger
    fields: retry_after, and retry_at for an HTTP date, retry_after_header when one is sent
    (see the module docstring)."""
    if form == "junk":
        return JUNK_RETRY_AFTER, {"retry_after": None, "retry_after_header": JUNK_RETRY_AFTER}
    if retry_after is None:
        return None, {"retry_after": None}
    if form == "date":
        # Rounded up: a date has one-second resolution, and must not promise less than asked.
        retry_at = math.ceil(now + retry_after)
        header = email.utils.formatdate(retry_at, usegmt=True)
        return header, {"retry_after": retry_after, "retry_at": float(retry_at),
                        "retry_after_header": header}
    return str(retry_after), {"retry_after": retry_after, "retry_after_header": str(retry_after)}


def _refusal(http: JsonHandler, status: int, retry_after, message: str | None = None,
             form: str | None = None) -> tuple[dict, Deliver]:
    if status == 429:
        error_type, code = "rate_limit_error", "rate_limit_exceeded"
    elif status < 500:
        error_type, code = "invalid_request_error", "invalid_request"
    else:
        error_type, code = "server_error", "server_error"
    header, fields = retry_after_header(retry_after, form, time.time())
    headers = {"Retry-After": header} if header is not None else None
    body = _error_body(message or f"injected HTTP {status}", error_type, code)
    return ({**_unbilled(status, "error"), **fields},
            partial(http.send_json, status, body, headers))


def _unbilled(status: int | None, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "billed": 0.0, "prompt_tokens": 0,
            "completion_tokens": 0, "completion_id": None}
