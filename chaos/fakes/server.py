"""The plumbing both fakes share: a threaded HTTP server bound to 127.0.0.1 with a ledger,
call counting, injected pauses, and a JSON request handler that can answer, hang or reset.

A request whose ledger line cannot be written (a full disk) prints no traceback: the fake
keeps the error (`FakeServer.ledger_failure`) for whoever runs it to report once, and the
client gets a 500 (or, when its answer had begun, a closed connection) instead of an answer
with no record.
"""

import json
import select
import socket
import socketserver
import sys
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from chaos.fakes.ledger import Ledger, LedgerWriteError
from chaos.fakes.peer import PeerFinder

#: A ledger entry's `completion`, Jepsen's three outcomes from the caller's point of view: it got
#: a usable answer (ok), a definite answer it cannot use (fail), or it cannot have had the
#: answer at all (info: the call may or may not have taken effect, as far as the caller knows).
OK, FAIL, INFO = "ok", "fail", "info"

_DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, not FIN
_DRAIN_SECONDS = 5.0

Deliver = Callable[[], object]  # the deferred action that answers (or drops) the client


class FakeClosing(Exception):
    """Raised when a request arrives while its fake is closing; the connection is dropped."""


class BadRequest(ValueError):
    """A request (or step input) the provider cannot answer; served as HTTP 400."""


#: The coarsest kernel tick (HZ=100) in which TCP_INFO counts: a lag is taken less one, so
#: that a request is never placed before its bytes arrived.
TICK = 0.01


def arrived(connection: socket.socket, now: float) -> float:
    """When the request being read on `connection` reached this machine: `now`, less the
    time since its last bytes came in, where the kernel says (Linux TCP_INFO's
    last_data_recv, whole ticks). On a loaded machine a request waits seconds in the accept
    queue and for the fake's threads to run: stamping it when the handler starts placed a
    call the worker made within its lease after the worker had given it up and moved on
    (fenced-writes, lease-exclusive, cost-accounted and retry-discipline failed a correct
    engine at 32 workers on 2 CPUs). Elsewhere (no TCP_INFO), `now`."""
    try:
        info = connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        waited = struct.unpack_from("I", info, 52)[0] / 1000.0  # tcpi_last_data_recv, ms
    except (AttributeError, OSError, struct.error):
        return now
    return now - max(0.0, waited - TICK)


class _LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of concurrent clients must not overflow the backlog

    def server_bind(self):
        # HTTPServer.server_bind does a reverse-DNS lookup of the host; loopback needs none.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        # A client that went away (a killed worker, a timed-out sender) is part of the
        # weather here, not an error worth a traceback; anything else still gets one.
        if isinstance(sys.exc_info()[1], _DISCONNECTS + (TimeoutError,)):
            return
        super().handle_error(request, client_address)


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
        self.peers = PeerFinder()

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

    @property
    def ledger_failure(self) -> LedgerWriteError | None:
        """The error of the first ledger line this fake could not write (None: none). From
        then on it answers no request: its ledger would not hold the answer."""
        return self.ledger.failure

    def record(self, entry: dict) -> bool:
        """Append one request's ledger entry; return False if it could not be written (the
        error is kept in `ledger_failure`, never raised into the request's thread)."""
        try:
            self.ledger.append(entry)
            return True
        except LedgerWriteError:
            return False

    def unrecorded_body(self, message: str) -> dict:
        """The JSON body of the 500 a request whose ledger line failed gets (the fake's own
        error shape: subclasses override)."""
        return {"error": message}

    def settle(self, http: "JsonHandler", entry: dict, deliver: "Deliver") -> None:
        """Ledger a decided request, then carry out its answer; a request whose line cannot
        be written is answered 500 instead (a closed connection if its answer had begun)."""
        if self.record(entry):
            deliver()  # after the ledger line: whatever a client saw, its entry can be read
            return
        failure = self.ledger_failure
        http.refuse_unrecorded(self.unrecorded_body(
            f"the fake could not write its ledger: {failure.strerror}"))

    def pause(self, seconds: float) -> bool:
        """Sleep for an injected delay; cut short when the fake closes so close() never waits it
        out. Return True if it was cut short."""
        return self._closing.wait(max(0.0, float(seconds)))

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

    def caller_pid(self) -> int | None:
        """The process on the client's end of this connection (chaos.fakes.peer), looked up
        once per connection, while the request holds it open."""
        if not hasattr(self, "_caller_pid"):
            self._caller_pid = self.fake.peers.pid_of(self.client_address,
                                                      self.server.server_address[1])
        return self._caller_pid

    def serve(self, work) -> None:
        """Run `work(self)` as one in-flight request, or drop the connection if the fake is closing."""
        # before the lookup below: the ledger's t_start, when the request reached this
        # machine (the kernel's word), not when a busy fake got to it
        self.received = arrived(self.connection, time.time())
        self.head_sent = False
        self.caller_pid()  # now, while the caller is surely alive and connected
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

    def send_response(self, code, message=None):
        self.head_sent = True  # from here on, a refusal can only close the connection
        super().send_response(code, message)

    def send_head(self, status: int, headers: dict) -> bool:
        """Write a response's status line and `headers`; return False if the client had
        already gone. The body follows with send_rest."""
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            return True
        except _DISCONNECTS:
            self.close_connection = True
            return False

    def send_bytes(self, status: int, body: bytes, content_type="application/json", headers=None) -> bool:
        """Write a complete response; return False if the client had already gone."""
        head = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        return self.send_head(status, head) and self.send_rest(body)

    def trickle(self, status: int, body: bytes, seconds: float, interval: float,
                pause: Callable[[float], bool], content_type="application/json"
                ) -> tuple[int, float | None]:
        """Write the status line and headers of a complete response now, then `body` one byte
        every `interval` seconds for `seconds` (`pause(s)` sleeps, returning True to stop
        early), always keeping its last byte back. Return (bytes of the body written, when a
        write found the client gone or None); send_rest writes the remainder."""
        written, gone_at = 0, None
        deadline = time.monotonic() + seconds
        if not self.send_head(status, {"Content-Type": content_type,
                                       "Content-Length": str(len(body))}):
            gone_at = time.time()
        while (left := deadline - time.monotonic()) > 0:
            if pause(min(interval, left)):
                break  # the fake is closing
            if gone_at is None and written < len(body) - 1 and deadline > time.monotonic():
                try:
                    self.wfile.write(body[written:written + 1])
                    written += 1
                except _DISCONNECTS:
                    self.close_connection, gone_at = True, time.time()
        return written, gone_at

    def send_rest(self, rest: bytes) -> bool:
        """Write more of a response whose head is sent; return False if the client had already gone."""
        try:
            self.wfile.write(rest)
            return True
        except _DISCONNECTS:
            self.close_connection = True
            return False

    def send_json(self, status: int, document, headers=None) -> bool:
        """Write `document` as a JSON response; return False if the client had already gone."""
        return self.send_bytes(status, json.dumps(document).encode(), headers=headers)

    def refuse_unrecorded(self, body: dict) -> None:
        """Answer a request the fake could not ledger: 500 with `body`, or when its answer had
        begun, a connection closed before that answer ends."""
        self.close_connection = True
        if not self.head_sent:
            self.send_json(500, body)

    def client_gone(self) -> bool:
        """Return True if the client has already closed or reset its end of the connection.

        A client that gave up (its timeout passed, its process died) closes its socket, which
        shows here as end-of-file; an answer written now would reach no one. A client that
        leaves after this check and before the answer is written is not seen.
        """
        try:
            poller = select.poll()  # not select(): it fails on descriptors past FD_SETSIZE
            poller.register(self.connection, select.POLLIN)
            if not poller.poll(0):
                return False  # nothing to read: the client is still waiting
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):  # reset by the peer, or the socket already closed
            return True

    def reset_connection(self) -> None:
        """Close the connection with a TCP RST and no response at all."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        self.rfile.close()  # rfile holds a reference: the socket only really closes once it goes
        self.connection.close()
