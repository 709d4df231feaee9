"""The timeline of processes that run several jobs at once (job slots): each held step gets a
row of its process's lane (the lowest free, or its worker id's own), calls go on their step's
row, a lane has as many rows as its processes held steps at once, and a kill says how many
steps it cut. Engine-neutral: one id per slot and one id for all draw alike."""
from __future__ import annotations

import pytest

from chaos.reference import chaos_pipeline
from chaos.reports.render.svg import LANE_H, ROW_H, TimelineDrawing
from chaos.reports.render.timeline import build_timeline
from engine import DOCUMENT

PIPELINE = chaos_pipeline(DOCUMENT, ("charge", "notify")).to_json()
PID = 301
SHARED = f"worker:host:{PID}:ffff"
SLOT = [f"{SHARED}/{k}" for k in range(4)]
IDS = {"one id per slot": SLOT, "one id for all": [SHARED] * 4}


def spawn(t, name, pid):
    return {"t": t, "src": "process", "type": "spawn", "name": name, "role": "worker",
            "pid": pid}


def write(t, type_, job_id, frm, to, worker, **fields):
    return {"t": t, "src": "engine", "type": type_, "completion": "ok", "job": job_id,
            "from": frm, "to": to, "worker": worker, "pid": PID, "actor": "worker",
            "token": 1, **fields}


def claim(t, job_id, worker):
    return write(t, "claimed", job_id, "pending", "fetching", worker, step="fetch",
                 continued=False, lease_until=t + 2.0)


def done(t, job_id, worker):
    return write(t, "state", job_id, "fetching", "fetched", worker, heartbeat=False,
                 took_lease=False)


def call(t, t_end, job_id, worker):
    return {"t": t, "src": "provider", "type": "call", "job": job_id, "step": "fetch",
            "worker": worker, "n": 1, "t_start": t, "t_end": t_end, "status": 200,
            "outcome": "ok", "billed": 0.01, "fault": None}


def timeline(events):
    return build_timeline(sorted(events, key=lambda e: e["t"]), PIPELINE, {})


def rows(tl, kind="step"):
    return {(b.job, b.start): b.row for b in tl.bars if b.kind == kind}


def three_at_once(ids):
    """Slots 0-2 claim a, b, c at 1.0-1.2 and call; b finishes at 2.0, then d is claimed at
    2.5 by b's slot."""
    return [spawn(0.0, "worker-0.1", PID),
            claim(1.0, "a", ids[0]), claim(1.1, "b", ids[1]), claim(1.2, "c", ids[2]),
            call(1.3, 1.9, "b", ids[1]), call(1.3, 2.8, "c", ids[2]),
            done(2.0, "b", ids[1]), claim(2.5, "d", ids[1]),
            done(3.0, "a", ids[0]), done(3.0, "c", ids[2]), done(3.0, "d", ids[1])]


@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
def test_steps_held_at_once_get_rows_of_their_own_and_calls_their_steps_row(ids):
    tl = timeline(three_at_once(ids))
    steps = rows(tl)
    assert [steps[("a", 1.0)], steps[("b", 1.1)], steps[("c", 1.2)]] == [0, 1, 2]
    assert rows(tl, "call") == {("b", 1.3): 1, ("c", 1.3): 2}
    [lane] = [lane for lane in tl.lanes if lane.key == "worker-0"]
    assert lane.rows == 3


def test_a_slots_next_step_keeps_the_row_its_worker_id_used():
    # d (claimed by b's slot) could take row 1 or, were rows given lowest-first, row 1 too;
    # make row 0 free first to tell them apart.
    events = three_at_once(SLOT)
    events = [e for e in events if not (e.get("job") == "a" and e["type"] == "state")] + \
        [done(1.5, "a", SLOT[0])]
    assert rows(timeline(events))[("d", 2.5)] == 1


def test_with_one_id_for_all_a_step_takes_the_lowest_free_row():
    events = [e for e in three_at_once([SHARED] * 4)
              if not (e.get("job") == "a" and e["type"] == "state")] + [done(1.5, "a", SHARED)]
    assert rows(timeline(events))[("d", 2.5)] == 0


def test_a_kill_cuts_every_row_and_says_how_many_steps():
    events = three_at_once(SLOT)[:6] + [
        {"t": 1.5, "src": "nemesis", "type": "kill", "pid": PID, "target": "worker-0.1"},
        {"t": 1.51, "src": "process", "type": "exit", "pid": PID, "signal": "SIGKILL",
         "code": None}]
    tl = timeline(events)
    killed = [b for b in tl.bars if b.kind == "step" and b.outcome == "killed"]
    assert sorted(b.row for b in killed) == [0, 1, 2] and {b.end for b in killed} == {1.51}
    [mark] = [m for m in tl.marks if m.kind == "kill"]
    assert "it cut 3 steps" in mark.title and "fetch of a" in mark.title


def test_a_lane_is_drawn_a_row_taller_for_each_further_job_slot():
    tl = timeline(three_at_once(SLOT))
    drawing = TimelineDrawing(tl, {"fetch": "#000"}, {})
    assert drawing.h["worker-0"] == LANE_H["worker"] + 2 * ROW_H
    assert "3 steps at once" in drawing.labels()


def test_one_job_at_a_time_keeps_one_row():
    events = [spawn(0.0, "worker-0.1", PID), claim(1.0, "a", SHARED), done(2.0, "a", SHARED),
              claim(2.0, "b", SHARED), done(3.0, "b", SHARED)]
    tl = timeline(events)
    assert set(rows(tl).values()) == {0}
    assert [lane.rows for lane in tl.lanes if lane.key == "worker-0"] == [1]
