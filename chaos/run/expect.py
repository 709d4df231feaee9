"""What a run's checkers are told besides the history (the snapshot's harness part and the
scenario's expectations), what each engine process is started with, and when a store has
settled. One definition, shared by `ninelives run` and `ninelives sim`."""
from __future__ import annotations

from typing import Any, Iterable

from chaos.contract import EngineSettings, ProcessContext, has
from chaos.spec.plan import FaultPlan
from chaos.spec.scenario import Scenario


def process_context(scenario: Scenario, plan: FaultPlan, settings: EngineSettings, role: str,
                    slot: int, db: str, provider_url: str, receiver_url: str) -> ProcessContext:
    """The harness-neutral settings of one process: a worker slot the plan skews gets its
    clock skew; one of the last `heartbeat_off_workers` runs without heartbeat, with a call
    timeout the engine accepts without one (shorter than the lease)."""
    ctx: dict[str, Any] = {"db": db, "provider_url": provider_url,
                           "receiver_url": receiver_url, "engine": dict(scenario.engine),
                           "slot": slot}
    if role == "worker":
        ctx["clock_skew"] = plan.skewed[slot] if slot < len(plan.skewed) else 0.0
        # an engine with no lease has no heartbeat to turn off (the fault does not apply)
        if (settings.lease is not None
                and slot >= scenario.run.workers - scenario.faults.heartbeat_off_workers):
            lease = settings.lease
            ctx.update(heartbeat=False,
                       call_timeout=min(settings.call_timeout or lease * 0.8, lease * 0.8))
    return ProcessContext(**ctx)


def settled(engine: Any, progress: dict[str, Any]) -> bool:
    """Whether the engine's `progress` shows every job terminal or parked, nothing unsent."""
    done = engine.pipeline.terminal | engine.pipeline.parked_states
    return progress["unsent"] == 0 and all(s in done for s in progress["states"])


def expectations(scenario: Scenario, engine: Any, settings: EngineSettings) -> dict[str, Any]:
    """What the invariants may expect of this scenario on this engine: leases exclusive only
    with heartbeat on, a lease longer than the call timeout and no fault that takes leases.
    A skewed worker takes leases only where its own clock places them (`lease_clock`
    "worker", as on SQLite); where the store's clock does (PostgreSQL), exclusivity is
    still expected of a scenario with skewed workers."""
    f, c = scenario.faults, settings
    skew_takes_leases = bool(f.skewed_workers) and c.lease_clock != "store"
    exclusive = (has(engine, "heartbeat") and c.heartbeat and c.lease is not None
                 and c.call_timeout is not None and c.lease > c.call_timeout
                 and not skew_takes_leases and not f.pause and not f.lease_expiry
                 and not f.contention and not f.heartbeat_off_workers)
    return {"duplicate_spend_allowance": scenario.expect.duplicate_spend_allowance,
            "lease_exclusive": exclusive, "settle": True}


def harness_snapshot(scenario: Scenario, plan: FaultPlan, engine: Any,
                     settings: EngineSettings, *, integrity: list[dict],
                     receiver_applied: Iterable[dict], phases: dict[str, Any],
                     jobs: Iterable[str], clock: str = "real") -> dict[str, Any]:
    """The snapshot's keys that the harness, not the engine, knows (see chaos.checkers);
    `jobs` are the ids that took part (a shrunk simulation keeps some)."""
    kept = list(jobs)
    keep = set(kept)
    return {
        "engine": {"name": engine.name, "capabilities": sorted(engine.capabilities)},
        "pipeline": engine.pipeline.to_json(),
        "settings": settings.to_json(),
        "integrity": integrity,
        "receiver_applied": [{"id": a["id"], "key": a["key"], "job": a["job"],
                              "kind": a["kind"], "t": a["t"]} for a in receiver_applied],
        "plan": {"poison": {j: v["kind"] for j, v in plan.poison.items() if j in keep},
                 "crash_loop": [j for j in plan.crash_loop if j in keep],
                 "needs_review": [j for j in plan.needs_review if j in keep],
                 "declined": {j: k for j, k in plan.declined.items() if j in keep},
                 "duplicates": {k: [j for j in v if j in keep]
                                for k, v in plan.duplicates.items()},
                 "expect": expectations(scenario, engine, settings)},
        "phases": phases,
        "submitted": kept,
        # The harness ran both fakes and kept their ledgers: an empty ledger means no request
        # reached that fake, not that its ledger was lost.
        "ledgers": ["provider", "receiver"],
        # "virtual" in the simulation: checks with a deadline allow its scheduling, not a
        # loaded machine's.
        "clock": clock,
    }
