"""db-intact: integrity checks all ok and no orphan rows pass, each bad entry fails naming it;
and every checker, given a malformed history or snapshot, yields `unknown` through
run_checkers instead of aborting the run."""
from __future__ import annotations

import pytest
from builders import delivered_job, snapshot, snapshot_of

from chaos.checkers import INVARIANTS, run_checkers
from chaos.checkers.integrity import check_db_intact

CHECKS_AFTER = [{"t": 10.0, "after": "kill worker-1 pid 101", "result": "ok"},
                {"t": 100.0, "after": "end", "result": "ok"}]


def test_ok_after_every_kill_and_no_orphans_passes():
    verdict = check_db_intact([], snapshot(integrity=CHECKS_AFTER))
    assert verdict.status == "pass"
    assert verdict.checked == 5  # two integrity checks, three orphan counts


def test_a_corrupt_check_fails_naming_when_it_was_taken():
    bad = {"t": 10.0, "after": "kill worker-1 pid 101",
           "result": "*** in database main ***\nPage 7 is never used"}
    verdict = check_db_intact([], snapshot(integrity=[bad, CHECKS_AFTER[1]]))
    assert verdict.status == "fail"
    assert verdict.by_type == {"integrity": 1}
    assert "kill worker-1 pid 101" in verdict.failures[0].message
    assert verdict.failures[0].events[0]["after"] == bad["after"]


@pytest.mark.parametrize("kind", ["memos_without_job", "outbox_without_job", "spend_without_job"])
def test_orphan_rows_fail(kind):
    orphans = {**snapshot()["orphans"], kind: 2}
    verdict = check_db_intact([], snapshot(orphans=orphans))
    assert verdict.status == "fail"
    assert verdict.by_type == {"orphan-rows": 1}
    assert verdict.failures[0].events == [{"src": "snapshot", "type": "orphans", "kind": kind,
                                           "count": 2}]


def test_unknown_when_no_integrity_check_was_recorded():
    assert check_db_intact([], snapshot(integrity=[])).status == "unknown"


MINE = ("legal-transitions", "submissions-idempotent", "no-rebill-after-commit",
        "memo-consistent", "cost-accounted", "lease-exclusive", "fenced-writes", "db-intact")


def statuses(history, snapshot_):
    verdicts = run_checkers(history, snapshot_)
    assert [v.name for v in verdicts] == list(INVARIANTS)  # the run went on past any crash
    return {v.name: (v.status, v.reason.split(":")[0]) for v in verdicts if v.name in MINE}


CRASHED = ("unknown", "checker crashed")


@pytest.mark.parametrize("malformed, readers", [
    ({"t": 1.0, "src": "engine", "type": "state"}, MINE[:-1]),
    ({"t": 1.0, "src": "provider", "type": "call", "job": "doc-1"},
     ("no-rebill-after-commit", "memo-consistent", "cost-accounted", "lease-exclusive")),
], ids=["audit-job-without-fields", "ledger-line-cut-short"])
def test_a_malformed_history_makes_its_readers_unknown_not_crash(malformed, readers):
    history = delivered_job("doc-1") + [malformed]
    got = statuses(history, snapshot_of(delivered_job("doc-1")))
    # unknown either way: a checker that crashed on it, or one whose evidence it leaves out
    # (chaos.engines.schema: a state write without its lease_until)
    lacks = ("unknown", "the engine's operations leave out evidence this check reads")
    assert all(got[name] in (CRASHED, lacks) for name in readers), got
    assert got["db-intact"][0] == "pass"


def test_a_malformed_snapshot_makes_the_checkers_that_read_it_unknown():
    got = statuses(delivered_job("doc-1"), {"integrity": "garbage"})
    readers = [name for name in MINE if name != "no-rebill-after-commit"]  # history only
    # A key the snapshot lacks is named; a table it holds in the wrong shape crashes the
    # checker that reads it: unknown either way, never an aborted run.
    assert {got[name][0] for name in readers} == {"unknown"}
    assert all(got[name] == CRASHED or got[name][1].startswith("the snapshot lacks '")
               for name in readers)
    assert any(got[name][1].startswith("the snapshot lacks '") for name in readers)
