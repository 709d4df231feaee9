"""The toy engine's two outside calls, the model and the effects receiver, and the one
function that decides whether a failure is worth retrying (the exception type says so)."""
from __future__ import annotations

import email.utils
import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from typing import Any

# No proxy: the URLs are given explicitly, and a proxy from the environment would stand
# between the engine and the service it was pointed at.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Retryable(Exception):
    """A failure that may pass: timeout, connection error, HTTP 429 or 5xx."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Poison(Exception):
    """A failure that will not pass by retrying: HTTP 4xx, unusable output."""


def post(url: str, body: Any, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    """POST `body` as JSON; (status, response body) for a 2xx. Raises Retryable or Poison.

    `timeout` bounds the whole exchange, not only each socket read (a server that trickles
    its answer a byte at a time would outlast any socket timeout): the request runs on a
    helper thread, given up at the deadline; the thread finishes on its own (its socket
    timeout still bounds each read) and its late answer is dropped."""
    outcome: list = []
    helper = threading.Thread(target=lambda: outcome.append(_attempt(url, body, headers, timeout)),
                              name="toy-post", daemon=True)
    helper.start()
    helper.join(timeout)
    if not outcome:
        raise Retryable(f"TimeoutError: no answer within {timeout} s")
    answer = outcome[0]
    if isinstance(answer, Exception):
        raise answer
    return answer


def _attempt(url: str, body: Any, headers: dict[str, str], timeout: float
             ) -> tuple[int, bytes] | Exception:
    """One POST: (status, body) for a 2xx, else the exception it stands for."""
    try:
        return _post(url, body, headers, timeout)
    except Exception as exc:  # handed to the caller's thread, which raises it
        return exc


def _post(url: str, body: Any, headers: dict[str, str], timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        raise classify(exc.code, exc.headers.get("Retry-After")) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise Retryable(f"{type(exc).__name__}: {exc}") from None


def classify(status: int, retry_after: str | None, now: float | None = None) -> Exception:
    """The exception an HTTP error status stands for. `now` is the time an HTTP-date
    Retry-After is read against (default: the machine's clock)."""
    if status == 429 or status >= 500:
        return Retryable(f"HTTP {status}", retry_after_seconds(retry_after, now))
    return Poison(f"HTTP {status}")


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The wait a Retry-After header asks for: delta-seconds or an HTTP date (RFC 9110);
    None for no header or one that is neither (no guidance)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        seconds = when - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def summarize(provider_url: str, key: str, model: str, job: str, worker: str,
              step_input: Any, timeout: float) -> tuple[dict, float]:
    """Ask the model for the summary of `step_input`: (output, cost billed).
    The job and step travel in the request body only (metadata and user)."""
    body = {"model": model, "user": job,
            "metadata": {"job": job, "step": "summarize", "worker": worker},
            "messages": [{"role": "system",
                          "content": "step: summarize\nAnswer with one JSON object."},
                         {"role": "user", "content": json.dumps(step_input, sort_keys=True)}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    _, raw = post(provider_url.rstrip("/") + "/chat/completions", body, headers, timeout)
    try:
        answer = json.loads(raw)
        content = answer["choices"][0]["message"]["content"]
        output = json.loads(content)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Poison(f"unusable model answer: {type(exc).__name__}: {exc}") from None
    if not (isinstance(output, dict) and isinstance(output.get("summary"), str)
            and isinstance(output.get("digest"), str)):
        raise Poison(f"model output lacks a summary and a digest: {str(output)[:80]}")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    cost = usage.get("cost")
    return output, float(cost) if isinstance(cost, (int, float)) else 0.0


def send_effect(receiver_url: str, key: str, body: dict, timeout: float,
                sender: str | None = None) -> int:
    """Deliver one effect with its idempotency key; the 2xx status. Raises Retryable/Poison.
    The sender's id travels in a header: in the body it would change what the key names."""
    headers = {"Idempotency-Key": key, **({"X-Ninelives-Worker": sender} if sender else {})}
    status, _ = post(receiver_url, body, headers, timeout)
    return status
