"""durable-commits on hand-made histories: a cut that lost acknowledged operations fails
where the settings promise durability, is reported where they do not, and is unknown where
the adapter declares nothing or no cut fired."""
from __future__ import annotations

from chaos.checkers.durable import check_durable_commits

SNAP = {"phases": {"chaos_start": 100.0}}


def cut(n: int, lost: int, promised: bool | None, t: float = 103.0) -> dict:
    lost_ops = [{"type": "memo", "job": f"doc-{i}", "step": "fetch", "t": t - 0.5}
                for i in range(lost)]
    return {"t": t, "src": "nemesis", "type": "power_loss", "cut": n, "mode": "all",
            "dropped_writes": 7, "dropped_bytes": 4096, "acknowledged": 50,
            "lost_count": lost, "lost_by_type": {"memo": lost} if lost else {},
            "lost": lost_ops, "durability_promised": promised,
            "durability_setting": "synchronous=FULL, journal_mode=WAL" if promised
            else "synchronous=NORMAL, journal_mode=WAL"}


def test_a_lost_acknowledged_commit_fails_naming_the_cut_where_durability_is_promised():
    v = check_durable_commits([cut(1, 0, True), cut(2, 2, True, t=106.25)], SNAP)
    assert v.valid is False and v.by_type == {"lost-acknowledged": 1}
    witness = v.failures[0]
    assert "power cut 2 at +6.250 s" in witness.message
    assert "lost 2 acknowledged operation(s) (2 memo)" in witness.message
    assert "synchronous=FULL" in witness.message and "doc-0" in witness.message
    assert witness.events[0]["cut"] == 2
    assert v.metrics["lost"] == 2 and v.metrics["cuts"] == 2


def test_what_a_setting_that_promises_nothing_lost_is_reported_not_failed():
    lost = cut(1, 3, False)
    lost["lost_memos"] = [["doc-0", "fetch"]]
    calls = [{"src": "provider", "type": "call", "job": "doc-0", "step": "fetch", "t": t}
             for t in (102.0, 104.0, 105.0)]  # one before the cut, two after it
    v = check_durable_commits([calls[0], lost, *calls[1:], cut(2, 1, False)], SNAP)
    assert v.valid is True
    assert v.metrics["lost"] == 4 and v.metrics["lost_by_type"] == {"memo": 4}
    assert v.metrics["rebilled_after_cut"] == 2
    assert v.metrics["promised"] is False


def test_cuts_that_lost_nothing_pass():
    v = check_durable_commits([cut(n, 0, True) for n in (1, 2, 3)], SNAP)
    assert v.valid is True and v.checked == 150


def test_no_declaration_is_unknown_when_something_was_lost():
    v = check_durable_commits([cut(1, 1, None)], SNAP)
    assert v.valid is None and "declares no durability" in v.reason


def test_no_cut_is_unknown():
    v = check_durable_commits([{"t": 1.0, "src": "nemesis", "type": "kill"}], SNAP)
    assert v.valid is None and v.reason == "no power cut in this run"
