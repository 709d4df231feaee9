"""SIGKILL inside a group commit, for real: a worker process with 8 job slots, armed to kill
itself at the Nth group's crash point, against the fake provider and receiver. Right after
the kill every job's memos match its state (a group commits whole or not at all: no memo
without its transition, no transition without its memo); then a fresh worker with slots and
a sender finish the work, and: every job is delivered, no provider call began after its
step's memo committed, each effect was applied once at the receiver, and the kill cost at most
one extra billed call per slot."""
from __future__ import annotations

import json
import signal
from collections import Counter

import pytest

from engine import DOCUMENT
from engine.store import open_store

JOBS = 16
SLOTS = 8
SETTINGS = {"lease": 1.5, "call_timeout": 1.0, "heartbeat": "off", "outbox_lease": 1.5,
            "send_timeout": 1.0, "backoff_base": 0.05, "synchronous": "FULL",
            "slots": SLOTS}
#: what a job's state says of its memos: the steps finished before it
STEPS = [s.name for s in DOCUMENT.steps]
DONE_BEFORE = {state: STEPS[:i + (1 if state in (s.done,) else 0)]
               for i, s in enumerate(DOCUMENT.steps) for state in (s.ready, s.working, s.done)}
DONE_BEFORE["delivered"] = STEPS


def read(db: str) -> dict:
    store = open_store(db, read_only=True)
    try:
        return {
            "jobs": {r["id"]: r["state"] for r in store.query("SELECT id, state FROM job")},
            "memos": store.query("SELECT job_id, step, at FROM step_result"),
            "integrity": store.integrity_check()}
    finally:
        store.close()


def torn(rows: dict) -> list:
    """Jobs whose memos do not match their state: half of a group's write committed."""
    memos: dict[str, set] = {}
    for m in rows["memos"]:
        memos.setdefault(m["job_id"], set()).add(m["step"])
    return [(job, state, sorted(memos.get(job, ())))
            for job, state in rows["jobs"].items()
            if memos.get(job, set()) != set(DONE_BEFORE[state])]


@pytest.mark.parametrize("point", ["worker.group.before_commit", "worker.group.after_commit"])
def test_a_kill_inside_a_group_commit_tears_nothing_and_pays_for_nothing_twice(
        point, engine, start_fakes, db_path):
    provider, receiver = start_fakes()
    engine.settings.update(SETTINGS, provider_url=provider.url, receiver_url=receiver.url)
    for i in range(JOBS):
        payload = {"doc_id": f"doc-{i}", "title": f"Invoice {i}", "body": "pay forty two euros"}
        engine.ok("submit", "--id", f"doc-{i}", "--payload", json.dumps(payload))
    # the 4th group: by then the slots' calls overlap, so the group carries several writes
    engine.env["NINELIVES_CRASH_AT"] = f"{point}:4"
    died = engine.run("worker", "--exit-when-idle")
    del engine.env["NINELIVES_CRASH_AT"]
    assert died.returncode == -signal.SIGKILL, f"{point} was never reached:\n{died}"
    after_kill = read(db_path)
    assert after_kill["integrity"] == "ok"
    assert not torn(after_kill), f"a kill at {point} tore a group: {torn(after_kill)}"
    assert after_kill["memos"], "the kill came before any group committed"

    engine.ok("worker", "--exit-when-idle")
    engine.ok("send", "--exit-when-idle")
    end = read(db_path)
    assert set(end["jobs"].values()) == {"delivered"} and not torn(end)
    memo_at = {(m["job_id"], m["step"]): m["at"] for m in end["memos"]}
    calls = provider.entries()
    late = [c for c in calls if c["t_start"] >= memo_at[(c["job"], c["step"])]]
    assert not late, f"provider called after the step's memo committed: {late}"
    applied = Counter(e["key"] for e in receiver.applied())
    assert applied == {f"doc-{i}:{kind}": 1 for i in range(JOBS) for kind in ("charge", "notify")}
    billed = Counter((c["job"], c["step"]) for c in calls if c["billed"] > 0)
    extra = sum(n - 1 for n in billed.values())
    assert len(billed) == JOBS * 3 and extra <= SLOTS, billed
    if point.endswith("before_commit"):  # the group's paid-for results were lost with it
        assert extra >= 1, billed
