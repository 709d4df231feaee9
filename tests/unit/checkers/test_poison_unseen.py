"""retry-discipline on a loaded machine: a poison answer the fake finished only after its
caller had hung up (the ledger's completion "info") was never seen by the engine, whose retry
is then right; the same answer given definitely ("fail") and retried is still caught. (At 32
workers on 2 CPUs a fake 1 s slow to answer a schema-invalid extract was read as seen, and
the worker's timeout retry failed a correct engine.)"""
from __future__ import annotations

from builders import W1, W2
from test_liveness import claim, failed_try, fetch_call, retry_check


def poison_then_retry(completion: str) -> list[dict]:
    first = failed_try(1.0, W1, 1, 1, 0.05, status=200, outcome="schema")
    first[1]["completion"] = completion
    return first + [claim(2.0, W2, 2), fetch_call(2.01, W2, status=200, outcome="schema")]


def test_a_poison_answer_finished_after_the_caller_hung_up_is_no_poison_seen():
    assert "poison-retried" not in retry_check(poison_then_retry("info")).by_type


def test_a_poison_answer_given_definitely_and_retried_is_still_caught():
    assert retry_check(poison_then_retry("fail")).by_type == {"poison-retried": 1}
