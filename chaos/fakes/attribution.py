"""Who a request to a fake is for: the documented X-Ninelives headers first, then what a plain
client already sends in its body, and a note of which of the two it was.

An engine that can set headers sends `X-Ninelives-Job`, `X-Ninelives-Step` (provider),
`X-Ninelives-Kind` (receiver) and `X-Ninelives-Worker`, plus `Idempotency-Key` to the receiver.
An engine that cannot still gets its calls counted and its faults injected per job, from fields
an unmodified client already fills in (see `call_attribution` and `effect_attribution`). Each
field falls back on its own; `attributed` says where the job id came from, because the job is
what faults, call counts and checkers are keyed on: "headers", "body" or "none".
"""

JOB_HEADER = "X-Ninelives-Job"
STEP_HEADER = "X-Ninelives-Step"
WORKER_HEADER = "X-Ninelives-Worker"
KIND_HEADER = "X-Ninelives-Kind"
KEY_HEADER = "Idempotency-Key"

HEADERS, BODY, NONE = "headers", "body", "none"


def call_attribution(headers, request, prompt_step: str | None) -> dict:
    """Return {"job", "step", "worker", "attributed"} for one chat-completions request.

    Takes the request headers, the parsed JSON body (anything: a non-object counts as empty) and
    the step named by the system prompt's first line ("step: NAME"), if any. Order per field:
    job = X-Ninelives-Job, body `metadata.job`, body `user`; step = X-Ninelives-Step,
    `metadata.step`, the prompt's step; worker = X-Ninelives-Worker, `metadata.worker`.
    """
    body = request if isinstance(request, dict) else {}
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    job, attributed = _first((headers.get(JOB_HEADER), HEADERS), (metadata.get("job"), BODY),
                             (body.get("user"), BODY))
    step, _ = _first((headers.get(STEP_HEADER), HEADERS), (metadata.get("step"), BODY),
                     (prompt_step, BODY))
    worker, _ = _first((headers.get(WORKER_HEADER), HEADERS), (metadata.get("worker"), BODY))
    return {"job": job, "step": step, "worker": worker, "attributed": attributed}


def effect_attribution(headers, effect) -> dict:
    """Return {"key", "job", "kind", "worker", "attributed"} for one effect request.

    Takes the request headers and the parsed JSON body (a non-object counts as empty). Order
    per field: job = X-Ninelives-Job, body "job"; kind = X-Ninelives-Kind, body "kind";
    worker = X-Ninelives-Worker, body "worker". The key comes only from Idempotency-Key: a key
    invented from the body would make the receiver deduplicate what the sender never asked it to.
    """
    body = effect if isinstance(effect, dict) else {}
    job, attributed = _first((headers.get(JOB_HEADER), HEADERS), (body.get("job"), BODY))
    kind, _ = _first((headers.get(KIND_HEADER), HEADERS), (body.get("kind"), BODY))
    worker, _ = _first((headers.get(WORKER_HEADER), HEADERS), (body.get("worker"), BODY))
    return {"key": headers.get(KEY_HEADER), "job": job, "kind": kind, "worker": worker,
            "attributed": attributed}


def _first(*candidates: tuple) -> tuple[str | None, str]:
    """Return (value, source) of the first candidate that names something, else (None, NONE)."""
    for value, source in candidates:
        name = _name(value)
        if name is not None:
            return name, source
    return None, NONE


def _name(value) -> str | None:
    # Header values are strings; a body may carry a numeric id, spelled as a header would spell it.
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None
