"""Who made a write, from the probe's trace, for an engine whose rows do not say."""
from __future__ import annotations

from chaos.engines.writers import attribute_writes

WRITE_POINTS = {"after_call", "before_fail"}


def point(t, pid, name, job="j"):
    return {"t": t, "src": "process", "type": "point", "pid": pid, "point": name, "job": job}


def write(t, job="j", **fields):
    return {"t": t, "src": "engine", "type": "state", "job": job, "from": "a", "to": "b",
            "actor": "worker", "worker": None, "pid": None, **fields}


def claim(t, pid, worker, job="j"):
    return {"t": t, "src": "engine", "type": "claimed", "job": job, "worker": worker,
            "pid": pid, "actor": "worker"}


def test_a_write_after_one_process_passed_a_write_point_is_that_process_s():
    history = [claim(1.0, 11, "w11"), point(1.1, 11, "after_call"), write(1.2)]
    assert attribute_writes(history, WRITE_POINTS) == 1
    assert (history[-1]["worker"], history[-1]["pid"], history[-1]["attributed"]) == (
        "w11", 11, "probe")


def test_a_zombie_s_write_goes_to_the_zombie_not_to_the_process_that_took_the_job():
    # p11 returned from its call; p12 claimed meanwhile and is calling: p11 wrote.
    history = [claim(1.0, 11, "w11"), point(1.1, 11, "after_call"), claim(1.15, 12, "w12"),
               point(1.16, 12, "before_call"), write(1.2)]
    attribute_writes(history, WRITE_POINTS)
    assert history[-1]["worker"] == "w11"


def test_two_processes_at_a_write_point_leave_the_write_unattributed():
    history = [point(1.1, 11, "after_call"), point(1.15, 12, "before_fail"), write(1.2)]
    assert attribute_writes(history, WRITE_POINTS) == 0
    assert history[-1]["worker"] is None and history[-1]["attributed"] == "ambiguous"


def test_points_of_other_jobs_and_points_after_the_write_do_not_count():
    history = [point(1.1, 11, "after_call", job="other"), write(1.2),
               point(1.3, 12, "after_call")]
    assert attribute_writes(history, WRITE_POINTS) == 0
    assert "attributed" not in history[1]


def test_a_write_the_observer_attributed_is_left_as_it_was():
    named = write(1.2, worker="w9", pid=9)
    history = [point(1.1, 11, "after_call"), named]
    attribute_writes(history, WRITE_POINTS)
    assert (named["worker"], named["pid"]) == ("w9", 9)


def test_a_process_that_exited_or_moved_on_to_another_job_wrote_nothing_since():
    exited = {"t": 1.15, "src": "process", "type": "exit", "pid": 11}
    history = [point(1.1, 11, "after_call"), exited, write(1.2)]
    assert attribute_writes(history, WRITE_POINTS) == 0
    moved = [point(1.1, 11, "after_call"), point(1.15, 11, "after_call", job="k"), write(1.2)]
    assert attribute_writes(moved, WRITE_POINTS) == 0


def test_a_write_stamped_to_the_millisecond_before_its_own_write_point_is_still_found():
    # The store truncates its stamp to the millisecond: the write came after `after_call`.
    history = [point(1.0, 11, "before_call"), point(1.20026, 11, "after_call"),
               point(1.20058, 11, "before_commit"), write(1.2)]
    assert attribute_writes(history, WRITE_POINTS) == 1


def test_a_process_s_threads_are_followed_apart():
    # The heartbeat thread passed its write point; the main thread then started a call.
    beat = dict(point(1.1, 11, "after_call"), thread=2)
    call = dict(point(1.15, 11, "before_call"), thread=1)
    history = [beat, call, write(1.2)]
    assert attribute_writes(history, WRITE_POINTS) == 1
