"""Fencing tokens judged under the engine's token_order: with opaque tokens (random receipt
handles) a write under an older holding's token is still a zombie's, found by the order the
claims committed, never by comparing the values; an ordered engine is judged as before; and
where the history cannot place a token, no verdict is made up."""
from __future__ import annotations

from builders import W1, W2, job, nemesis, snapshot, snapshot_of

from chaos.checkers.billing import check_no_rebill_after_commit
from chaos.checkers.leases import check_fenced_writes
from chaos.checkers.tokens import TokenMarks, fenced_out
from chaos.history import merge
from test_billing import zombie_memo_race
from test_leases import taken_over

DOC = "doc-1"
#: random handles whose values sort against the order of the claims that carried them
HANDLES = {0: None, 1: "rh-f7c2", 2: "rh-03ab", 3: "rh-5d10"}


def opaque(history: list[dict]) -> list[dict]:
    """The same history from an engine whose tokens are random handles."""
    return [{**e, "token": HANDLES[e["token"]]} if "token" in e else e for e in history]


def run(check, history, order: str | None):
    history = merge(history)
    settings = dict(snapshot()["settings"])
    if order is not None:
        settings["token_order"] = order
    return check(history, snapshot_of(history, settings=settings))


def reclaimed_by_the_same_worker():
    """W1 claims doc-1 (token 1), its lease is expired, and W1 claims it again (token 2): one
    worker id, two holdings (a process with job slots and one id, say)."""
    return [job(1.0, DOC, None, "pending", "submit", 0, op="insert"),
            job(1.1, DOC, "pending", "fetching", W1, 1, old_token=0),
            nemesis(2.0, "expire", job=DOC),
            job(2.0, DOC, "fetching", "fetching", "nemesis", 1, lease_until=0.5),
            job(2.1, DOC, "fetching", "fetching", W1, 2, old_token=1)]


def test_a_zombie_write_under_an_older_random_token_is_caught_by_commit_order():
    history = opaque(reclaimed_by_the_same_worker())
    zombie = {**job(2.5, DOC, "fetching", "fetched", W1, 1), "token": HANDLES[1]}
    verdict = run(check_fenced_writes, history + [zombie], "opaque")
    assert verdict.by_type == {"zombie-write": 1}, verdict.reason
    assert "under token rh-f7c2, an older holding's than the newest claim's (token rh-03ab)" \
        in verdict.failures[0].message
    # compared by value, "rh-f7c2" > "rh-03ab": the zombie would pass as the newest holding
    assert run(check_fenced_writes, history + [zombie], "ordered").status == "pass"


def test_a_zombie_of_another_worker_is_caught_with_random_tokens():
    history = opaque(taken_over())
    zombie = {**job(2.5, DOC, "fetching", "fetched", W1, 2), "token": HANDLES[1]}
    verdict = run(check_fenced_writes, history + [zombie], "opaque")
    assert verdict.by_type == {"zombie-write": 1}
    assert "an older holding's than the newest claim's" in verdict.failures[0].message
    # a zombie under the newest claim's own token is caught by who owns the lease
    stolen = {**job(2.5, DOC, "fetching", "fetched", W1, 2), "token": HANDLES[2]}
    verdict = run(check_fenced_writes, history + [stolen], "opaque")
    assert "belonged to worker:host:102:bbbb" in verdict.failures[0].message


def test_the_owner_writing_under_a_random_token_that_sorts_lower_is_no_zombie():
    history = opaque(reclaimed_by_the_same_worker())
    owner = {**job(2.5, DOC, "fetching", "fetched", W1, 2), "token": HANDLES[2]}
    assert run(check_fenced_writes, history + [owner], "opaque").status == "pass"
    # a counter read from random handles: "rh-03ab" < "rh-f7c2" is a false alarm
    assert run(check_fenced_writes, history + [owner], "ordered").status == "fail"


def test_an_opaque_token_no_claim_carried_proves_nothing():
    history = opaque(reclaimed_by_the_same_worker())
    unseen = {**job(2.5, DOC, "fetching", "fetched", W1, 2), "token": "rh-ffff"}
    assert run(check_fenced_writes, history + [unseen], "opaque").status == "pass"


def test_an_ordered_engine_is_judged_as_before():
    history = taken_over()
    regress = job(2.5, DOC, "fetching", "fetched", W2, 1, old_token=2)
    for order in (None, "ordered", "opaque"):  # None: a snapshot from before the setting
        verdict = run(check_fenced_writes, history + [regress], order)
        assert verdict.by_type == {"zombie-write": 1}, order
    before = run(check_fenced_writes, history + [regress], None)
    assert "setting the token back from 2 to 1" in before.failures[0].message
    assert run(check_fenced_writes, history + [regress], "ordered").failures[0].message == \
        before.failures[0].message
    clean = history + [job(2.5, DOC, "fetching", "fetched", W2, 2)]
    assert run(check_fenced_writes, clean, "ordered").status == "pass"


def test_a_memo_race_is_placed_by_the_order_of_the_claims_with_random_tokens():
    history, zombie, late, claim = zombie_memo_race(1.13)
    verdict = run(check_no_rebill_after_commit, opaque(history), "opaque")
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["zombie_memo_races"] == 1
    history, zombie, late, claim = zombie_memo_race(1.50)
    assert run(check_no_rebill_after_commit, opaque(history), "opaque").status == "fail"


def test_a_memo_under_a_token_no_claim_carried_leaves_the_race_untold():
    history, _, _, _ = zombie_memo_race(1.13)
    history = [{**e, "token": "rh-ffff"} if e["type"] == "memo" else e
               for e in opaque(history)]
    verdict = run(check_no_rebill_after_commit, history, "opaque")
    assert verdict.status == "unknown"
    assert "a zombie's race or a re-bill" in verdict.reason


def test_fenced_out_and_the_marks_by_order():
    claims = [{"token": "b"}, {"token": "a"}]
    assert fenced_out("b", claims[1], claims, "opaque") is True
    assert fenced_out("a", claims[0], claims, "opaque") is False
    assert fenced_out("z", claims[1], claims, "opaque") is None
    assert fenced_out("b", claims[1], claims, "ordered") is False
    marks = TokenMarks("opaque")
    marks.took("job", "b")
    marks.took("job", "a")
    assert marks.went_back("job", "b") and not marks.went_back("job", "a")
    marks.took("job", "b")  # a handle handed out again is the newest holding's
    assert marks.went_back("job", "a") and not marks.went_back("job", "b")
