"""A fake OpenAI-compatible model provider on 127.0.0.1: deterministic answers for the pipeline's
steps, billing, injected faults, a ledger line per call; plus the server plumbing both fakes share."""

import json
import math
import socket
import socketserver
import string
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .ledger import Ledger

JOB_HEADER = "X-Ninelives-Job"
STEP_HEADER = "X-Ninelives-Step"
WORKER_HEADER = "X-Ninelives-Worker"
PROVIDER_FAULTS = frozenset({"status", "hang", "slow", "reset", "garbage", "bad_content", "schema"})

_DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN
_DRAIN_SECONDS = 5.0
_COMPLETION_PATHS = ("/v1/chat/completions", "/chat/completions")
_MODELS = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
_GARBAGE = b"<html>upstream garbage"

Deliver = Callable[[], object]  # the deferred action that answers (or drops) the client


class FakeClosing(Exception):
    """Raised when a request arrives while its fake is closing; the connection is dropped."""


class BadRequest(ValueError):
    """A request (or step input) the provider cannot answer; served as HTTP 400."""


class _LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of concurrent clients must not overflow the backlog

    def server_bind(self):
        # HTTPServer.server_bind does a reverse-DNS lookup of the host; loopback needs none.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class FakeServer:
    """One fake HTTP server on 127.0.0.1 with a ledger: lifecycle, call counting, injected pauses.

    Subclasses set `handler_class` (a JsonHandler) and `base_path` (appended to the URL).
    Takes the ledger path, an optional fault policy, host (must be 127.0.0.1) and port (0: any
    free port). Use as a context manager, or call start() and close(). Raises ValueError for a
    non-loopback host.
    """

    handler_class: type[BaseHTTPRequestHandler] | None = None
    base_path = ""

    def __init__(self, ledger_path, faults=None, host: str = "127.0.0.1", port: int = 0):
        if host != "127.0.0.1":
            raise ValueError(f"fakes bind only to 127.0.0.1, not {host!r}")
        self.host, self._requested_port, self.faults = host, port, faults
        self.ledger = Ledger(ledger_path)
        self._server = self._thread = None
        self._closed = False
        self._closing = threading.Event()
        self._counts, self._counts_lock = Counter(), threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._connections = set()

    @property
    def port(self) -> int:
        """The bound port. Raises RuntimeError before start()."""
        if self._server is None:
            raise RuntimeError("fake server not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The base URL clients are configured with."""
        return f"http://{self.host}:{self.port}{self.base_path}"

    def start(self):
        """Bind and serve on a daemon thread; return self.

        Raises RuntimeError if already started or closed, OSError if the port cannot be bound.
        """
        if self._server is not None or self._closed:
            raise RuntimeError("fake server already started")
        try:
            self._server = _LoopbackHTTPServer((self.host, self._requested_port), self.handler_class)
        except OSError:  # e.g. the port is taken: nothing will close() a fake that never started
            self.close()
            raise
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{type(self).__name__}-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, let in-flight requests write their ledger lines, close the ledger. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()  # wakes injected sleeps, so in-flight requests finish promptly
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._disconnect_clients()
            self._wait_idle(_DRAIN_SECONDS)
        self.ledger.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def entries(self) -> list[dict]:
        """Return the ledger's entries (see Ledger.entries)."""
        return self.ledger.entries()

    def pause(self, seconds: float) -> None:
        """Sleep for an injected delay; cut short when the fake closes so close() never waits it out."""
        self._closing.wait(max(0.0, float(seconds)))

    def count_call(self, key: tuple) -> int:
        """Count one more call for `key` and return the 1-based count, this call included."""
        with self._counts_lock:
            self._counts[key] += 1
            return self._counts[key]

    def calls(self, key: tuple) -> int:
        """Return how many calls were received for `key` (finished or not)."""
        with self._counts_lock:
            return self._counts[key]

    @contextmanager
    def in_flight(self):
        """Bracket one request so close() can wait for its ledger line. Raises FakeClosing."""
        with self._idle:
            if self._closing.is_set():
                raise FakeClosing()
            self._in_flight += 1
        try:
            yield
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _track(self, sock, connected: bool) -> None:
        with self._idle:
            (self._connections.add if connected else self._connections.discard)(sock)

    def _disconnect_clients(self) -> None:
        # Idle keep-alive connections would otherwise keep their handler threads blocked in a read.
        with self._idle:
            connections = list(self._connections)
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _wait_idle(self, timeout: float) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout)


class JsonHandler(BaseHTTPRequestHandler):
    """Request plumbing shared by the fakes: body reading, JSON replies that survive a vanished
    client, abrupt resets, and admission through the fake's in-flight accounting."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the real APIs' clients use
    timeout = 30  # an idle keep-alive connection is dropped after this many seconds

    @property
    def fake(self) -> FakeServer:
        return self.server.fake

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    def setup(self):
        super().setup()
        self.fake._track(self.connection, connected=True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.fake._track(self.connection, connected=False)

    def log_message(self, format, *args):
        pass  # the ledger is the log; stderr chatter would bury test output

    def serve(self, work) -> None:
        """Run `work(self)` as one in-flight request, or drop the connection if the fake is closing."""
        try:
            with self.fake.in_flight():
                work(self)
        except FakeClosing:
            self.close_connection = True

    def read_body(self) -> bytes:
        """Return the request body (by Content-Length; none or invalid: b"" and close afterwards)."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True  # an unread body would be parsed as the next request
            return b""
        return self.rfile.read(length) if length > 0 else b""

    def send_bytes(self, status: int, body: bytes, content_type="application/json", headers=None) -> bool:
        """Write a complete response; return False if the client had already gone."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            return True
        except _DISCONNECTS:
            self.close_connection = True
            return False

    def send_json(self, status: int, document, headers=None) -> bool:
        """Write `document` as a JSON response; return False if the client had already gone."""
        return self.send_bytes(status, json.dumps(document).encode(), headers=headers)

    def reset_connection(self) -> None:
        """Close the connection with a TCP RST and no response at all."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.rfile.close()  # rfile holds a reference: the socket only really closes once it goes
        self.connection.close()


# --- the pipeline's steps, answered deterministically -------------------------------------------

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


def step_output(step: str, step_input: dict) -> dict:
    """Return the correct output of `step` for `step_input` (the oracle the fake answers with).

    Raises BadRequest (a ValueError) for an unknown step or an input that is not a JSON object.
    """
    if step not in _STEPS:
        raise BadRequest(f"unknown step {step!r}")
    if not isinstance(step_input, dict):
        raise BadRequest("step input is not a JSON object")
    return _STEPS[step](step_input)


# --- the provider ---------------------------------------------------------------------------------

class FakeProvider(FakeServer):
    """A fake OpenAI chat-completions API answering the pipeline's steps.

    Takes the ledger path, an optional fault policy (`provider_fault(job, step, n) -> dict | None`),
    `price_per_1k` = (prompt, completion) dollars per 1000 tokens, host and port. `url` is the
    OpenAI base URL (".../v1"). Every POST to the completions path writes one ledger entry.
    """

    base_path = "/v1"

    def __init__(self, ledger_path, faults=None, price_per_1k=(0.001, 0.003),
                 host: str = "127.0.0.1", port: int = 0):
        super().__init__(ledger_path, faults, host, port)
        self.price_in, self.price_out = price_per_1k
        self._completions = 0

    def calls_for(self, job: str | None, step: str | None) -> int:
        """Return how many completion calls were received for (job, step)."""
        return self.calls((job, step))

    def serve_completion(self, http: JsonHandler) -> None:
        """Answer one completion request (or misbehave as the fault policy says) and ledger it."""
        t_start = time.time()
        request = _parse_json(http.read_body())
        job, worker = http.headers.get(JOB_HEADER), http.headers.get(WORKER_HEADER)
        step = http.headers.get(STEP_HEADER) or _step_from_prompt(request)
        n = self.count_call((job, step))
        fault = self.faults.provider_fault(job, step, n) if self.faults else None
        result, deliver = self._answer(http, request, step, fault)
        self.ledger.append({
            "server": "provider", "t_start": t_start, "t_end": time.time(), "job": job, "step": step,
            "worker": worker, "n": n, "auth": _has_bearer(http.headers),
            "fault": fault["kind"] if fault else None, **result})
        deliver()  # after the ledger line: whatever a client saw, its entry can already be read

    def _answer(self, http: JsonHandler, request, step, fault) -> tuple[dict, Deliver]:
        """Decide the call: return (ledger fields, the action that answers the client)."""
        kind = fault["kind"] if fault else None
        if kind is not None and kind not in PROVIDER_FAULTS:
            raise ValueError(f"unknown provider fault {fault!r}")
        if kind == "reset":
            return _unbilled(None, "reset"), http.reset_connection
        if kind == "status":
            return _refusal(http, fault["status"], fault.get("retry_after"))
        if kind == "garbage":
            return _unbilled(200, "garbage"), partial(http.send_bytes, 200, _GARBAGE, "text/html")
        try:
            completion, usage = self._complete(request, step, kind)
        except BadRequest as exc:
            return _refusal(http, 400, None, str(exc))
        if kind in ("hang", "slow"):
            self.pause(fault["seconds"])  # the work is done and billed; only the answer is late
        outcome = kind if kind in ("hang", "bad_content", "schema") else "ok"
        return {"status": 200, "outcome": outcome, **usage}, partial(http.send_json, 200, completion)

    def _complete(self, request, step, kind) -> tuple[dict, dict]:
        system, user = _messages(request)
        content = _content(step_output(step, _parse_input(user)), kind)
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


def _system_prompt(request) -> str:
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") == "system":
            return message.get("content") if isinstance(message.get("content"), str) else ""
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
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise BadRequest("no user message with string content")
    return _system_prompt(request), users[-1]


def _parse_input(user: str):
    step_input = _parse_json(user.encode())
    if not isinstance(step_input, dict):
        raise BadRequest("user message is not a JSON object")
    return step_input


def _content(output: dict, kind: str | None) -> str:
    if kind == "schema":
        return json.dumps({"unexpected": True})
    content = json.dumps(output, sort_keys=True)
    if kind == "bad_content":
        # Prose around half an object: nothing a lenient parser could salvage.
        return "Sure! Here is the JSON you asked for:\n" + content[: len(content) // 2]
    return content


def _has_bearer(headers) -> bool:
    authorization = headers.get("Authorization", "")
    return authorization.startswith("Bearer ") and bool(authorization[len("Bearer "):].strip())


def _error_body(message: str, error_type: str, code: str) -> dict:
    return {"error": {"message": message, "type": error_type, "code": code}}


def _refusal(http: JsonHandler, status: int, retry_after, message: str | None = None
             ) -> tuple[dict, Deliver]:
    if status == 429:
        error_type, code = "rate_limit_error", "rate_limit_exceeded"
    elif status < 500:
        error_type, code = "invalid_request_error", "invalid_request"
    else:
        error_type, code = "server_error", "server_error"
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = _error_body(message or f"injected HTTP {status}", error_type, code)
    return _unbilled(status, "error"), partial(http.send_json, status, body, headers)


def _unbilled(status: int | None, outcome: str) -> dict:
    return {"status": status, "outcome": outcome, "billed": 0.0, "prompt_tokens": 0,
            "completion_tokens": 0, "completion_id": None}
