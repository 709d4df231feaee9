"""The invariant checkers: pure functions `check(history, snapshot) -> Verdict`.

A checker never touches a process or a database. It reads the history (see chaos.history
for the event format) and the final snapshot, a dict built by the runner when the run ends:

  pipeline:  {"name", "steps": [{"name","ready","working","done","parked","alternate"}],
              "edges": {state: [to...]}, "operator_edges": {state: [to...]},
              "terminal": [...], "parked": [...], "ready": [...], "working": [...]}
  settings:  the engine settings of the run: lease, heartbeat, heartbeat_interval,
             call_timeout, max_attempts, max_claims, backoff_base, backoff_cap,
             outbox_max_attempts, keep_job, outbox_lease, send_timeout
  jobs:      {job_id: {"state","attempts","claims","lease_token","last_error",
              "payload_hash","next_run_at","lease_until"}}
  memos:     [{"job","step","cost","worker","lease_token","at"}]
  outbox:    [{"row","job","kind","key","sent_at","dead_at","attempts","last_error"}]
  spend:     [{"job","step","worker","lease_token","started","ended","outcome","cost"}]
  integrity: [{"t","after","result"}]  PRAGMA integrity_check after each kill and at the end
  orphans:   {"memos_without_job": N, "outbox_without_job": N, "spend_without_job": N}
  receiver_applied: [{"id","key","job","kind","t"}]   the receiver's applied effects
  plan:      {"poison": {job: kind}, "crash_loop": [job...], "needs_review": [job...],
              "duplicates": {"same": [job...], "different": [job...]},
              "expect": {"duplicate_spend_allowance": COST, "lease_exclusive": bool,
                         "settle": bool}}
  phases:    {"chaos_start","heal_start","drain_start","drain_end", "drained": bool}
  submitted: [job_id...]   every id the runner meant to create

Each checker module exposes `NAME` and `check(history, snapshot) -> Verdict`;
`run_checkers` runs them all, turning a checker that raises into an `unknown` verdict.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

from ..history import Event
from .verdict import Failure, Verdict

Checker = Callable[[list[Event], dict[str, Any]], Verdict]

#: Invariant name -> checker, in the order reports list them. Filled by `_load`.
CHECKERS: dict[str, Checker] = {}

INVARIANTS = (
    "legal-transitions", "no-rebill-after-commit", "outbox-bounded", "effects-complete",
    "all-jobs-settle", "submissions-idempotent", "memo-consistent", "retry-discipline",
    "bounded-work", "lease-exclusive", "fenced-writes", "cost-accounted", "db-intact",
)


def _load() -> None:
    import importlib
    for module in ("transitions", "billing", "outbox", "liveness", "leases", "integrity"):
        CHECKERS.update(importlib.import_module(f"{__name__}.{module}").CHECKS)


def run_checkers(history: list[Event], snapshot: dict[str, Any],
                 only: list[str] | None = None) -> list[Verdict]:
    """Every invariant's verdict, in INVARIANTS order. A checker that raises is `unknown`."""
    if not CHECKERS:
        _load()
    verdicts = []
    for name in INVARIANTS:
        if only and name not in only:
            continue
        try:
            verdict = CHECKERS[name](history, snapshot)
        except Exception as exc:  # a broken checker must not abort the run
            verdict = Verdict(name).unknown(
                f"checker crashed: {type(exc).__name__}: {exc}")
            verdict.metrics["traceback"] = traceback.format_exc(limit=5)
        verdicts.append(verdict)
    return verdicts


__all__ = ["CHECKERS", "INVARIANTS", "Failure", "Verdict", "run_checkers"]
