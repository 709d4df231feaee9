"""The SQS engine's two outside calls: the model (its `draft` step) and the effects receiver.
The HTTP exchange and the one classification of failures are the toy engine's client
(`examples.toy_engine.calls`): the exception type says whether to retry."""
from __future__ import annotations

import json
from typing import Any

from examples.toy_engine import calls as http
from examples.toy_engine.calls import Poison, Retryable, classify  # noqa: F401 (re-exported)

#: the one HTTP function, a module attribute so that the simulation can answer it.
post = http.post


def draft(provider_url: str, key: str, model: str, job: str, worker: str, step_input: Any,
          timeout: float) -> tuple[dict, float]:
    """Ask the model to draft `step_input`: (output, cost billed). Raises Retryable/Poison."""
    body = {"model": model, "user": job,
            "metadata": {"job": job, "step": "draft", "worker": worker},
            "messages": [{"role": "system", "content": "step: draft\nAnswer with one JSON object."},
                         {"role": "user", "content": json.dumps(step_input, sort_keys=True)}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    _, raw = post(provider_url.rstrip("/") + "/chat/completions", body, headers, timeout)
    try:
        answer = json.loads(raw)
        output = json.loads(answer["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise Poison(f"unusable model answer: {type(exc).__name__}: {exc}") from None
    if not (isinstance(output, dict) and isinstance(output.get("digest"), str)):
        raise Poison(f"model output lacks a digest: {str(output)[:80]}")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    cost = usage.get("cost")
    return output, float(cost) if isinstance(cost, (int, float)) else 0.0


def send_effect(receiver_url: str, key: str, body: dict, timeout: float, sender: str) -> int:
    """Deliver one effect with its idempotency key; the 2xx status. Raises Retryable/Poison."""
    status, _ = post(receiver_url, body, {"Idempotency-Key": key,
                                          "X-Ninelives-Worker": sender}, timeout)
    return status
