"""Every crash point, reached for real: an engine process (worker, sender or submit) armed with
NINELIVES_CRASH_AT SIGKILLs itself there, against the fake provider and receiver. Then fresh
processes finish the work, and: the job is delivered, no provider call for a step started after
that step's memo committed, each effect was applied exactly once at the receiver, what a crash
there costs in provider calls is what it should be, and the database is intact. On every
store backend: a SQLite file, and a database on a real PostgreSQL server (leases on its clock)."""
from __future__ import annotations

import json
import signal
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import pytest

from chaos.fakes import ScriptedFaults
from engine.hooks import CRASHPOINTS
from engine.store import open_store

from store_backends import BACKENDS

STORE_BACKENDS = BACKENDS

JOB = "doc-1"
BODY = "Ada Lovelace of Analytical Engines Ltd wrote from London. The invoice is attached."
REVIEW = "Invoice [[needs-review]]"  # the fake's verify answers ok=false: the job parks

#: Flags for every process: a short lease, so recovering from a kill takes about 1.5 s.
SETTINGS = {"lease": 1.5, "call_timeout": 1.0, "heartbeat": "off", "outbox_lease": 1.5,
            "send_timeout": 1.0, "backoff_base": 0.05, "synchronous": "NORMAL"}

#: What each armed process is asked to do.
ARGS = {"worker": ("--exit-when-idle",), "send": ("--exit-when-idle",)}


def submit_args(title: str) -> tuple[str, ...]:
    payload = {"doc_id": JOB, "title": title, "body": BODY}
    return ("--id", JOB, "--payload", json.dumps(payload))


# --- what a crash must have left behind (proves where the process died) -------------------------

def nothing_claimed(s) -> bool:
    return s.job["state"] == "pending" and s.job["lease_token"] == 0 and not s.calls


def fetch_leased(calls: int | None) -> Callable[[SimpleNamespace], bool]:
    """Leased at fetch, nothing committed since the claim; `calls` provider calls so far."""
    return lambda s: (s.job["state"] == "fetching" and s.job["lease_token"] == 1
                      and s.job["attempts"] == 0 and not s.memos and not s.spend
                      and (calls is None or [c["step"] for c in s.calls] == ["fetch"] * calls))


def fetch_committed(s) -> bool:
    return set(s.memos) == {"fetch"} and s.job["state"] == "extracting"  # the job was kept


def approved_memo_waits(s) -> bool:
    return s.job["state"] == "verifying" and s.memos["verify"]["ok"] is True


def outbox_row_leased(s) -> bool:
    return (any(r["lease_owner"] and r["attempts"] == 1 for r in s.outbox)
            and not any(r["sent_at"] for r in s.outbox) and not s.applied)


def applied_not_marked(s) -> bool:
    return len(s.applied) == 1 and not any(r["sent_at"] for r in s.outbox)


@dataclass(frozen=True)
class Scenario:
    """How one crash point is reached.

    prepare: "submit" (a document job waits), "nothing" (the armed submit is the first),
    "deliver" (a worker delivered the job: its effects wait in the outbox), or "review" (the
    job parked in needs_human and an operator approved it: its verify memo waits);
    crash: the command armed with the point (worker, send or submit);
    left: what the database, ledgers and receiver must hold right after the kill;
    faults: provider faults {(step, n): fault} for the job;
    settings: flags over SETTINGS for every process of the scenario;
    fetch_billed: billed fetch calls at the end (1 = the crash cost no extra call).
    """

    prepare: str
    crash: str
    left: Callable[[SimpleNamespace], bool]
    faults: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    fetch_billed: int = 1


SCENARIOS = {
    "submit.before_commit": Scenario("nothing", "submit", lambda s: s.job is None),
    "claim.before_commit": Scenario("submit", "worker", nothing_claimed),
    "worker.after_claim": Scenario("submit", "worker", fetch_leased(0)),
    "worker.memo_hit.before_commit": Scenario("review", "worker", approved_memo_waits),
    "worker.before_call": Scenario("submit", "worker", fetch_leased(0)),
    "worker.after_call": Scenario("submit", "worker", fetch_leased(1), fetch_billed=2),
    "worker.before_commit": Scenario("submit", "worker", fetch_leased(1), fetch_billed=2),
    "worker.after_commit": Scenario("submit", "worker", fetch_committed),
    "worker.fail.before_commit": Scenario(
        "submit", "worker", fetch_leased(1),
        faults={("fetch", 1): {"kind": "status", "status": 500}}),
    "worker.heartbeat": Scenario(
        "submit", "worker", fetch_leased(None), fetch_billed=2,
        faults={("fetch", 1): {"kind": "slow", "seconds": 0.8}},
        settings={"heartbeat": "on", "heartbeat_interval": 0.2}),
    "sender.after_claim": Scenario("deliver", "send", outbox_row_leased),
    "sender.after_send": Scenario("deliver", "send", applied_not_marked),
    "sender.before_commit": Scenario("deliver", "send", applied_not_marked),
}


#: Reached only with several job slots: test_group_commit_kills kills a worker there.
GROUP_POINTS = {"worker.group.before_commit", "worker.group.after_commit"}


def test_every_crash_point_has_a_scenario():
    assert set(SCENARIOS) | GROUP_POINTS == set(CRASHPOINTS)


# --- reading the outcome ------------------------------------------------------------------------

def snapshot(db: str, provider, receiver) -> SimpleNamespace:
    """The job's rows, its memos {step: output}, the provider calls and receiver effects."""
    store = open_store(db, read_only=True)
    try:
        job = store.query("SELECT * FROM job WHERE id=?", (JOB,))
        memos = store.query("SELECT step, output, at FROM step_result WHERE job_id=?", (JOB,))
        return SimpleNamespace(
            job=job[0] if job else None,
            memos={m["step"]: json.loads(m["output"]) for m in memos},
            memo_at={m["step"]: m["at"] for m in memos},
            outbox=store.query("SELECT * FROM outbox WHERE job_id=?", (JOB,)),
            spend=store.query("SELECT * FROM spend WHERE job_id=?", (JOB,)),
            calls=[c for c in provider.entries() if c["job"] == JOB],
            applied=[e["key"] for e in receiver.applied()],
            integrity=store.integrity_check())
    finally:
        store.close()


def describe(s: SimpleNamespace) -> str:
    """The snapshot in one readable paragraph, for failure messages."""
    job = s.job and {k: s.job[k] for k in ("state", "lease_token", "attempts", "last_error")}
    outbox = [{k: r[k] for k in ("kind", "attempts", "lease_owner", "sent_at")} for r in s.outbox]
    calls = [(c["step"], c["n"], c["status"], c["billed"]) for c in s.calls]
    return (f"job {job}; memos {sorted(s.memos)}; {len(s.spend)} spend rows; outbox {outbox}; "
            f"provider calls (step, n, status, billed) {calls}; applied {s.applied}")


# --- the run ------------------------------------------------------------------------------------

def prepare(engine, scenario: Scenario) -> None:
    if scenario.prepare == "nothing":
        return
    engine.ok("submit", *submit_args(REVIEW if scenario.prepare == "review" else "Invoice"))
    if scenario.prepare == "deliver":
        engine.ok("worker", *ARGS["worker"])
    elif scenario.prepare == "review":
        engine.ok("worker", *ARGS["worker"])
        assert "resolved to extracted" in engine.ok("resolve", JOB, "--approve").stdout


def recover(engine, scenario: Scenario) -> None:
    """Run without the crash until idle: resubmit (if the submit died), a worker, a sender."""
    if scenario.crash == "submit":
        assert "submitted 1 new" in engine.ok("submit", *submit_args("Invoice")).stdout
    engine.ok("worker", *ARGS["worker"])
    engine.ok("send", *ARGS["send"])


@pytest.mark.parametrize("point", sorted(SCENARIOS))
def test_a_kill_at_the_crash_point_loses_nothing_and_pays_for_nothing_twice(
        point, engine, start_fakes, db_target):
    scenario = SCENARIOS[point]
    provider, receiver = start_fakes(ScriptedFaults(
        provider={(JOB, step, n): fault for (step, n), fault in scenario.faults.items()}))
    engine.settings.update(SETTINGS, provider_url=provider.url, receiver_url=receiver.url,
                           **scenario.settings)
    prepare(engine, scenario)

    args = submit_args("Invoice") if scenario.crash == "submit" else ARGS[scenario.crash]
    died = engine.run(scenario.crash, *args, crash_at=point)
    assert died.returncode == -signal.SIGKILL, f"{point} was never reached:\n{died}"
    after_kill = snapshot(db_target, provider, receiver)
    assert scenario.left(after_kill), f"a kill at {point} left: {describe(after_kill)}"
    assert after_kill.integrity == "ok"

    recover(engine, scenario)
    end = snapshot(db_target, provider, receiver)
    assert end.job["state"] == "delivered", describe(end)
    late = [c for c in end.calls if c["t_start"] >= end.memo_at[c["step"]]]
    assert not late, f"provider called after the step's memo committed: {late}"
    assert Counter(end.applied) == {f"{JOB}:charge": 1, f"{JOB}:notify": 1}
    billed = [c for c in end.calls if c["step"] == "fetch" and c["billed"] > 0]
    assert len(billed) == scenario.fetch_billed, describe(end)
    assert end.integrity == "ok"
