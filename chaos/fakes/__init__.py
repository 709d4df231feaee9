"""Fakes of the outside world (a model provider and a side-effect receiver) as real HTTP servers on
127.0.0.1 that ledger every request, and the scripted fault policies tests drive them with.

The provider answers any chat-completions request, plain or streamed, so a user's own pipeline
and the official `openai` client can be driven through it (chaos.fakes.provider); `python -m
chaos.fakes` runs one fake by hand (chaos.fakes.__main__). A fake whose ledger cannot be written
keeps the error (`ledger_failure`, a LedgerWriteError) for whoever runs it to report.
"""

import threading

from chaos.fakes.ledger import Ledger, LedgerWriteError, read_ledger
from chaos.fakes.provider import PROVIDER_FAULTS, FakeProvider
from chaos.fakes.receiver import RECEIVER_FAULTS, FakeReceiver

__all__ = ["Ledger", "LedgerWriteError", "read_ledger", "FakeProvider", "FakeReceiver", "ScriptedFaults"]

_NEEDS = {"status": "status", "hang": "seconds", "slow": "seconds", "timeout": "seconds",
          "lost": "seconds"}


class ScriptedFaults:
    """A fault policy that injects exactly the faults it was given, by call number.

    Takes `provider` = {(job, step, n): fault} and `receiver` = {(job, kind, n): fault}, n being the
    1-based call count the fake keeps per (job, step) / (job, kind). Raises ValueError for a fault
    of unknown kind or without its parameter (status code, seconds; a provider "cut" may
    say `after` how many streamed pieces, a whole number >= 0).
    """

    def __init__(self, provider: dict | None = None, receiver: dict | None = None):
        self._provider = {key: _checked(f, PROVIDER_FAULTS) for key, f in (provider or {}).items()}
        self._receiver = {key: _checked(f, RECEIVER_FAULTS) for key, f in (receiver or {}).items()}
        self._fired: set[tuple] = set()
        self._lock = threading.Lock()

    def provider_fault(self, job: str, step: str, n: int) -> dict | None:
        """Return the fault scripted for the n-th provider call of (job, step), or None."""
        return self._fire("provider", self._provider, (job, step, n))

    def receiver_fault(self, job: str, kind: str, n: int) -> dict | None:
        """Return the fault scripted for the n-th receiver call of (job, kind), or None."""
        return self._fire("receiver", self._receiver, (job, kind, n))

    def unfired(self) -> list[tuple]:
        """Return ("provider"|"receiver", key) for scripted faults no call has reached yet.

        A test whose faults never fired proved nothing; this lets it say so.
        """
        with self._lock:
            scripted = [("provider", k) for k in self._provider] + [("receiver", k) for k in self._receiver]
            return [item for item in scripted if item not in self._fired]

    def _fire(self, side: str, script: dict, key: tuple) -> dict | None:
        fault = script.get(key)
        if fault is not None:
            with self._lock:
                self._fired.add((side, key))
        return fault


def _checked(fault: dict, kinds: frozenset) -> dict:
    kind = fault.get("kind") if isinstance(fault, dict) else None
    if kind not in kinds:
        raise ValueError(f"unknown fault {fault!r}; kinds are {sorted(kinds)}")
    if kind in _NEEDS and not isinstance(fault.get(_NEEDS[kind]), (int, float)):
        raise ValueError(f"fault {fault!r} needs a numeric {_NEEDS[kind]!r}")
    after = fault.get("after", 0)
    if kind == "cut" and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
        raise ValueError(f"fault {fault!r}: 'after' is a whole number of pieces >= 0")
    return dict(fault)
