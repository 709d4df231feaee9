"""The document pipeline as a DBOS application, written the way DBOS's documentation teaches:
a workflow of two steps, the model called through a plain OpenAI-compatible client in one, the
delivery posted in the other with an idempotency key derived from the workflow id, a queue that
every worker process listens on, and DBOS's own step retries. Nothing here knows the harness.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from dbos import DBOS

QUEUE = "documents"
WORKFLOW = "process_document"
EFFECT_KIND = "publish"

#: the process's settings: DBOS's decorators take their retry settings when they are applied,
#: so a process sets these from its flags and only then calls `register`.
CONFIG: dict[str, Any] = {"provider_url": "http://127.0.0.1:8000/v1",
                          "receiver_url": "http://127.0.0.1:8001/v1/effects",
                          "model": "gpt-4o-mini", "call_timeout": 5.0, "send_timeout": 5.0,
                          "max_attempts": 4, "interval_seconds": 0.05, "backoff_rate": 2.0}

# No proxy: the URLs are given explicitly.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ModelError(Exception):
    """The model's answer could not be used (an HTTP error or unusable content)."""


def _post(url: str, body: dict, headers: dict[str, str], timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    with _OPENER.open(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw else {}


def chat_completion(messages: list[dict], user: str) -> dict:
    """POST /chat/completions as any OpenAI-compatible client does; the parsed answer."""
    key = os.environ.get("OPENAI_API_KEY", "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": CONFIG["model"], "messages": messages, "user": user}
    return _post(CONFIG["provider_url"].rstrip("/") + "/chat/completions", body, headers,
                 CONFIG["call_timeout"])


def summarize(document: dict) -> dict:
    """Step 1: ask the model for the document's summary and digest."""
    answer = chat_completion(
        [{"role": "system", "content": "step: summarize\nAnswer with one JSON object."},
         {"role": "user", "content": json.dumps(document, sort_keys=True)}],
        user=DBOS.workflow_id or "")
    try:
        output = json.loads(answer["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"unusable model answer: {type(exc).__name__}: {exc}") from None
    if not (isinstance(output, dict) and isinstance(output.get("summary"), str)
            and isinstance(output.get("digest"), str)):
        raise ModelError(f"model output lacks a summary and a digest: {str(output)[:80]}")
    return output


def publish(summary: dict) -> int:
    """Step 2: deliver the summary; the idempotency key is derived from the workflow id, so a
    step retried or re-run after a crash posts the same key."""
    workflow_id = DBOS.workflow_id or ""
    body = {"job": workflow_id, "kind": EFFECT_KIND, "summary": summary.get("summary"),
            "digest": summary.get("digest")}
    _post(CONFIG["receiver_url"], body, {"Idempotency-Key": f"{workflow_id}:{EFFECT_KIND}"},
          CONFIG["send_timeout"])
    return 200


def register() -> None:
    """Register the steps and the workflow with DBOS's own retry settings from CONFIG."""
    retries = {"retries_allowed": True, "max_attempts": CONFIG["max_attempts"],
               "interval_seconds": CONFIG["interval_seconds"],
               "backoff_rate": CONFIG["backoff_rate"]}
    summarize_step = DBOS.step(name="summarize", **retries)(summarize)
    publish_step = DBOS.step(name="publish", **retries)(publish)

    @DBOS.workflow(name=WORKFLOW)
    def process_document(document: dict) -> dict:
        summary = summarize_step(document)
        publish_step(summary)
        return summary

    globals()["process_document"] = process_document
