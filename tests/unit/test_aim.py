"""Aimed faults (chaos.spec.aim): scenario validation naming the field, what an aim arms on an
engine or why it does not apply, the probe's hold in a real child process, the release logic
of a real run's watch, and the sentences a report gives."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from chaos.spec import aim as aims
from chaos.spec.aim import Aim, Target
from chaos.run.aim_watch import AimWatch, _stopped_or_gone
from chaos.checkers.ops import harness_windows
from chaos.spec.plan import FaultPlan
from chaos.reference.adapter import ReferenceEngine
from chaos.spec.scenario import ScenarioError, check_aims, load_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, says", [
    ({"until": "takeover"}, "'aim[1].point' is required"),
    ({"point": "role:nope"}, "names no role"),
    ({"point": "role:after_call", "action": "kill"}, "'aim[1].action' must be"),
    ({"point": "role:after_call", "until": "later"}, "'aim[1].until' must be"),
    ({"point": "role:after_call", "until": -1}, "'aim[1].until' must be"),
    ({"point": "role:after_call", "until": "point:role:zzz"}, "'aim[1].until'"),
    ({"point": "role:after_call", "times": 0}, "'aim[1].times' must be a whole number"),
    ({"point": "role:after_call", "every": 1.5}, "'aim[1].every' must be a whole number"),
    ({"point": "role:after_call", "deadline": 0}, "'aim[1].deadline' must be"),
    ({"point": "role:after_call", "until": 6.0}, "exceeds aim[1].deadline"),
    ({"point": "role:after_call", "colour": "red"}, "unknown field 'aim[1].colour'"),
    ({"point": "role:before_commit", "action": "expire"}, "inside a write transaction"),
    ({"point": "*"}, "not '*'"),
])
def test_a_bad_aim_is_refused_naming_its_field(raw, says):
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")
                       .replace("*", r"\*")):
        Aim.from_table(raw, 1)


def test_a_scenario_file_with_a_bad_aim_names_file_and_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[[aim]]\npoint = "role:after_call"\nuntil = "soon"\n')
    with pytest.raises(ScenarioError, match=r"bad.toml: field 'aim\[1\].until'"):
        load_scenario(str(path))


def test_an_aim_at_a_point_the_engine_lacks_is_a_scenario_error_unless_optional():
    scenario = load_scenario("aim-zombie-completion", "smoke")
    engine = ReferenceEngine()
    wrong = dataclasses.replace(scenario, aims=(Aim("worker.nowhere"),))
    with pytest.raises(ScenarioError, match=r"aim\[1\]\.point.*worker.nowhere"):
        check_aims(wrong, engine)
    optional = dataclasses.replace(scenario, aims=(Aim("worker.nowhere?"),))
    check_aims(optional, engine)
    (target,) = aims.resolve(optional.aims, engine)
    assert not target.armed and "worker.nowhere" in target.absent


def test_an_engine_without_crash_points_or_lease_expiry_is_not_applicable():
    class Bare:
        name, capabilities, crashpoints = "bare", frozenset({"crash_points"}), ("a.b",)
        point_roles = {"after_call": ("a.b",)}
    hold, expire = aims.resolve((Aim("role:after_call"), Aim("role:after_call",
                                                             action="expire")), Bare())
    assert hold.armed and hold.points == ("a.b",)
    assert "lease_expiry" in expire.absent
    Bare.capabilities = frozenset()
    (none,) = aims.resolve((Aim("role:after_call"),), Bare())
    assert "no crash points" in none.absent


def test_every_aim_scenario_loads_for_the_reference_and_arms_its_points():
    engine = ReferenceEngine()
    for name in ("aim-zombie-completion", "aim-zombie-heartbeat", "aim-call-after-takeover",
                 "aim-commit-after-lapse", "aim-memo-resume-effects", "aim-outbox-takeover"):
        scenario = load_scenario(name, "smoke")
        assert scenario.aims and all(t.armed for t in aims.resolve(scenario.aims, engine)), name


def test_the_probe_environment_names_points_jobs_and_every():
    engine = ReferenceEngine()
    plan = FaultPlan(3, "aim", "smoke", ["doc-1", "doc-2", "doc-3"], {}, [], [], {}, [], [])
    targets = aims.resolve((Aim("role:after_call", until="point:role:after_claim", job="pick",
                                every=2),), engine)
    env = aims.probe_env(targets, plan, "/tmp/holds.jsonl")
    job = plan.aimed_job(1)
    assert job == plan.aimed_job(1) and job in plan.jobs  # a pure function of the seed
    assert env["NINELIVES_HOLD_AT"] == f"worker.after_call={job}/2"
    assert env["NINELIVES_HOLD_WATCH"] == "worker.after_claim"


# -- the takeover, read from operations ---------------------------------------------------

def test_a_takeover_is_another_processs_claim_after_the_hold():
    ops = [{"type": "claimed", "job": "j", "worker": "A", "pid": 1, "t": 1.0},
           {"type": "claimed", "job": "j", "worker": "A", "pid": 1, "t": 1.5, "continued": True},
           {"type": "claimed", "job": "k", "worker": "B", "pid": 2, "t": 2.5}]
    assert aims.takeover(ops, "j", 2.0, "worker", 1) is None
    ops.append({"type": "claimed", "job": "j", "worker": "B", "pid": 2, "t": 3.0})
    taken = aims.takeover(ops, "j", 2.0, "worker", 1)
    assert (taken.by, taken.t, taken.pid) == ("B", 3.0, 2)


def test_an_outbox_takeover_is_of_the_row_kind_the_held_sender_held():
    ops = [{"type": "effect_claimed", "job": "j", "kind": "charge", "worker": "S1", "pid": 1,
            "t": 1.0},
           {"type": "effect_claimed", "job": "j", "kind": "notify", "worker": "S2", "pid": 2,
            "t": 1.1},
           {"type": "effect_claimed", "job": "j", "kind": "notify", "worker": "S2", "pid": 2,
            "t": 3.0}]
    assert aims.takeover(ops, "j", 2.0, "sender", 1) is None
    ops.append({"type": "effect_claimed", "job": "j", "kind": "charge", "worker": "S2",
                "pid": 2, "t": 3.5})
    assert aims.takeover(ops, "j", 2.0, "sender", 1).t == 3.5


# -- the report's sentences ----------------------------------------------------------------

def test_a_fired_aim_reads_as_a_sentence_and_an_unfired_one_is_listed():
    engine = ReferenceEngine()
    events = [
        {"src": "nemesis", "type": "hold", "aim": 1, "t": 10.0, "pid": 5, "point":
         "worker.after_call", "job": "doc-7", "target": "worker-0.1"},
        {"src": "nemesis", "type": "release", "aim": 1, "t": 11.3, "pid": 5, "point":
         "worker.after_call", "job": "doc-7", "target": "worker-0.1", "reason": "takeover",
         "by": "worker-1.2", "seen_t": 11.2},
        {"src": "nemesis", "type": "hold", "aim": 2, "t": 12.0, "pid": 6, "point":
         "worker.after_call", "job": "doc-8", "target": "worker-1.2"},
        {"src": "nemesis", "type": "release", "aim": 2, "t": 17.0, "pid": 6, "point":
         "worker.after_call", "job": "doc-8", "target": "worker-1.2", "reason": "deadline",
         "waited_for": "no other process's claim of what it held (doc-8)"}]
    section = aims.aim_section((Aim("role:after_call"), Aim("role:after_call"),
                                Aim("role:after_claim")), engine, events)
    first, second, third = section["aims"]
    assert first["evidence"] == ["held worker-0.1 at worker.after_call for doc-7 until "
                                 "worker-1.2 claimed it at +1.20 s"]
    assert "released at deadline (+5.00 s), condition not met" in second["evidence"][0]
    assert third["fired"] == 0
    assert section["aims_unfired"] == ["aim 3 (hold at role:after_claim until takeover)"]


# -- the probe's hold, in a real process ---------------------------------------------------

CHILD = """
import sys
from chaos import probe
probe.arm_from_env(["w.after_call", "w.after_claim"])
probe.point("w.after_claim", "doc-1")
probe.point("w.after_call", "doc-2")
probe.point("w.after_call", "doc-1")
print("went on", flush=True)
"""


def _wait(condition, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_the_probe_stops_its_process_at_the_aimed_point_until_continued(tmp_path):
    log = tmp_path / "holds.jsonl"
    env = {**os.environ, "PYTHONPATH": ROOT, "NINELIVES_HOLD_LOG": str(log),
           "NINELIVES_HOLD_AT": "w.after_call=doc-1", "NINELIVES_HOLD_WATCH": "w.after_claim"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert _wait(lambda: log.exists() and '"hold"' in log.read_text())
        assert _wait(lambda: _stopped_or_gone(child.pid))
        assert child.poll() is None  # stopped, not ended
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [(x["action"], x["point"], x["job"]) for x in lines] == [
            ("reach", "w.after_claim", "doc-1"), ("hold", "w.after_call", "doc-1")]
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on" and child.returncode == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


THREAD_CHILD = """
import socket, sys, threading
from chaos import probe
probe.arm_from_env(["w.heartbeat"])
a, b = socket.socketpair()

def beat():
    probe.point("w.heartbeat", "doc-1")
    open(sys.argv[1], "w").close()  # a heartbeat's write, which must wait for the continue
    b.send(b"x")

threading.Thread(target=beat).start()
a.recv(1)  # the main thread waits in a call, as a worker's does while its heartbeat beats
print("went on", flush=True)
"""


def test_a_hold_on_another_thread_stops_that_thread_at_the_point(tmp_path):
    """Held from a thread other than the main one (a heartbeat's), the thread that reached
    the point stops there: it does not run on into its write while the stop reaches it."""
    log, wrote = tmp_path / "holds.jsonl", tmp_path / "wrote"
    env = {**os.environ, "PYTHONPATH": ROOT, "NINELIVES_HOLD_LOG": str(log),
           "NINELIVES_HOLD_AT": "w.heartbeat"}
    child = subprocess.Popen([sys.executable, "-c", THREAD_CHILD, str(wrote)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert _wait(lambda: log.exists() and '"hold"' in log.read_text())
        assert _wait(lambda: _stopped_or_gone(child.pid))
        time.sleep(0.2)  # what the thread would write, it would have written by now
        assert child.poll() is None and not wrote.exists()
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on" and wrote.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_the_probe_is_disarmed_by_the_off_file(tmp_path):
    log = tmp_path / "holds.jsonl"
    open(aims.off_file(str(log)), "w").close()
    env = {**os.environ, "PYTHONPATH": ROOT, "NINELIVES_HOLD_LOG": str(log),
           "NINELIVES_HOLD_AT": "w.after_call"}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.stdout.strip() == "went on" and not log.exists()


# -- a real run's watch: which stop it holds, and when it lets it go ------------------------

class _Child:
    def __init__(self, proc, name, role="worker"):
        self.proc, self.name, self.role = proc, name, role

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None


class _Ops:
    """An engine whose operations the test writes."""

    name, capabilities = "ops", frozenset({"crash_points", "lease_expiry"})
    crashpoints = ("w.after_call", "w.after_claim")
    point_roles = {"after_call": ("w.after_call",), "after_claim": ("w.after_claim",)}
    pipeline = None

    def __init__(self):
        self.ops = []

    def operations(self, db):
        return list(self.ops)


def _watch(tmp_path, aim, engine):
    log = str(tmp_path / "holds.jsonl")
    events, children = [], []
    plan = type("Plan", (), {"seed": 1, "jobs": ["doc-1"]})()
    watch = AimWatch(aims.resolve((aim,), engine), engine, "db", log, lambda: children,
                     events.append, plan)
    return watch, log, events, children


def _held_child(tmp_path, log, env_at="w.after_call"):
    env = {**os.environ, "PYTHONPATH": ROOT, "NINELIVES_HOLD_LOG": log,
           "NINELIVES_HOLD_AT": env_at}
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                            text=True)


def test_the_watch_holds_until_takeover_then_continues(tmp_path):
    engine = _Ops()
    watch, log, events, children = _watch(tmp_path, Aim("role:after_call", deadline=20.0),
                                          engine)
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        assert _wait(lambda: any(e["type"] == "hold" for e in events))
        hold = next(e for e in events if e["type"] == "hold")
        assert hold["job"] == "doc-2" and hold["target"] == "worker-0.1"
        time.sleep(0.2)
        assert proc.poll() is None and _stopped_or_gone(proc.pid)  # still held
        engine.ops.append({"type": "claimed", "job": "doc-2", "worker": "B", "pid": 99,
                           "t": time.time()})
        assert _wait(lambda: any(e["type"] == "release" for e in events))
        release = next(e for e in events if e["type"] == "release")
        assert release["reason"] == "takeover" and release["worker"] == "B"
        # the aim is spent (times = 1): the child's next stop is continued at once
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "went on"
    finally:
        watch.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [e["type"] for e in events] == ["hold", "release"]


def test_a_release_is_stamped_before_the_process_goes_on(tmp_path, monkeypatch):
    """A process held again at once (the child stops at after_call twice) logs its second
    hold after the first release: the release's time is read before the SIGCONT, so the
    history's order pairs each hold with its own release (a release stamped after it, behind
    the next hold, left the checkers a pause of a few microseconds instead of the hold)."""
    import chaos.run.aim_watch as aim_watch
    sent, kill = [], os.kill

    def kill_and_stamp(pid, sig):
        if sig == signal.SIGCONT:
            sent.append(time.time())
        kill(pid, sig)
    monkeypatch.setattr(aim_watch.os, "kill", kill_and_stamp)
    watch, log, events, children = _watch(
        tmp_path, Aim("role:after_call", until=0.1, times=2, deadline=5.0), _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        out, _ = proc.communicate(timeout=15)
        assert out.strip() == "went on"
    finally:
        watch.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    holds = [e for e in events if e["type"] == "hold"]
    releases = [e for e in events if e["type"] == "release"]
    assert [h["job"] for h in holds] == ["doc-2", "doc-1"] and len(releases) == 2
    assert all(r["t"] <= min(t for t in sent if t >= h["t"]) for h, r in zip(holds, releases))
    assert releases[0]["t"] < holds[1]["t"]
    pauses = harness_windows(sorted(events, key=lambda e: e["t"]))["pauses"]
    assert [(a, b) for _, a, b in pauses] == [(h["t"], r["t"]) for h, r in zip(holds, releases)]


def test_a_hold_whose_condition_never_comes_ends_at_its_deadline(tmp_path):
    watch, log, events, children = _watch(
        tmp_path, Aim("role:after_call", until="point:role:after_claim", deadline=0.5), _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        out, _ = proc.communicate(timeout=15)
        assert out.strip() == "went on"
    finally:
        watch.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    release = next(e for e in events if e["type"] == "release")
    assert release["reason"] == "deadline" and release["held"] >= 0.5
    assert "no other process reached role:after_claim for doc-2" in release["waited_for"]


def test_heal_continues_a_held_process(tmp_path):
    watch, log, events, children = _watch(tmp_path, Aim("role:after_call", deadline=60.0),
                                          _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        assert _wait(lambda: any(e["type"] == "hold" for e in events))
        watch.heal()
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "went on"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert events[-1]["type"] == "release" and events[-1]["reason"] == "heal"
