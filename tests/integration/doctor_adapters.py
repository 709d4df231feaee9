"""Adapters that are not ready, for the tests of `ninelives doctor`: the toy engine's adapter
with exactly one requirement broken each, named `--engine
tests.integration.doctor_adapters:<NAME>`. Each behaves as the toy otherwise, so doctor
must find that one gap and name it."""
from __future__ import annotations

import hashlib
from typing import Any

from chaos.contract import EngineSettings
from examples.toy_engine.adapter import ToyEngine


class SubmittedWithoutState(ToyEngine):
    """`submitted` operations without their state (nor from, nor to)."""

    def operations(self, db: str) -> list[dict[str, Any]]:
        ops = super().operations(db)
        for op in ops:
            if op["type"] == "submitted":
                for name in ("state", "from", "to"):
                    op.pop(name, None)
        return ops


class SentAtAsText(ToyEngine):
    """`effect_sent` with `sent_at` a string (an ISO date, say), not seconds."""

    def operations(self, db: str) -> list[dict[str, Any]]:
        ops = super().operations(db)
        for op in ops:
            if op["type"] == "effect_sent":
                op["sent_at"] = "2026-12-01T10:00:00Z"
        return ops


def handle(job: str, step: str) -> str:
    """A receipt handle: the same for one holding, and in no order from one to the next."""
    return hashlib.sha256(f"{job}/{step}".encode()).hexdigest()[:12]


class UnorderedTokens(ToyEngine):
    """Declares fencing, with random handles as tokens, and leaves token_order 'ordered'."""

    capabilities = ToyEngine.capabilities | {"fencing"}

    def operations(self, db: str) -> list[dict[str, Any]]:
        ops = super().operations(db)
        for op in ops:
            if op["type"] == "claimed":
                op["token"] = handle(op["job"], op["step"])
        return ops


class SubmitNeedsSettings(ToyEngine):
    """A submit that needs the [engine] table but asks for it through **kwargs, which the
    harness never fills: every submission raises."""

    def submit(self, db: str, job_id: str, payload: Any, now: float | None = None,
               **kwargs: Any) -> str:
        table = kwargs["settings"]
        return super().submit(db, job_id, payload, now) if table is not None else "rejected"


class RoleToUndeclaredPoint(ToyEngine):
    """point_roles maps a role to a point the engine does not declare."""

    point_roles = {**ToyEngine.point_roles, "after_call": ("after_the_call",)}


class LoopPointUndeclared(ToyEngine):
    """crash_loop_point is not among the crashpoints."""

    crash_loop_point = "nowhere"


class IntegrityNotText(ToyEngine):
    """integrity answers 0 (a count of problems), not "ok"."""

    def integrity(self, db: str) -> Any:
        return 0


class ExpireAnswersNone(ToyEngine):
    """expire_leases expires the leases but answers None, not how many."""

    def expire_leases(self, db: str, now: float | None = None) -> Any:
        super().expire_leases(db, now)
        return None


class ProgressRaises(ToyEngine):
    def progress(self, db: str) -> dict[str, Any]:
        raise RuntimeError("broken progress on purpose")


class AcceptsAnySetting(ToyEngine):
    """settings() drops what it does not know instead of refusing it."""

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        return super().settings({k: v for k, v in table.items() if k != "no_such_setting"})


class OneCounterAsAttempts(ToyEngine):
    """One receive count bounds retries and crashes together, mapped onto max_claims alone:
    max_attempts None beside the attempt_cap it declares, and cap_counts left 'separate'."""

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        import dataclasses
        return dataclasses.replace(super().settings(table), max_attempts=None)


SUBMITTED_WITHOUT_STATE = SubmittedWithoutState()
ONE_COUNTER_AS_ATTEMPTS = OneCounterAsAttempts()
SENT_AT_AS_TEXT = SentAtAsText()
UNORDERED_TOKENS = UnorderedTokens()
SUBMIT_NEEDS_SETTINGS = SubmitNeedsSettings()
ROLE_TO_UNDECLARED_POINT = RoleToUndeclaredPoint()
LOOP_POINT_UNDECLARED = LoopPointUndeclared()
INTEGRITY_NOT_TEXT = IntegrityNotText()
EXPIRE_ANSWERS_NONE = ExpireAnswersNone()
PROGRESS_RAISES = ProgressRaises()
ACCEPTS_ANY_SETTING = AcceptsAnySetting()


class LeaseLeftOut(ToyEngine):
    """Claims without `lease_until`: evidence left out, which makes checks unknown but is
    no gap (an engine may not keep it)."""

    def operations(self, db: str) -> list[dict[str, Any]]:
        ops = super().operations(db)
        for op in ops:
            if op["type"] == "claimed":
                op.pop("lease_until", None)
        return ops


LEASE_LEFT_OUT = LeaseLeftOut()
