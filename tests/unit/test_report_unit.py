"""The report's fault accounting and tables, on hand-made events: `faults_applied` counts each
fault from its evidence (ledgers, crash log, nemesis), `unfired` names exactly the configured
faults without evidence, `crashpoint_coverage` lists every declared point, and
`verdict_table` puts failures first."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from chaos.checkers import Verdict
from chaos.spec.plan import FaultPlan
from chaos.reports.fired import crashpoint_coverage, faults_applied, prevented, unfired
from chaos.reports.report_text import verdict_table
from chaos.spec.scenario import Faults, load_scenario
from engine.hooks import CRASHPOINTS

LOOPING, OTHER = "doc-00002", "doc-00001"
PLAN = FaultPlan(seed=1, scenario="hand-made", profile="ci", jobs=[OTHER, LOOPING],
                 poison={}, crash_loop=[LOOPING], needs_review=[],
                 duplicates={"same": [], "different": []}, timeline=[], skewed=[0.0])


def call(fault: str | None, status: int | None = 200) -> dict:
    return {"t": 1.0, "src": "provider", "type": "call", "job": OTHER, "step": "fetch",
            "worker": "worker:h:1:a", "n": 1, "status": status, "outcome": "ok", "billed": 0.01,
            "fault": fault}


def request(fault: str | None) -> dict:
    return {"t": 2.0, "src": "receiver", "type": "request", "key": f"{OTHER}:charge",
            "job": OTHER, "kind": "charge", "n": 1, "status": 200, "outcome": "applied",
            "applied": True, "fault": fault}


def crash(point: str, job: str | None) -> dict:
    return {"t": 3.0, "src": "process", "type": "crashpoint", "pid": 11, "point": point,
            "job": job}


def nemesis(type_: str) -> dict:
    return {"t": 0.5, "src": "nemesis", "type": type_, "slot": 0}


EVENTS = [
    call(None), call("status", 429), call("status", 429), call("status", 400),
    call("status", 500), call("status", 502), call("status", 503), call("hang", None),
    call("reset", None), call("slow"), call("slow"), call("bad_content"), call("schema"),
    call("garbage"),
    request(None), request("status"), request("timeout"), request("drop"), request("drop"),
    crash("worker.before_call", LOOPING), crash("worker.after_call", LOOPING),
    crash("worker.after_claim", LOOPING), crash("worker.before_call", OTHER),
    crash("sender.after_send", None),
    nemesis("skew"), nemesis("heartbeat_off"), nemesis("heartbeat_off"), nemesis("kill"),
    {"t": 4.0, "src": "engine", "type": "billed", "job": OTHER, "step": "fetch",
     "outcome": "poison", "fault": "status"},  # not evidence: only ledgers and logs count
    {"t": 4.0, "src": "process", "type": "exit", "name": "w1", "role": "worker", "pid": 11,
     "code": None, "signal": "SIGKILL"},
]
NEMESIS = Counter({"kill": 4, "pause": 1, "outage": 1, "duplicate_same": 2, "contention": 0})


def test_faults_applied_counts_each_fault_from_its_evidence():
    assert faults_applied(PLAN, EVENTS, NEMESIS) == {
        "kill": 4, "pause": 1, "outage": 1, "duplicate_same": 2,
        "provider_429": 2, "provider_5xx": 3, "poison": 4, "hang": 1, "reset": 1, "slow": 2,
        "receiver_5xx": 1, "receiver_timeout": 1, "receiver_drop": 2,
        "crash_loop": 3, "crash_point": 2, "skewed_worker": 1, "heartbeat_off_worker": 2,
    }


def test_faults_applied_is_empty_without_evidence():
    assert faults_applied(PLAN, [call(None), request(None)], Counter()) == {}


@pytest.mark.parametrize("job,key", [(LOOPING, "crash_loop"), (OTHER, "crash_point"),
                                     (None, "crash_point")])
def test_a_crash_counts_as_crash_loop_only_for_a_crash_loop_job(job, key):
    assert faults_applied(PLAN, [crash("worker.before_call", job)], Counter()) == {key: 1}


# -- unfired --------------------------------------------------------------------------------

EVERY_FAULT = {"kill", "crash_points", "pause", "lease_expiry", "skewed_workers",
               "heartbeat_off_workers", "slow", "provider_429", "provider_5xx", "hang", "reset",
               "outages", "poison", "unavailable", "crash_loop", "duplicate_same",
               "duplicate_different",
               "receiver_5xx", "receiver_timeout", "receiver_drop", "receiver_lost", "contention",
               "operator", "declined"}


def test_with_no_evidence_every_configured_fault_is_unfired():
    missing = unfired(load_scenario("everything"), {})
    assert len(missing) == len(set(missing)) and set(missing) == EVERY_FAULT


def test_unfired_lists_exactly_the_configured_faults_without_evidence():
    smoke = load_scenario("smoke")  # kill, crash points, 429, 5xx, hang, poison, receiver 5xx
    applied = faults_applied(PLAN, [call("status", 429), call("schema")], Counter({"kill": 3}))
    applied["pause"] = 5  # evidence of a fault the scenario did not ask for changes nothing
    applied["receiver_5xx"] = 0
    assert sorted(unfired(smoke, applied)) == ["crash_points", "hang", "provider_5xx",
                                                "receiver_5xx"]


def test_unfired_is_empty_when_every_configured_fault_has_evidence():
    applied = faults_applied(PLAN, EVENTS, NEMESIS)
    everything = load_scenario("everything")
    applied.update(lease_expiry=1, duplicate_different=1, contention=1, operator=1,
                   receiver_lost=1, unavailable=1, declined=1)
    assert unfired(everything, applied) == []


def test_a_scenario_without_faults_has_nothing_unfired():
    quiet = dataclasses.replace(load_scenario("smoke"), faults=Faults())
    assert unfired(quiet, {}) == []


FORCED = dataclasses.replace(PLAN, forced_provider=[[OTHER, "fetch", "provider_429"]],
                             forced_receiver=[[OTHER, "charge", "receiver_drop"]])


def cancel(t: float, job: str = OTHER) -> dict:
    return {"t": t, "src": "engine", "type": "state", "job": job, "from": "pending",
            "to": "cancelled", "actor": "operator", "worker": None, "pid": None}


@pytest.mark.parametrize("events, taken", [
    ([cancel(0.5)], {"provider_429", "receiver_drop"}),   # cancelled before any call
    ([call(None), cancel(1.5)], {"receiver_drop"}),        # its fetch ran first: unfired
    ([cancel(0.5, LOOPING)], set()),                       # another job was cancelled
    ([], set()),
], ids=["cancelled-first", "cancelled-after-the-call", "other-job", "no-operator"])
def test_a_fault_whose_target_an_operator_took_first_is_prevented_not_unfired(events, taken):
    why = prevented(FORCED, events, ["provider_429", "receiver_drop", "pause"])
    assert set(why) == taken
    assert all("operator" in reason and OTHER in reason for reason in why.values())


# -- crash-point coverage -------------------------------------------------------------------

def test_crashpoint_coverage_lists_every_declared_point_including_zeros():
    events = [crash("worker.before_call", OTHER), crash("worker.before_call", LOOPING),
              crash("sender.after_send", None), nemesis("kill"),
              {"t": 1.0, "src": "process", "type": "spawn", "name": "w", "role": "worker",
               "pid": 1, "point": "worker.after_call"}]
    coverage = crashpoint_coverage(CRASHPOINTS, events)
    assert list(coverage) == list(CRASHPOINTS)
    assert coverage == {p: {"worker.before_call": 2, "sender.after_send": 1}.get(p, 0)
                        for p in CRASHPOINTS}


def test_crashpoint_coverage_without_crashes_is_all_zeros():
    assert crashpoint_coverage(CRASHPOINTS, []) == dict.fromkeys(CRASHPOINTS, 0)


# -- the verdict table ----------------------------------------------------------------------

def verdict(name: str, status: str, reason: str = "") -> dict:
    v = Verdict(name, checked=3)
    if status == "fail":
        v.fail("broken", reason or f"{name} broke")
    elif status == "unknown":
        v.unknown(reason or "no evidence")
    return v.to_json()


def test_verdict_table_lists_failures_first():
    report = {"verdicts": [verdict("a-pass", "pass"), verdict("m-fail", "fail"),
                           verdict("b-pass", "pass"), verdict("z-unknown", "unknown"),
                           verdict("c-fail", "fail")]}
    header, *rows = verdict_table(report).splitlines()
    assert header.split()[:2] == ["invariant", "verdict"]
    names = [row.split()[0] for row in rows]
    marks = [row.split()[1] for row in rows]
    assert sorted(names) == ["a-pass", "b-pass", "c-fail", "m-fail", "z-unknown"]
    assert set(marks[:3]) == {"FAIL", "UNKNOWN"}
    assert marks[3:] == ["pass", "pass"]
    assert names.index("c-fail") < names.index("m-fail")


def test_verdict_table_shows_counts_and_a_reason_shortened_at_a_word():
    long_reason = " ".join(f"word{i}" for i in range(60))
    _, row = verdict_table({"verdicts": [verdict("lease-exclusive", "fail", long_reason)]},
                           console=None).splitlines()
    assert row.split()[:4] == ["lease-exclusive", "FAIL", "3", "1"]
    reason = row.split("  ")[-1]
    assert reason.endswith(" ...") and len(reason) <= 100
    assert long_reason.startswith(reason[:-4]) and long_reason[len(reason) - 4] == " "


def test_an_unavailable_steps_503s_during_an_outage_are_still_its_own():
    """A document whose step answers 503 every time keeps its fault during an outage (the
    nemesis asks the document first), so its 503s there are evidence of `unavailable`, not
    of the outage; another job's 503 in the outage is the outage's."""
    plan = dataclasses.replace(PLAN, unavailable={OTHER: "fetch"})
    outage = [{"t": 0.5, "src": "nemesis", "type": "outage"},
              {"t": 1.5, "src": "nemesis", "type": "outage_end"}]
    other = dict(call("status", 503), job=LOOPING)
    applied = faults_applied(plan, outage + [call("status", 503), other], Counter())
    assert (applied.get("unavailable"), applied.get("outage_503")) == (1, 1)


def test_an_unavailable_document_an_operator_cancelled_before_its_step_is_prevented():
    plan = dataclasses.replace(PLAN, unavailable={OTHER: "verify"})
    assert "unavailable" in prevented(plan, [cancel(0.5)], ["unavailable"])
    fetched = dict(call(None), step="verify", t=0.2)  # its step was called first: unfired
    assert prevented(plan, [fetched, cancel(0.5)], ["unavailable"]) == {}


def test_a_partial_run_says_whether_its_adapter_raised():
    from chaos.reports.report_text import incomplete_lines
    killed = incomplete_lines({"partial": True})
    assert killed[0].startswith("PARTIAL: the run ended before its checks (killed?)")
    raised = incomplete_lines({"partial": True, "adapter_error": {
        "method": "snapshot", "type": "OperationError", "traceback": "adapter-error.txt"}})
    assert raised[0].startswith("PARTIAL: the run ended before its checks: the adapter's "
                                "snapshot raised OperationError (traceback: "
                                "adapter-error.txt)")
