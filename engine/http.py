"""One HTTP POST with a hard deadline, its failures mapped onto the retry policy."""
from __future__ import annotations

import email.utils
import http.client
import json
import math
import socket
import threading
import time
from typing import Any, Mapping
from urllib.parse import urlsplit

from .retry import CallTimeout, PoisonError, RetryableError, classify_status


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        # "inf" or "nan" would park the job forever: treat them as no guidance at all.
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def post_json(url: str, body: Any, headers: Mapping[str, str], timeout: float) -> tuple[int, Any]:
    """POST `body` as JSON; return (status, parsed JSON or raw text) for a 2xx answer.

    The whole exchange is bounded by `timeout` seconds: a watchdog shuts the socket at the
    deadline, so a server that trickles bytes cannot hold a worker past its lease.
    Raises CallTimeout, RetryableError (connection errors, 429, 5xx, honouring Retry-After)
    or PoisonError (any other status).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PoisonError(f"not an http(s) URL: {url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    expired = threading.Event()

    def on_deadline() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout, on_deadline)
    watchdog.daemon = True
    data = json.dumps(body).encode()
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    started = time.monotonic()
    try:
        watchdog.start()
        conn.request("POST", path or "/", body=data, headers={
            "Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        raw = resp.read()
        status, retry_after = resp.status, resp.getheader("Retry-After")
    except (socket.timeout, TimeoutError) as exc:
        raise CallTimeout(f"POST {url} timed out after {timeout} s") from exc
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise CallTimeout(f"POST {url} timed out after {timeout} s") from exc
        raise RetryableError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        watchdog.cancel()
        conn.close()
    # The watchdog is a thread, and a loaded machine can run it late: an answer that came
    # after the deadline is refused by the clock, whether or not the watchdog has fired.
    if expired.is_set() or time.monotonic() - started > timeout:
        raise CallTimeout(f"POST {url} timed out after {timeout} s")
    text = raw.decode("utf-8", errors="replace")
    if not 200 <= status <= 299:
        message = f"POST {url} answered {status}: {text[:200]}"
        if classify_status(status):
            raise RetryableError(message, retry_after=parse_retry_after(retry_after))
        raise PoisonError(message)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text
