"""What the fake provider answers, as pure functions of the request: the document pipeline's
step outputs, a digest-and-summary answer for any other named step, and a deterministic
free-form answer for any other prompt; the token counts billing reads.

Which answer a request gets (`reply`):
- a document step (`fetch`, `extract`, `verify`) whose last user message is a JSON object: that
  step's own output, whose schema the reference engine checks (what the harness's checks
  expect: unchanged);
- any other named step with a user message: {"step": NAME, "digest": the first 16 hex digits
  of the SHA-256 of the input's canonical JSON (sorted keys, no spaces, UTF-8), "summary":
  the first 12 words of the input's string values, "words": how many words they hold}; its
  input is the last user message as JSON, or that text itself when it is not JSON;
- anything else (no step named, a document step asked in prose, no user message): a free-form
  answer drawn from the SHA-256 of the request's model and messages (`free_form`): prose,
  or a JSON object when `response_format` asks for JSON.
The same request always gets the same answer. A request that is no JSON object, or whose
`messages` is no non-empty list, is refused (BadRequest: HTTP 400).
"""

import hashlib
import json
import math
import string

from chaos.fakes.server import BadRequest

_SUMMARY_WORDS = 12
_JSON_FORMATS = ("json_object", "json_schema")
_NO_INPUT = object()  # a step input the step cannot take (JSON null is an input like any other)


def tokens(text: str) -> int:
    """The tokens the fake bills for `text`: one per 4 characters, rounded up."""
    return math.ceil(len(text) / 4)


def reply(request, step: str | None, kind: str | None) -> tuple[str, int]:
    """Return (the assistant message's content, the prompt's tokens) for one chat-completions
    request attributed to `step` (None: no step named), with the content fault `kind`
    ("bad_content", "schema"; anything else leaves it as it is) applied. Raises BadRequest."""
    messages = _checked_messages(request)
    system, user = system_prompt(request), _last_user_text(messages)
    if step and user is not None:
        step_input = _step_input(step, user)
        if step_input is not _NO_INPUT:
            return faulted(json.dumps(step_output(step, step_input), sort_keys=True), kind), \
                tokens(system + user)
    return faulted(free_form(request), kind), tokens("".join(_texts(messages)))


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


STEPS = {"fetch": _fetch, "extract": _extract, "verify": _verify}


def step_output(step: str, step_input) -> dict:
    """Return the correct output of `step` for `step_input` (the oracle the fake answers with).

    `fetch`, `extract` and `verify` take a JSON object; any other step takes any JSON value and
    is answered by `any_step_output`. Raises BadRequest (a ValueError) for a missing step name
    or a document step whose input is not a JSON object.
    """
    if not isinstance(step, str) or not step:
        raise BadRequest("no step named: send X-Ninelives-Step, metadata.step, "
                         "or a system prompt whose first line is 'step: NAME'")
    if step not in STEPS:
        return any_step_output(step, step_input)
    if not isinstance(step_input, dict):
        raise BadRequest("step input is not a JSON object")
    return STEPS[step](step_input)


def any_step_output(step: str, step_input) -> dict:
    """Return the deterministic answer to a step the fake has no oracle for.

    {"step", "digest" (16 hex digits of the SHA-256 of the canonical JSON of `step_input`),
    "summary" (its string values' first words), "words" (how many words they hold)}.
    """
    words = " ".join(_strings(step_input)).split()
    return {"step": step, "digest": _digest(step_input),
            "summary": " ".join(words[:_SUMMARY_WORDS]), "words": len(words)}


def free_form(request: dict) -> str:
    """Return the answer to a prompt that names no step the fake knows how to answer: drawn
    from the SHA-256 of the canonical JSON of {"model", "messages"} (`digest`, 16 hex digits)
    and the words of the last user message (or of every message when there is none). Prose;
    when `response_format` asks for JSON, the object {"digest", "summary", "words"}."""
    messages = request.get("messages")
    user = _last_user_text(messages)
    words = " ".join([user] if user is not None else _texts(messages)).split()
    digest = _digest({"model": request.get("model"), "messages": messages})
    summary = " ".join(words[:_SUMMARY_WORDS])
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in _JSON_FORMATS:
        return json.dumps({"digest": digest, "summary": summary, "words": len(words)},
                          sort_keys=True)
    quoted = f', beginning "{summary}"' if summary else ""
    return (f"Fake answer {digest}: your message holds {len(words)} "
            f"word{'' if len(words) == 1 else 's'}{quoted}.")


def faulted(content: str, kind: str | None) -> str:
    """`content` as a content fault leaves it: "schema" an object no step's schema accepts,
    "bad_content" prose around half of it; any other kind (or None) leaves it as it is."""
    if kind == "schema":
        return json.dumps({"unexpected": True})
    if kind == "bad_content":
        # Prose around half an object: nothing a lenient parser could salvage.
        return "Sure! Here is the JSON you asked for:\n" + content[: len(content) // 2]
    return content


def _digest(value) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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


# --- reading the request ------------------------------------------------------------------------

def parse_json(raw: bytes):
    """The JSON value `raw` holds, or None when it holds none."""
    try:
        return json.loads(raw)
    except ValueError:  # includes UnicodeDecodeError
        return None


def text_content(content) -> str | None:
    """A message's text: a string, or the text parts of a list of content parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") for part in content
                 if isinstance(part, dict) and part.get("type") == "text"]
        if texts and all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return None


def system_prompt(request) -> str:
    """The first system message's text ("" when there is none)."""
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict) and message.get("role") == "system":
            return text_content(message.get("content")) or ""
    return ""


def step_from_prompt(request) -> str | None:
    """The step a system prompt names on its first line, "step: NAME" (None: none)."""
    first_line = system_prompt(request).split("\n", 1)[0].strip()
    if not first_line.startswith("step:"):
        return None
    return first_line[len("step:"):].strip() or None


def _checked_messages(request) -> list:
    if not isinstance(request, dict):
        raise BadRequest("request body is not a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    return messages


def _texts(messages) -> list[str]:
    """The text of every message that has some, in order."""
    texts = [text_content(m.get("content")) for m in messages if isinstance(m, dict)]
    return [text for text in texts if text]


def _last_user_text(messages) -> str | None:
    users = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return text_content(users[-1]) if users else None


def _step_input(step: str, user: str):
    """The step's input, _NO_INPUT when the step cannot take it: a JSON object for the
    document steps; any JSON, else the text itself, for any other step."""
    try:
        parsed = json.loads(user)
    except ValueError:
        parsed = _NO_INPUT
    if step in STEPS:
        return parsed if isinstance(parsed, dict) else _NO_INPUT
    return user if parsed is _NO_INPUT else parsed  # a prompt in prose is an input too
