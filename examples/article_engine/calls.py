"""The article engine's two network calls: a chat-completions request per model step and a
POST per outbox effect, their failures mapped onto the article's retry rule.

The article's rule: retry timeouts, connection errors, HTTP 429 and 5xx; never a 400, a schema
validation failure or a parse error. Every transport failure is raised as one of the types in
`RETRYABLE_ERRORS` or as a non-retryable one (`HTTPRefused`, `BadOutput`), so the engine's
`isinstance(e, RETRYABLE)` is the whole decision. Standard library only.
"""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class HTTPRetryable(Exception):
    """HTTP 429 or 5xx: the article retries these (its "plus HTTP 429, 5xx")."""


class HTTPRefused(Exception):
    """Any other non-2xx status: nothing about a retry would differ."""


class BadOutput(ValueError):
    """The answer could not be parsed, or does not have the step's schema."""


#: What the engine's RETRYABLE tuple holds: the article's two types plus the HTTP statuses.
RETRYABLE_ERRORS = (TimeoutError, ConnectionError, HTTPRetryable)

#: The shape each model step's output must have: field -> type.
SCHEMAS: dict[str, dict[str, type]] = {
    "fetch": {"title": str, "text": str, "chars": int},
    "extract": {"title": str, "words": int, "entities": list, "amount_cents": int},
    "verify": {"ok": bool, "reason": str},
}

INSTRUCTIONS = {
    "fetch": "Normalise the document: return JSON {title, text, chars}.",
    "extract": "Extract fields: return JSON {title, words, entities, amount_cents}.",
    "verify": "Check the extraction: return JSON {ok, reason}.",
}


def post_json(url: str, body: Any, headers: dict[str, str], timeout: float) -> Any:
    """POST `body` as JSON and return the parsed JSON answer of a 2xx response.

    `timeout` bounds every socket operation (connect, each read). Raises TimeoutError,
    ConnectionError or HTTPRetryable (retryable), HTTPRefused (other statuses) or BadOutput
    (a 2xx answer that is not JSON).
    """
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 429 or exc.code >= 500:
            raise HTTPRetryable(f"POST {url}: HTTP {exc.code}") from None
        raise HTTPRefused(f"POST {url}: HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise TimeoutError(f"POST {url}: timed out after {timeout} s") from None
        raise ConnectionError(f"POST {url}: {exc.reason}") from None
    except TimeoutError:
        raise TimeoutError(f"POST {url}: timed out after {timeout} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ConnectionError(f"POST {url}: {type(exc).__name__}: {exc}") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise BadOutput(f"POST {url}: answer is not JSON: {raw[:80]!r}") from None


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible chat-completions endpoint: `{url}/chat/completions`."""

    url: str
    model: str
    timeout: float
    key: str = ""

    def complete(self, step: str, step_input: Any, job_id: str, worker: str) -> tuple[Any, float]:
        """Ask the model to do `step` on `step_input`; return (its JSON answer, the call's cost
        as the response states it, 0.0 when it states none). Raises what `post_json` raises,
        and BadOutput for an answer without JSON content or without the step's schema."""
        body = {"model": self.model, "messages": [
            {"role": "system", "content": f"step: {step}\n{INSTRUCTIONS[step]}"},
            {"role": "user", "content": json.dumps(step_input)}]}
        headers = {"X-Ninelives-Job": job_id, "X-Ninelives-Step": step,
                   "X-Ninelives-Worker": worker}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        answer = post_json(self.url.rstrip("/") + "/chat/completions", body, headers,
                           self.timeout)
        if not isinstance(answer, dict):
            raise BadOutput(f"{step}: provider answer is not a JSON object")
        try:
            content = json.loads(answer["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise BadOutput(f"{step}: model content is not JSON") from None
        return check_schema(step, content), cost_of(answer)


def cost_of(answer: dict) -> float:
    """The cost the response carries (`usage.cost`, else a top-level `cost`), else 0.0."""
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    for value in (usage.get("cost"), answer.get("cost")):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def check_schema(step: str, output: Any) -> Any:
    """Return `output` if it has the step's schema, else raise BadOutput naming the field."""
    if not isinstance(output, dict):
        raise BadOutput(f"{step}: output must be a JSON object")
    for name, kind in SCHEMAS[step].items():
        value = output.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadOutput(f"{step}: field {name!r} must be {kind.__name__}, got {value!r}")
    return output


def send_effect(url: str, row_id: int, job_id: str, kind: str, effect: Any, sender: str,
                timeout: float) -> Any:
    """POST one outbox effect with the row id as its idempotency key (the article's advice)."""
    headers = {"Idempotency-Key": str(row_id), "X-Ninelives-Job": job_id,
               "X-Ninelives-Kind": kind, "X-Ninelives-Worker": sender}
    return post_json(url, effect, headers, timeout)
