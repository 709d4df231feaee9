"""Step implementations: the built-in document pipeline (model calls and a delivery), and an
instant variant with the same shapes for benchmarks.

A step runner does the paid work in `call` and turns a step's output into its consequences
(effects to send, or a reason to park the job) in `conclude`. `conclude` is a pure function of
the output, so a job resumed from its memo ends exactly as if the step had just run.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .config import ConfigError, EngineConfig
from .provider import ChatClient
from .retry import PoisonError, SchemaError
from .store import Effect, canonical_json


@dataclass(frozen=True)
class StepContext:
    """What a step may know besides its input: who runs it, and earlier steps' memos."""

    job_id: str
    step: str
    worker: str
    attempt: int
    memo: Callable[[str], Any]


@dataclass(frozen=True)
class CallResult:
    """A step's output and what producing it cost (None: no billed call was made)."""

    output: Any
    cost: float | None = None


@dataclass(frozen=True)
class Conclusion:
    """What follows from a committed output: effects for the outbox, or a reason to park."""

    effects: tuple[Effect, ...] = ()
    park_reason: str | None = None


class StepRunner(Protocol):
    """The work behind each step of a pipeline."""

    def makes_call(self, step: str) -> bool:
        """True when running `step` bills a provider call (so every attempt is recorded)."""

    def call(self, step: str, data: Any, ctx: StepContext) -> CallResult:
        """Do the step's work on `data`; raise a retry.StepError subclass on failure."""

    def conclude(self, step: str, output: Any, ctx: StepContext) -> Conclusion:
        """The consequences of `output`; pure."""


#: The shape each model step's output must have: field -> type.
SCHEMAS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "fetch": {"title": str, "text": str, "chars": int},
    "extract": {"title": str, "words": int, "entities": list, "amount_cents": int},
    "verify": {"ok": bool, "reason": str},
}

INSTRUCTIONS = {
    "fetch": "Normalise the document: return JSON {title, text, chars}.",
    "extract": "Extract fields: return JSON {title, words, entities, amount_cents}.",
    "verify": "Check the extraction: return JSON {ok, reason}.",
}


#: The built-in document pipeline's job payload, as `submit --help` and the README state it.
PAYLOAD_SHAPE = 'a JSON object with a string "body" (the document) and an optional string "title"'


def check_payload(payload: Any) -> Any:
    """Return `payload` if it is a document job's payload (see PAYLOAD_SHAPE), else raise
    PoisonError naming the field (its type only: a payload may be megabytes)."""
    if not isinstance(payload, dict):
        raise PoisonError(f"payload must be a JSON object, got {type(payload).__name__}")
    for name, required in (("body", True), ("title", False)):
        if (required or name in payload) and not isinstance(payload.get(name), str):
            got = f"got {type(payload[name]).__name__}" if name in payload else "it is missing"
            raise PoisonError(f"payload field {name!r} must be a string, {got}")
    return payload


def check_schema(step: str, output: Any) -> Any:
    """Return `output` if it has the step's schema, else raise SchemaError naming the field."""
    if not isinstance(output, dict):
        raise SchemaError(f"{step}: output must be a JSON object, got {type(output).__name__}")
    for name, kind in SCHEMAS[step].items():
        value = output.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SchemaError(f"{step}: field {name!r} must be {kind.__name__}, got {value!r}")
    return output


class DocumentSteps:
    """fetch, extract, verify: one chat-completions call each; deliver: effects only."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def makes_call(self, step: str) -> bool:
        return step in SCHEMAS

    def call(self, step: str, data: Any, ctx: StepContext) -> CallResult:
        if step == "deliver":
            return CallResult(deliver_output(ctx))
        if step == "fetch":
            try:
                check_payload(data)
            except PoisonError as exc:
                raise PoisonError(f"fetch: {exc}") from None
        headers = {"X-Ninelives-Job": ctx.job_id, "X-Ninelives-Step": step,
                   "X-Ninelives-Worker": ctx.worker}
        answer = self.client.complete(f"step: {step}\n{INSTRUCTIONS[step]}",
                                      canonical_json(data), headers)
        try:
            check_schema(step, answer.content)
        except SchemaError as exc:
            exc.cost = answer.cost  # billed all the same
            raise
        return CallResult(answer.content, answer.cost)

    def conclude(self, step: str, output: Any, ctx: StepContext) -> Conclusion:
        return conclude_document(step, output, ctx)


def deliver_output(ctx: StepContext) -> dict:
    """What delivery sends, from the extraction: a charge and a notification."""
    extracted = ctx.memo("extract")
    return {"charge_cents": extracted["amount_cents"], "title": extracted["title"]}


def conclude_document(step: str, output: Any, ctx: StepContext) -> Conclusion:
    if step == "verify" and not output["ok"]:
        return Conclusion(park_reason=f"verify: flagged for review: {output['reason']}")
    if step == "deliver":
        return Conclusion(effects=(
            Effect("charge", {"job": ctx.job_id, "amount_cents": output["charge_cents"]}),
            Effect("notify", {"job": ctx.job_id, "title": output["title"]}),
        ))
    return Conclusion()


class InstantSteps:
    """The document pipeline's shapes with no I/O: measures the engine, not the model."""

    COST = 0.001

    def makes_call(self, step: str) -> bool:
        return step in SCHEMAS

    def call(self, step: str, data: Any, ctx: StepContext) -> CallResult:
        if step == "fetch":
            text = " ".join(str(data.get("body", "")).split())
            return CallResult({"title": str(data.get("title", "")), "text": text,
                               "chars": len(text)}, self.COST)
        if step == "extract":
            return CallResult({"title": data["title"], "words": len(data["text"].split()),
                               "entities": [], "amount_cents": len(data["text"]) % 100000},
                              self.COST)
        if step == "verify":
            return CallResult({"ok": True, "reason": "ok"}, self.COST)
        return CallResult(deliver_output(ctx))

    def conclude(self, step: str, output: Any, ctx: StepContext) -> Conclusion:
        return conclude_document(step, output, ctx)


def make_runner(config: EngineConfig) -> StepRunner:
    """The step runner named by config.steps: document, instant, or `module:attribute`
    (a runner object, or a callable taking the config and returning one)."""
    if config.steps == "document":
        return DocumentSteps(ChatClient(
            config.provider_url, config.model, config.call_timeout, config.provider_key,
            config.price_prompt_per_1k, config.price_completion_per_1k))
    if config.steps == "instant":
        return InstantSteps()
    module, _, attr = config.steps.partition(":")
    if not attr:
        raise ConfigError(f"setting 'steps' must be document, instant or module:object, "
                          f"got {config.steps!r}")
    try:
        target = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"setting 'steps': cannot load {config.steps!r}: {exc}") from None
    return target(config) if callable(target) and not hasattr(target, "call") else target
