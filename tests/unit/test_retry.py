"""The retry policy: which failures are retried (the exception type decides), backoff with full
jitter inside its bounds, Retry-After honoured and parsed from seconds or an HTTP date."""
from __future__ import annotations

import email.utils
import math
import random
import statistics

import pytest

from engine.http import parse_retry_after
from engine.retry import (Backoff, CallTimeout, ParseError, PoisonError, RetryableError,
                          SchemaError, classify, classify_status)


@pytest.mark.parametrize("exc", [
    CallTimeout("slow"), RetryableError("503"), TimeoutError(), ConnectionError(),
    ConnectionResetError(), RetryableError("429", retry_after=3.0),
], ids=lambda e: type(e).__name__)
def test_transient_failures_are_retryable(exc):
    assert classify(exc) is True


@pytest.mark.parametrize("exc", [
    PoisonError("400"), ParseError("not json"), SchemaError("no title"), ValueError("bug"),
    KeyError("bug"), RuntimeError("bug"),
], ids=lambda e: type(e).__name__)
def test_deterministic_failures_are_poison(exc):
    assert classify(exc) is False


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 599])
def test_429_and_5xx_are_retryable(status):
    assert classify_status(status) is True


@pytest.mark.parametrize("status", [200, 301, 400, 401, 404, 408, 422, 499, 600])
def test_other_statuses_are_not_retryable(status):
    assert classify_status(status) is False


# -- backoff ---------------------------------------------------------------------------------

BACKOFF = Backoff(base=0.5, cap=30.0)
DRAWS = 4000


def draws(attempt: int, retry_after: float | None = None, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [BACKOFF.delay(attempt, rng, retry_after) for _ in range(DRAWS)]


@pytest.mark.parametrize("attempt,ceiling", [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0),
                                             (20, 30.0)])
def test_backoff_ceiling_doubles_up_to_the_cap(attempt, ceiling):
    assert BACKOFF.ceiling(attempt) == ceiling


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 7, 12])
def test_backoff_is_full_jitter_within_its_bounds(attempt):
    ceiling = min(BACKOFF.cap, BACKOFF.base * 2 ** (attempt - 1))
    waits = draws(attempt)
    assert all(0.0 <= w <= ceiling for w in waits)
    # Full jitter: spread over the whole range (mean about half the ceiling), not a constant.
    assert statistics.fmean(waits) == pytest.approx(ceiling / 2, rel=0.05)
    assert min(waits) < 0.05 * ceiling and max(waits) > 0.95 * ceiling


def test_backoff_is_reproducible_from_the_seed():
    assert draws(4, seed=11) == draws(4, seed=11)
    assert draws(4, seed=11) != draws(4, seed=12)


@pytest.mark.parametrize("attempt,retry_after", [(1, 7.0), (3, 1.0), (7, 45.0), (2, 0.0)])
def test_backoff_never_undercuts_retry_after(attempt, retry_after):
    waits = draws(attempt, retry_after)
    assert all(w >= retry_after for w in waits)
    assert all(w <= max(retry_after, BACKOFF.ceiling(attempt)) for w in waits)


# -- Retry-After -----------------------------------------------------------------------------

NOW = 1_700_000_000.0


@pytest.mark.parametrize("value,seconds", [("120", 120.0), ("0", 0.0), ("2.5", 2.5),
                                           (" 30 ", 30.0)])
def test_retry_after_in_seconds(value, seconds):
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize("offset", [45, 3600])
def test_retry_after_as_an_http_date(offset):
    value = email.utils.formatdate(NOW + offset, usegmt=True)  # "Tue, 14 Nov 2023 22:14:05 GMT"
    assert parse_retry_after(value, now=NOW) == pytest.approx(offset)


def test_retry_after_date_in_the_past_means_now():
    assert parse_retry_after(email.utils.formatdate(NOW - 60, usegmt=True), now=NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "Tuesday", "12 parsecs", "30s"])
def test_garbage_retry_after_is_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e400", "nan"])
def test_retry_after_is_never_infinite(value):
    # A job rescheduled at +inf would sit in a ready state forever, never claimed, never
    # parked: a non-finite header must be treated as garbage.
    seconds = parse_retry_after(value, now=NOW)
    assert seconds is None or math.isfinite(seconds)


def test_an_answer_after_the_deadline_is_refused_even_when_the_watchdog_runs_late(
        monkeypatch):
    """A loaded machine can run the watchdog thread late (a real run with the suite beside
    it saw an answer accepted 0.7 s past a 1 s deadline): the clock refuses it anyway."""
    import http.server
    import threading

    import engine.http as client
    from engine import CallTimeout

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"{}" + b" " * 6
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for byte in body:  # trickled: no single read waits past the socket timeout
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                threading.Event().wait(0.05)

        def log_message(self, *args):
            pass

    class LateTimer:  # a watchdog that never gets to run in time
        daemon = True

        def __init__(self, *args):
            pass

        def start(self):
            pass

        def cancel(self):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(client.threading, "Timer", LateTimer)
    try:
        with pytest.raises(CallTimeout):
            client.post_json(f"http://127.0.0.1:{server.server_port}/v1", {}, {}, 0.1)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
