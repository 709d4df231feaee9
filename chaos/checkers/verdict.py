"""A checker's verdict: valid (pass), invalid (fail) or unknown, with the events that prove it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.history import Event

MAX_WITNESSED = 20  # errors kept with their events; the rest are only counted


@dataclass
class Failure:
    """One violation: its type, a sentence a person can read, and the events that prove it."""

    type: str
    message: str
    events: list[Event] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message, "events": self.events}


@dataclass
class Verdict:
    """What one invariant concluded. valid: True (pass), False (fail), None (unknown)."""

    name: str
    valid: bool | None = True
    checked: int = 0                      # how many things were examined
    failures: list[Failure] = field(default_factory=list)
    error_count: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""                      # one line: why it failed, or why unknown
    #: Of an invariant that declares the situations exercising it (chaos.situations):
    #: {situation: times reached, None when unobservable}, and for a pass whether any was
    #: reached (False: "pass, not exercised"). None for the others.
    situations: dict[str, int | None] | None = None
    exercised: bool | None = None

    @property
    def status(self) -> str:
        return {True: "pass", False: "fail", None: "unknown"}[self.valid]

    @property
    def label(self) -> str:
        """The status as reports show it: "pass, not exercised" for a pass that reached
        none of its situations."""
        if self.valid is True and self.exercised is False:
            return "pass, not exercised"
        return self.status

    def fail(self, type_: str, message: str, *events: Event) -> None:
        """Record a violation (the verdict becomes fail)."""
        self.valid = False
        self.error_count += 1
        self.by_type[type_] = self.by_type.get(type_, 0) + 1
        if len(self.failures) < MAX_WITNESSED:
            self.failures.append(Failure(type_, message, list(events)))
        if not self.reason:
            self.reason = message

    def unknown(self, reason: str) -> "Verdict":
        self.valid = None
        self.reason = reason
        return self

    def to_json(self) -> dict:
        return {
            "name": self.name, "verdict": self.status, "checked": self.checked,
            "error_count": self.error_count, "errors_by_type": self.by_type,
            "first_error": self.failures[0].to_json() if self.failures else None,
            "errors": [f.to_json() for f in self.failures], "metrics": self.metrics,
            "reason": self.reason,
            **({"exercised": self.exercised, "situations": self.situations}
               if self.situations is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> "Verdict":
        valid = {"pass": True, "fail": False, "unknown": None}[data["verdict"]]
        return cls(name=data["name"], valid=valid, checked=data.get("checked", 0),
                   failures=[Failure(f["type"], f["message"], f.get("events", []))
                             for f in data.get("errors", [])],
                   error_count=data.get("error_count", 0),
                   by_type=dict(data.get("errors_by_type", {})),
                   metrics=dict(data.get("metrics", {})), reason=data.get("reason", ""),
                   situations=data.get("situations"), exercised=data.get("exercised"))


#: Invariants a failure of which, found in the first part of a history, is a failure of the
#: whole: each error is a bad event among those present (an illegal edge, a call after a
#: commit, a write after a lost lease), excused by nothing that can come later. The others
#: wait for something (a job settling, a spend record after a call, a client's next write)
#: that a missing tail may hold.
PREFIX_CLOSED = frozenset({
    "legal-transitions", "no-rebill-after-commit", "submissions-idempotent", "memo-consistent",
    "lease-exclusive", "fenced-writes", "db-intact"})


def judge_incomplete(verdicts: list[Verdict], why: str) -> list[Verdict]:
    """The verdicts of a history whose end is missing (`why`: a torn file, a killed run).
    No pass stands (the missing part may hold a violation); a failure of a PREFIX_CLOSED
    invariant stands; any other failure becomes unknown, its errors kept: the missing part
    may excuse them. Changes the verdicts in place and returns them."""
    for v in verdicts:
        if v.valid is True:
            v.unknown(f"{why}: a pass needs the whole history")
        elif v.valid is False and v.name not in PREFIX_CLOSED:
            v.valid = None
            v.reason = (f"{why}: {v.error_count} error(s) in the part present may be excused "
                        f"by the part missing; the first: {v.reason}")
        elif v.valid is None and why not in v.reason:
            v.reason = f"{why}; {v.reason}" if v.reason else why
    return verdicts
