"""A fake OpenAI-compatible model provider on 127.0.0.1: deterministic answers for any step of
any pipeline, billing, injected faults, a ledger line per call.

Answers. The document pipeline's steps keep their own outputs, whose schema the reference engine
checks: `fetch`, `extract` and `verify` take a JSON object. Any other step name is answered
with {"step": NAME, "digest": the first 16 hex digits of the SHA-256 of the input's canonical
JSON (sorted keys, no spaces, UTF-8), "summary": the first 12 words of the input's string values,
"words": how many words they hold}; its input is the last user message as JSON, or that text
itself when it is not JSON. The same input always gets the same answer.

Attribution (chaos.fakes.attribution): job, step and worker come from the X-Ninelives headers,
else from the body's `metadata` ({"job", "step", "worker"}) and `user` (the job), the step last
from the system prompt's first line "step: NAME". A request naming no step is refused (400).

Ledger. Each entry holds job, step, worker, `attributed` ("headers" | "body" | "none"),
`caller_pid` (the process that sent it, from its socket: chaos.fakes.peer), n, the fault, `outcome` (what the fake did), billing, and `completion` (what the caller can know):
"ok" a 200 completion delivered; "fail" a definite answer it cannot use (429, 5xx, 4xx, garbage,
bad content, schema-breaking content); "info" it cannot have had the answer (a hang, a reset,
or a client that had already gone when the answer was ready).

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
import hashlib
import json
import math
import string
import threading
import time
from functools import partial

from .attribution import call_attribution
from .server import FAIL, INFO, OK, BadRequest, Deliver, FakeServer, JsonHandler

PROVIDER_FAULTS = frozenset({"status", "hang", "slow", "reset", "garbage", "bad_content", "schema"})
_COMPLETION_PATHS = ("/v1/chat/completions", "/chat/completions")
_MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
_GARBAGE = b"<html>upstream garbage"
#: The Retry-After a "junk" refusal carries: what some proxies send, and no client can parse.
JUNK_RETRY_AFTER = "soon"
#: Seconds between two bytes of a trickling hang: shorter than any client's socket timeout.
TRICKLE_INTERVAL = 0.2


# --- the pipeline's steps, answered deterministically -------------------------------------------

#: Prices per 1,000 prompt and completion tokens, a small model's as real providers list
#: them: not round multiples of 1e-6, so that an engine that rounds or truncates a cost is
#: seen by cost-accounted.
PRICE_PER_1K = (0.00015, 0.0006)

def _text(value) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _fetch(job: dict) -> dict:
    text = " ".join(_text(job.get("body")).split())
    return {"title": _text(job.get("title")), "text": text, "chars": len(text)}


def _extract(fetched: dict) -> dict:
    text = _text(fetched.get("text"))
    entities = []
    for token in text.split():
        word = token.strip(string.punctuation)
        if word[:1].isupper() and word not in entities and len(entities) < 5:
            entities.append(word)
    return {"title": _text(fetched.get("title")), "words": len(text.split()), "entities": entities,
            "amount_cents": sum(map(ord, text)) % 100000}


def _verify(extracted: dict) -> dict:
    flagged = "[[needs-review]]" in _text(extracted.get("title"))
    return {"ok": not flagged, "reason": "flagged for review" if flagged else "ok"}


_STEPS = {"fetch": _fetch, "extract": _extract, "verify": _verify}
_SUMMARY_WORDS = 12


def step_output(step: str, step_input) -> dict:
    """Return the correct output of `step` for `step_input` (the oracle the fake answers with).

    `fetch`, `extract` and `verify` take a JSON object; any other step takes any JSON value and
    is answered by `any_step_output`. Raises BadRequest (a ValueError) for a missing step name
    or a document step whose input is not a JSON object.
    """
    if not isinstance(step, str) or not step:
        raise BadRequest("no step named: send X-Ninelives-Step, metadata.step, "
                         "or a system prompt whose first line is 'step: NAME'")
    if step not in _STEPS:
        return any_step_output(step, step_input)
    if not isinstance(step_input, dict):
        raise BadRequest("step input is not a JSON object")
    return _STEPS[step](step_input)


def any_step_output(step: str, step_input) -> dict:
    """Return the deterministic answer to a step the fake has no oracle for.

    {"step", "digest" (16 hex digits of the SHA-256 of the canonical JSON of `step_input`),
    "summary" (its string values' first words), "words" (how many words they hold)}.
    """
    canonical = json.dumps(step_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    words = " ".join(_strings(step_input)).split()
    return {"step": step, "digest": hashlib.sha256(canonical.encode()).hexdigest()[:16],
            "summary": " ".join(words[:_SUMMARY_WORDS]), "words": len(words)}


def _strings(value):
    """Yield the string values inside a JSON value, objects in key order (as canonical JSON)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key in sorted(value):
            yield from _strings(value[key])
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# --- the provider ---------------------------------------------------------------------------------

class FakeProvider(FakeServer):
    """A fake OpenAI chat-completions API answering any pipeline's steps (see the module docstring).

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
        request = _parse_json(http.read_body())
        who = call_attribution(http.headers, request, _step_from_prompt(request))
        job, step = who["job"], who["step"]
        n = self.count_call((job, step))
        fault = self.faults.provider_fault(job, step, n) if self.faults else None
        result, deliver = self._answer(http, request, step, fault)
        completion = INFO if http.client_gone() else _completion(result["outcome"])
        self.ledger.append({
            "server": "provider", "t_start": t_start, "t_end": time.time(), **who, "n": n,
            "caller_pid": http.caller_pid(),
            "auth": _has_bearer(http.headers), "fault": fault["kind"] if fault else None,
            **result, "completion": completion})
        deliver()  # after the ledger line: whatever a client saw, its entry can already be read

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
            completion, usage = self._complete(request, step, kind)
        except BadRequest as exc:
            return _refusal(http, 400, None, str(exc))
        if kind == "hang" and fault.get("trickle"):
            return self._trickle(http, completion, usage, fault)
        if kind in ("hang", "slow"):
            self.pause(fault["seconds"])  # the work is done and billed; only the answer is late
        outcome = kind if kind in ("hang", "bad_content", "schema") else "ok"
        return {"status": 200, "outcome": outcome, **usage}, partial(http.send_json, 200, completion)

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

    def _complete(self, request, step, kind) -> tuple[dict, dict]:
        system, user = _messages(request)
        content = _content(step_output(step, _step_input(step, user)), kind)
        prompt_tokens, completion_tokens = math.ceil(len(system + user) / 4), math.ceil(len(content) / 4)
        cost = round(prompt_tokens / 1000 * self.price_in + completion_tokens / 1000 * self.price_out, 8)
        completion_id = f"chatcmpl-{self._next_completion()}"
        completion = {
            "id": completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model") or "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens, "cost": cost}}
        return completion, {"billed": cost, "prompt_tokens": prompt_tokens,
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


def _parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:  # includes UnicodeDecodeError
        return None


def _text_content(content) -> str | None:
    """A message's text: a string, or the text parts of a list of content parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content
                 if isinstance(part, dict) and part.get("type") == "text"]
        if texts and all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return None


def _system_prompt(request) -> str:
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") == "system":
            return _text_content(message.get("content")) or ""
    return ""


def _step_from_prompt(request) -> str | None:
    first_line = _system_prompt(request).split("\n", 1)[0].strip()
    if not first_line.startswith("step:"):
        return None
    return first_line[len("step:"):].strip() or None


def _messages(request) -> tuple[str, str]:
    """Return (system prompt, last user message). Raises BadRequest."""
    if not isinstance(request, dict):
        raise BadRequest("request body is not a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    users = [_text_content(m.get("content")) for m in messages
             if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise BadRequest("no user message with string content")
    return _system_prompt(request), users[-1]


def _parse_input(user: str):
    step_input = _parse_json(user.encode())
    if not isinstance(step_input, dict):
        raise BadRequest("user message is not a JSON object")
    return step_input


def _step_input(step: str | None, user: str):
    """The step's input: a JSON object for the document steps; any JSON, else the text, for others."""
    if step in _STEPS:
        return _parse_input(user)
    try:
        return json.loads(user)
    except ValueError:
        return user  # a prompt in prose is an input too


def _content(output: dict, kind: str | None) -> str:
    if kind == "schema":
        return json.dumps({"unexpected": True})
    content = json.dumps(output, sort_keys=True)
    if kind == "bad_content":
        # Prose around half an object: nothing a lenient parser could salvage.
        return "Sure! Here is the JSON you asked for:\n" + content[: len(content) // 2]
    return content


def _completion(outcome: str) -> str:
    """What a caller that got the answer can know: ok, fail (definite but unusable), or info."""
    if outcome == "ok":
        return OK
    if outcome in ("hang", "reset"):  # a hang outlasts the client's timeout by design
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
