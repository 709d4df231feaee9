"""The invariant checkers: pure functions `check(history, snapshot) -> Verdict`.

A checker never touches a process or a database. It reads the history (operations, see
chaos.history for the vocabulary) and the final snapshot, a dict built when the run ends
(see chaos.contract for the engine's part and chaos.run.expect for the harness's):

  engine:    {"name", "capabilities": [...]}   what the engine declared (chaos.contract)
  pipeline:  chaos.pipeline.Pipeline.to_json(): steps, edges, operator_edges, terminal,
             parked, ready, working, effects
  settings:  chaos.contract.EngineSettings.to_json(): lease, heartbeat, call_timeout,
             max_attempts, max_claims, backoff_bounds, outbox_lease, send_timeout, ...
             (None where the engine has no such setting)
  jobs:      {job_id: {"state","attempts","claims","token","last_error","cause",
              "payload_hash", ...}}
  memos:     [{"job","step","cost", ...}]
  outbox:    [{"row","job","kind","key","sent_at","dead_at","attempts","last_error"}]
  spend:     [{"job","step","worker","pid","started","ended","outcome","cost"}]
  integrity: [{"t","after","result"}]  the store's integrity after each kill and at the end
  orphans:   {name: count}
  receiver_applied: [{"id","key","job","kind","t"}]   the receiver's applied effects
  plan:      {"poison": {job: kind}, "crash_loop": [job...], "needs_review": [job...],
              "declined": {job: effect kind the receiver refuses for good},
              "duplicates": {"same": [job...], "different": [job...]},
              "expect": {"duplicate_spend_allowance": COST, "lease_exclusive": bool,
                         "settle": bool}}
  phases:    {"chaos_start","heal_start","drain_start","drain_end", "drained": bool}
  submitted: [job_id...]   every id the runner meant to create
  clock:     "real" | "virtual" (the simulation)
  ledgers:   ["provider", "receiver"]   the fakes whose ledgers the harness kept, so that an
             empty one is evidence (absent in a history from elsewhere)

A check whose evidence the engine does not provide (a capability it does not declare) is
`unknown` with that reason, never pass or fail; so is one that examined nothing while the
faults it depends on fired.

Each checker module exposes `NAME` and `check(history, snapshot) -> Verdict`;
`run_checkers` runs them all, turning a checker that raises into an `unknown` verdict, and
marks each verdict of an invariant that declares its dangerous situations
(chaos.situations.EXERCISES) with the ones the run reached: a pass that reached none is
"pass, not exercised".
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

from chaos.history import Event
from chaos.engines.schema import missing_evidence
from chaos.checkers.verdict import Failure, Verdict

Checker = Callable[[list[Event], dict[str, Any]], Verdict]

#: Invariant name -> checker, in the order reports list them. Filled by `load`.
CHECKERS: dict[str, Checker] = {}
#: Invariant name -> the engine fields it reads ("type.field", see chaos.engines.schema). Filled by
#: `load` from each checker module's READS.
READS: dict[str, tuple[str, ...]] = {}

INVARIANTS = (
    "legal-transitions", "no-rebill-after-commit", "outbox-bounded", "effects-complete",
    "all-jobs-settle", "submissions-idempotent", "memo-consistent", "retry-discipline",
    "bounded-work", "lease-exclusive", "lease-kept", "deadlines-kept", "operator-moves",
    "fenced-writes", "cost-accounted", "db-intact",
    "processes-survive", "claims-prompt", "durable-commits",
)


def load() -> None:
    """Import every checker module, filling CHECKERS and READS."""
    import importlib
    for module in ("transitions", "billing", "outbox", "liveness", "retries", "leases",
                   "deadlines", "operator", "integrity", "processes", "promptness", "durable"):
        loaded = importlib.import_module(f"{__name__}.{module}")
        CHECKERS.update(loaded.CHECKS)
        READS.update(getattr(loaded, "READS", {}))


class MissingEvidence(KeyError):
    """A checker asked the snapshot for a key it does not hold."""


class Snapshot(dict):
    """The snapshot as checkers read it: a missing key, at the top or in one of its tables
    (`phases`, `settings`, ...), raises MissingEvidence naming it."""

    def __init__(self, data: dict[str, Any], where: str = "") -> None:
        super().__init__(data)
        self.where = where
        if not where:
            for key, value in data.items():
                if isinstance(value, dict):
                    self[key] = Snapshot(value, f"{key}.")

    def __missing__(self, key: str) -> Any:
        raise MissingEvidence(f"{self.where}{key}")


def run_checkers(history: list[Event], snapshot: dict[str, Any],
                 only: list[str] | None = None) -> list[Verdict]:
    """Every invariant's verdict, in INVARIANTS order. A checker that raises is `unknown`;
    so is every checker of an empty history (nothing was recorded), and one that needs a
    key the snapshot lacks (the reason names it)."""
    if not CHECKERS:
        load()
    snapshot = Snapshot(snapshot)
    verdicts = []
    lacking = {item.split(" ")[0]: item
               for item in missing_evidence(history, {f for r in READS.values() for f in r})}
    for name in INVARIANTS:
        if only and name not in only:
            continue
        if not history:
            verdicts.append(Verdict(name).unknown(
                "the history is empty: nothing was recorded, so no evidence either way"))
            continue
        absent = [lacking[f] for f in READS.get(name, ()) if f in lacking]
        if absent:
            # An evidence field has no true reading when absent: no guess, no verdict.
            verdicts.append(Verdict(name).unknown(
                "the engine's operations leave out evidence this check reads: "
                + ", ".join(absent) + " (see docs/history.md)"))
            continue
        try:
            verdict = CHECKERS[name](history, snapshot)
        except MissingEvidence as exc:
            verdict = Verdict(name).unknown(f"the snapshot lacks {exc.args[0]!r}, which this "
                                            "check needs: no evidence either way")
        except Exception as exc:  # a broken checker must not abort the run
            verdict = Verdict(name).unknown(
                f"checker crashed: {type(exc).__name__}: {exc}")
            verdict.metrics["traceback"] = traceback.format_exc(limit=5)
        if verdict.valid is True and not verdict.checked:
            # A check that examined nothing has no evidence for a pass.
            verdict.unknown("nothing of its kind happened in this run: no evidence either way")
        verdicts.append(verdict)
    if history:
        # Which passes reached none of the situations that could have broken them.
        from chaos.situations import exercise, recognise
        exercise(verdicts, recognise(history, snapshot))
    return verdicts


__all__ = ["CHECKERS", "INVARIANTS", "Failure", "Verdict", "run_checkers"]
