"""Checker of the store itself (db-intact): the engine's integrity check was ok after every
kill and at the end, and no memo, outbox or spend row outlived its job."""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.checkers.ops import capable
from chaos.checkers.verdict import Verdict


def check_db_intact(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Every snapshot.integrity entry's result is "ok" ("integrity", naming when it was
    taken); every snapshot.orphans count is 0 ("orphan-rows"). Unknown with no integrity
    checks recorded: the run never looked."""
    verdict = Verdict("db-intact")
    if not capable(snapshot, "integrity"):
        return verdict.unknown("the engine offers no integrity check of its store")
    checks = snapshot["integrity"]
    if not checks:
        return verdict.unknown("no integrity check results in the snapshot")
    for entry in checks:
        verdict.checked += 1
        if entry.get("result") != "ok":
            verdict.fail("integrity", f"the integrity check after {entry.get('after')!r} "
                         f"returned {entry.get('result')!r}",
                         {"src": "snapshot", "type": "integrity", **entry})
    orphans = snapshot["orphans"]
    for kind, count in sorted(orphans.items()):
        verdict.checked += 1
        if count:
            verdict.fail("orphan-rows", f"{kind}: {count} row(s) whose job does not exist",
                         {"src": "snapshot", "type": "orphans", "kind": kind, "count": count})
    verdict.metrics = {"integrity_checks": len(checks),
                       "failed_checks": verdict.by_type.get("integrity", 0),
                       "orphans": dict(orphans)}
    return verdict


CHECKS = {"db-intact": check_db_intact}
