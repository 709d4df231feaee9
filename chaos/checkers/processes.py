"""processes-survive: every engine process the harness started ends only when the harness
ends it (a SIGKILL of the nemesis, an armed crash point, the final shutdown). A worker or
sender that exits by itself, say with a traceback after a stale claim, is a finding, with
the tail of its log as the evidence."""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.checkers.verdict import Verdict


def check_processes_survive(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Fail every process exit that the harness did not cause."""
    verdict = Verdict("processes-survive")
    exits = [e for e in history if e.get("src") == "process" and e.get("type") == "exit"]
    spawns = sum(1 for e in history if e.get("src") == "process" and e.get("type") == "spawn")
    if spawns and not exits:
        return verdict.unknown(f"{spawns} processes were spawned and no exit was recorded")
    if any("killed" not in e for e in exits):
        return verdict.unknown("the process exits do not say whether the harness ended them")
    probed = {e.get("pid") for e in history if e.get("src") == "process"
              and e.get("type") == "crashpoint"}
    t0 = history[0]["t"] if history else 0.0
    by_itself = 0
    for e in exits:
        verdict.checked += 1
        if e["killed"] or e.get("pid") in probed:
            continue
        by_itself += 1
        how = f"signal {e['signal']}" if e.get("signal") else f"exit code {e.get('code')}"
        tail = (e.get("log_tail") or "").strip().splitlines()
        last = f"; its log ends: {tail[-1][:200]!r}" if tail else ""
        verdict.fail("exited-by-itself", f"{e.get('role')} {e.get('name')} (pid {e.get('pid')})"
                     f" ended by itself with {how} at +{e['t'] - t0:.3f} s{last}", e)
    verdict.metrics = {"spawned": spawns, "exits": len(exits), "exited_by_itself": by_itself,
                       "crash_point_deaths": len(probed)}
    return verdict


CHECKS = {"processes-survive": check_processes_survive}
