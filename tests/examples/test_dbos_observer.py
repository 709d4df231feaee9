"""The DBOS observer's replay of DBOS's own rows: a workflow taken off the queue is a claim,
a summarize checkpoint a memo and the move on to publish, and a workflow that ends in ERROR a
park whose attempt count is unknown (DBOS keeps none), never a count of zero."""
from __future__ import annotations

from examples.dbos_pipeline import observer


def _replay(rows):
    jobs: dict = {}
    ops = []
    for tbl, op, status, executor, step, failed in rows:
        ops += observer.replay(jobs, "doc-1", tbl, op, status, executor, 0, step, failed, "h")
    return ops


def test_a_workflow_run_to_success_reads_as_claim_memo_continue_and_done():
    ops = _replay([("status", "insert", "ENQUEUED", None, None, None),
                   ("status", "update", "PENDING", "worker-0", None, None),
                   ("step", "insert", None, None, "summarize", 0),
                   ("step", "insert", None, None, "publish", 0),
                   ("status", "update", "SUCCESS", "worker-0", None, None)])
    assert [(o["type"], o.get("from"), o.get("to")) for o in ops] == [
        ("submitted", None, "queued"), ("claimed", "queued", "summarizing"),
        ("memo", None, None), ("claimed", "summarizing", "publishing"),
        ("state", "publishing", "published")]
    assert ops[1]["worker"] == "worker-0" and ops[1]["pid"] is None
    assert ops[3]["continued"] is True and ops[3]["step"] == "publish"


def test_a_workflow_in_error_is_parked_with_no_attempt_count():
    ops = _replay([("status", "insert", "ENQUEUED", None, None, None),
                   ("status", "update", "PENDING", "worker-1", None, None),
                   ("step", "insert", None, None, "summarize", 1),
                   ("status", "update", "ERROR", "worker-1", None, None)])
    park = ops[-1]
    assert (park["type"], park["from"], park["to"]) == ("state", "summarizing", "failed")
    assert park["cause"] == "attempts" and park["attempts"] is None
    assert all(o.get("attempts") is None for o in ops if o["type"] in ("claimed", "state"))
    assert not any(o["type"] == "memo" for o in ops), "a failed step is no memo"


def test_a_recovered_workflow_back_on_the_queue_after_summarize_is_summarized():
    assert observer.state_of("ENQUEUED", {"summarize"}) == "summarized"
    assert observer.state_of("PENDING", {"summarize"}) == "publishing"
    assert observer.state_of("MAX_RECOVERY_ATTEMPTS_EXCEEDED", set()) == "failed"


def test_a_workflow_error_is_read_back_as_text_not_as_dbos_pickle():
    import base64
    import pickle
    stored = base64.b64encode(pickle.dumps(ValueError("model said no"))).decode()
    assert observer.error_of(stored) == "ValueError: model said no"
    assert observer.error_of("not a pickle") == "not a pickle"   # kept as DBOS stored it
    assert observer.error_of(None) is None
