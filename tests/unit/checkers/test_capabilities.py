"""Honest verdicts: a check whose evidence the engine does not declare is `unknown` with the
reason, a check that examined nothing while its faults fired is `unknown`, and what evidence
there is still fails a violation."""
from __future__ import annotations

from builders import W1, call, delivered_with_effects, job, process, snapshot_with_effects

from chaos.checkers.billing import check_cost_accounted
from chaos.checkers.integrity import check_db_intact
from chaos.checkers.leases import check_fenced_writes
from chaos.checkers.liveness import check_bounded_work
from chaos.checkers.retries import check_retry_discipline
from chaos.checkers.outbox import check_effects_complete, check_outbox_bounded
from chaos.contract import CAPABILITIES
from chaos.reports.fired import not_applicable
from chaos.spec.scenario import load_scenario

DOC = "doc-1"


def without(*missing: str) -> dict:
    """The snapshot's engine entry for an engine lacking `missing` capabilities."""
    return {"name": "partial", "capabilities": sorted(set(CAPABILITIES) - set(missing))}


def check(checker, history, *missing, **overrides):
    return checker(history, snapshot_with_effects(history, engine=without(*missing),
                                                  **overrides))


def test_without_spend_records_cost_accounted_is_unknown_and_says_why():
    history = delivered_with_effects(DOC)
    history = [e for e in history if e["type"] != "billed"]  # nothing recorded them
    assert check(check_cost_accounted, history).status == "fail"  # the engine promised them
    verdict = check(check_cost_accounted, history, "spend_records")
    assert verdict.status == "unknown"
    assert "no per-call spend record" in verdict.reason


def test_without_spend_records_a_memo_cost_off_its_bill_still_fails():
    history = delivered_with_effects(DOC)
    history = [dict(e, billed=0.02) if e["type"] == "call" and e["step"] == "fetch" else e
               for e in history if e["type"] != "billed"]
    verdict = check(check_cost_accounted, history, "spend_records")
    assert verdict.status == "fail" and set(verdict.by_type) == {"cost-mismatch"}


def test_without_an_outbox_the_effects_are_still_judged_at_the_receiver():
    history = delivered_with_effects(DOC)
    for checker in (check_outbox_bounded, check_effects_complete):
        assert check(checker, history).status == "pass"
        verdict = check(checker, history, "outbox")
        assert verdict.status == "pass" and verdict.checked > 0, verdict.reason
    bounded = check(check_outbox_bounded, history, "outbox")
    assert "were not bounded" in bounded.reason  # what it could not judge, it says


def test_without_an_outbox_an_effect_applied_twice_or_never_fails():
    history = delivered_with_effects(DOC)
    applied = snapshot_with_effects(history)["receiver_applied"]
    twice = check(check_outbox_bounded, history, "outbox",
                  receiver_applied=applied + [{**applied[0], "key": "another-key"}])
    assert twice.status == "fail" and set(twice.by_type) == {"applied-twice"}
    lost = [e for e in history if e["src"] != "receiver"]
    never = check(check_effects_complete, lost, "outbox", receiver_applied=[])
    assert never.status == "fail" and set(never.by_type) == {"effect-not-applied"}
    assert never.error_count == len(snapshot_with_effects(history)["pipeline"]["effects"])


def test_without_an_outbox_or_effects_or_the_receivers_ledger_the_effects_are_unknown():
    history = delivered_with_effects(DOC)
    snap = snapshot_with_effects(history, engine=without("outbox"))
    snap["pipeline"]["effects"] = []
    assert check_effects_complete(history, snap).status == "unknown"
    for checker in (check_outbox_bounded, check_effects_complete):
        verdict = check(checker, history, "outbox", ledgers=["provider"])
        assert verdict.status == "unknown" and "ledger" in verdict.reason


def test_without_an_integrity_control_db_intact_is_unknown_not_a_pass():
    history = delivered_with_effects(DOC)
    assert check(check_db_intact, history).status == "pass"
    verdict = check(check_db_intact, history, "integrity", integrity=[])
    assert verdict.status == "unknown" and "integrity" in verdict.reason


def crash_loop_unparked():
    claims = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1)]
    claims += [job(1.0 + i, DOC, "fetching", "fetching", W1, i + 1, old_token=i, claims=i + 1)
               for i in range(1, 12)]
    return claims


def test_without_a_crash_loop_cap_a_crash_loop_must_still_end_parked():
    history = crash_loop_unparked()
    plan = {**snapshot_with_effects([])["plan"], "crash_loop": [DOC]}
    verdict = check(check_bounded_work, history, "crash_loop_cap", plan=plan)
    assert verdict.status == "fail" and set(verdict.by_type) == {"crash-loop-not-parked"}
    # With no crash-loop job, an engine that declares no cap gives no verdict on claims.
    verdict = check(check_bounded_work, history, "crash_loop_cap")
    assert verdict.status == "unknown" and "no crash-loop cap" in verdict.reason
    assert check(check_bounded_work, history).status == "fail"  # a declared cap of 8


def test_retryable_failures_with_no_retry_seen_are_unknown():
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1),
               call(1.01, 1.02, DOC, "fetch", W1, status=429, outcome="error", billed=0.0)]
    verdict = check_retry_discipline(history, snapshot_with_effects(history))
    assert verdict.status == "unknown"
    assert "0 retries observed while 1 retryable" in verdict.reason


def test_writes_nobody_can_attribute_are_counted_not_judged():
    claim = job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1)
    anonymous = dict(job(2.0, DOC, "fetching", "fetched", W1, 1), worker=None)
    verdict = check_fenced_writes([claim, anonymous], snapshot_with_effects([claim, anonymous]))
    assert verdict.status == "unknown" and verdict.metrics["unattributed_writes"] == 1
    stranger = dict(anonymous, worker="worker:host:999:zzzz")
    verdict = check_fenced_writes([claim, stranger], snapshot_with_effects([claim, stranger]))
    assert verdict.status == "fail"


def test_a_fault_the_engine_cannot_undergo_is_not_applicable():
    scenario = load_scenario("everything")

    class NoControls:
        capabilities = frozenset({"outbox"})

    skipped = not_applicable(scenario, NoControls())
    assert {"lease_expiry", "contention", "operator", "crash_loop"} <= set(skipped)
    # The receiver's faults need effects to refuse, not an outbox to send them from.
    assert "receiver_5xx" not in skipped  # NoControls has an outbox

    class NoEffects:
        capabilities = frozenset()
        pipeline = type("P", (), {"effects": ()})()

    assert "receiver_5xx" in not_applicable(scenario, NoEffects())

    class EffectsNoOutbox:
        capabilities = frozenset()
        pipeline = type("P", (), {"effects": ("charge",)})()

    assert not {"receiver_5xx", "receiver_lost"} & set(not_applicable(scenario, EffectsNoOutbox()))
    assert not_applicable(scenario, type("All", (), {"capabilities": set(CAPABILITIES)})()) == []



def test_a_step_the_pipeline_says_keeps_no_memo_is_not_owed_one():
    from chaos.checkers.billing import check_memo_consistent
    history = delivered_with_effects(DOC)
    history = [e for e in history if not (e["type"] == "memo" and e["step"] == "deliver")]
    assert check_memo_consistent(history, snapshot_with_effects(history)).status == "fail"
    snap = snapshot_with_effects(history)
    snap["pipeline"]["steps"][-1]["memo"] = False
    assert check_memo_consistent(history, snap).status == "pass"


def test_a_write_that_carries_no_payload_hash_is_not_a_payload_change():
    from chaos.checkers.transitions import check_submissions_idempotent
    history = delivered_with_effects(DOC)
    blind = [dict(e, payload_hash=None) if e["type"] == "state" else e for e in history]
    assert check_submissions_idempotent(blind, snapshot_with_effects(history)).status == "pass"
    changed = [dict(e, payload_hash="other") if e["type"] == "state" else e for e in history]
    assert check_submissions_idempotent(changed, snapshot_with_effects(history)).status == "fail"


def test_without_leases_that_exclude_a_crashed_caller_s_repeat_is_not_duplicate_spend():
    from chaos.checkers.leases import check_lease_exclusive
    plan = {**snapshot_with_effects([])["plan"],
            "expect": {"duplicate_spend_allowance": 0.0, "lease_exclusive": False,
                       "settle": True}}
    W3 = "worker:host:103:cccc"
    base = delivered_with_effects(DOC)
    took = job(0.9, DOC, "pending", "fetching", W3, 1, old_token=0, claims=1)
    lost = call(0.91, 0.95, DOC, "fetch", W3)   # a good answer nobody committed
    died = process(0.96, "exit", "w3", 103, signal="SIGKILL")
    verdict = check_lease_exclusive(base + [took, lost, died],
                                    snapshot_with_effects(base, plan=plan))
    assert verdict.status == "pass", verdict.reason
    verdict = check_lease_exclusive(base + [took, lost], snapshot_with_effects(base, plan=plan))
    assert verdict.by_type == {"duplicate-spend-over-allowance": 1}


def test_a_planned_crash_loop_is_not_judged_in_an_engine_without_crash_points():
    history = delivered_with_effects(DOC)   # nothing crashed it: the probe was never armed
    plan = {**snapshot_with_effects([])["plan"], "crash_loop": [DOC]}
    assert check(check_bounded_work, history, "crash_loop_cap", plan=plan).status == "fail"
    verdict = check(check_bounded_work, history, "crash_loop_cap", "crash_points", plan=plan)
    assert verdict.status == "unknown", verdict.by_type
    assert verdict.metrics["crash_loop_jobs"] == 0


def test_a_step_that_calls_no_model_parked_for_its_attempts_is_not_judged_by_model_calls():
    from builders import request, snapshot
    from examples.dbos_pipeline import adapter, observer
    jobs: dict = {}
    rows = [(1.0, "status", "insert", "ENQUEUED", None, None, None),
            (1.1, "status", "update", "PENDING", "worker-0", None, None),
            (1.3, "step", "insert", None, None, "summarize", 0),
            (2.0, "status", "update", "ERROR", "worker-0", None, None)]
    history = [{"t": t, "src": "engine", "seq": i, "completion": "ok", "job": DOC, **op}
               for i, (t, *row) in enumerate(rows)
               for op in observer.replay(jobs, DOC, *row[:4], 0, *row[4:], "h")]
    history.insert(2, call(1.15, 1.25, DOC, "summarize", "worker-0"))
    # the delivery failed at the receiver max_attempts times: that is its evidence
    history += [request(1.4 + i / 10, 1.45 + i / 10, DOC, "publish", worker="worker-0",
                        status=503, outcome="error", applied=False) for i in range(4)]
    history.sort(key=lambda e: e["t"])
    snap = snapshot(pipeline=adapter.PIPELINE.to_json(), engine=without(*CAPABILITIES),
                    settings={"max_attempts": 4})
    verdict = check_retry_discipline(history, snap)
    assert verdict.checked and "parked-before-cap" not in verdict.by_type, verdict.by_type
