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
from chaos.spec.aim import Aim
from chaos.run.aim_watch import AimWatch, _stopped_or_gone
from chaos.checkers.ops import harness_windows
from chaos.spec.plan import FaultPlan
from chaos.reference.adapter import ReferenceEngine
from chaos.spec.scenario import ScenarioError, check_aims, load_scenario
from timed import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw, says", [
    ({"until": "takeover"}, "'aim[1].point' is required"),
    ({"point": "role:nope"}, "names no role"),
    ({"point": "role:after_call", "action": "crash"}, "'aim[1].action' must be"),
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
    env = aims.probe_env(targets, plan, "/tmp/holds.jsonl", engine)
    job = plan.aimed_job(1)
    assert job == plan.aimed_job(1) and job in plan.jobs  # a pure function of the seed
    assert env["NINELIVES_HOLD_AT"] == f"worker.after_call={job}/2"
    assert env["NINELIVES_HOLD_WATCH"] == "worker.after_claim"
    # the other threads of a held process wait at the points outside any transaction only
    pause = env["NINELIVES_HOLD_PAUSE"].split(",")
    assert {"worker.heartbeat", "worker.after_claim", "worker.after_call",
            "sender.after_send"} <= set(pause)
    assert not {"claim.before_commit", "worker.before_commit", "worker.fail.before_commit",
                "sender.before_commit", "worker.group.before_commit"} & set(pause)


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


# -- a real run's watch: which hold it keeps, and when it lets it go -------------------------

CHILD = """
import sys
from chaos import probe
probe.arm_from_env(["w.after_call", "w.after_claim"])
probe.point("w.after_claim", "doc-1")
probe.point("w.after_call", "doc-2")
probe.point("w.after_call", "doc-1")
print("went on", flush=True)
"""


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
        assert wait_until(lambda: any(e["type"] == "hold" for e in events))
        hold = next(e for e in events if e["type"] == "hold")
        assert hold["job"] == "doc-2" and hold["target"] == "worker-0.1"
        time.sleep(0.2)
        assert proc.poll() is None and not _stopped_or_gone(proc.pid)  # held, not stopped
        engine.ops.append({"type": "claimed", "job": "doc-2", "worker": "B", "pid": 99,
                           "t": time.time()})
        assert wait_until(lambda: any(e["type"] == "release" for e in events))
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


def went_on(watch, proc, also=lambda: True) -> None:
    """Start `watch`, and see the held child `proc` go on to its end ("went on"), `also()`
    holding then; the watch healed and the child ended whatever happens."""
    watch.start()
    try:
        out, _ = proc.communicate(timeout=15)
        assert out.strip() == "went on"
        assert also()
    finally:
        watch.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()



def test_a_release_is_stamped_before_the_process_goes_on(tmp_path, monkeypatch):
    """A process held again at once (the child holds at after_call twice) logs its second
    hold after the first release: the release's time is read before its release file (or,
    every aim spent, the .off file) is made, so the history's order pairs each hold with its
    own release (a release stamped after it, behind the next hold, left the checkers a pause
    of a few microseconds instead of the hold)."""
    sent = []

    def stamped(make):
        def name(*args):
            sent.append(time.time())
            return make(*args)
        return name
    monkeypatch.setattr(aims, "release_file", stamped(aims.release_file))
    monkeypatch.setattr(aims, "off_file", stamped(aims.off_file))
    watch, log, events, children = _watch(
        tmp_path, Aim("role:after_call", until=0.1, times=2, deadline=5.0), _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    went_on(watch, proc)
    holds = [e for e in events if e["type"] == "hold"]
    releases = [e for e in events if e["type"] == "release"]
    assert [h["job"] for h in holds] == ["doc-2", "doc-1"] and len(releases) == 2
    assert all(r["t"] <= min(t for t in sent if t >= h["t"]) for h, r in zip(holds, releases))
    assert releases[0]["t"] < holds[1]["t"]
    pauses = harness_windows(sorted(events, key=lambda e: e["t"]))["pauses"]
    assert [(a, b) for _, a, b in pauses] == [(h["t"], r["t"]) for h, r in zip(holds, releases)]


def test_once_every_aim_is_spent_the_probes_are_disarmed(tmp_path):
    """The child passes its armed point twice; the aim holds once (times = 1), and then no
    pass waits for the watch any more: it disarms the probes."""
    watch, log, events, children = _watch(tmp_path, Aim("role:after_call", until=0.1), _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    went_on(watch, proc, lambda: os.path.exists(aims.off_file(log)))
    with open(log, encoding="utf-8") as fh:
        assert [json.loads(x)["action"] for x in fh] == ["hold"]


def test_a_hold_whose_condition_never_comes_ends_at_its_deadline(tmp_path):
    watch, log, events, children = _watch(
        tmp_path, Aim("role:after_call", until="point:role:after_claim", deadline=0.5), _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    went_on(watch, proc)
    release = next(e for e in events if e["type"] == "release")
    assert release["reason"] == "deadline" and release["held"] >= 0.5
    assert "no other process reached role:after_claim for doc-2" in release["waited_for"]


LEGACY = """
import json, os, signal, sys, time
line = {"t": time.time(), "pid": os.getpid(), "point": "w.after_call", "job": "doc-1",
        "action": "hold"}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps(line) + "\\n")
os.kill(os.getpid(), signal.SIGSTOP)
print("went on", flush=True)
"""


def test_a_probe_that_stops_its_process_whole_is_continued(tmp_path):
    """A hold line without a hold number comes from a probe copied before holds blocked a
    thread: it stopped its process (SIGSTOP), and the watch continues it (SIGCONT)."""
    watch, log, events, children = _watch(tmp_path, Aim("role:after_call", until=0.1),
                                          _Ops())
    proc = subprocess.Popen([sys.executable, "-c", LEGACY, log], stdout=subprocess.PIPE,
                            text=True)
    children.append(_Child(proc, "worker-0.1"))
    went_on(watch, proc)
    assert [(e["type"], e.get("reason")) for e in events] == [("hold", None),
                                                             ("release", "seconds")]


def test_heal_continues_a_held_process(tmp_path):
    watch, log, events, children = _watch(tmp_path, Aim("role:after_call", deadline=60.0),
                                          _Ops())
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        assert wait_until(lambda: any(e["type"] == "hold" for e in events))
        watch.heal()
        out, _ = proc.communicate(timeout=10)
        assert out.strip() == "went on"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert events[-1]["type"] == "release" and events[-1]["reason"] == "heal"


# -- an aimed kill -------------------------------------------------------------------------

def test_the_step_after_a_commit_is_the_one_that_committed_not_the_one_it_moved_on_to():
    """The commit that completes verify also claims deliver under the same lease: at a point
    right after that commit the job's last claim names deliver, but the step that committed
    there is verify."""
    pipeline = ReferenceEngine().pipeline
    ops = [{"type": "claimed", "job": "j", "step": "verify", "t": 1.0},
           {"type": "state", "job": "j", "from": "verifying", "to": "verified", "t": 2.0},
           {"type": "claimed", "job": "j", "step": "deliver", "continued": True, "t": 2.0}]
    after_commit, after_call = Aim("role:after_commit", action="kill"), Aim("role:after_call")
    assert aims.step_at(after_commit, ops, "j", pipeline) == "verify"
    assert aims.step_at(after_call, ops, "j", pipeline) == "deliver"
    ops.append({"type": "state", "job": "j", "from": "delivering", "to": "delivered", "t": 3.0})
    assert aims.step_at(after_commit, ops, "j", pipeline) == "deliver"
    assert aims.step_at(after_commit, ops, "k", pipeline) is None


def test_an_aimed_kill_kills_the_process_where_it_holds(tmp_path):
    aim = Aim("role:after_call", action="kill")
    assert aim.label(1) == "aim 1 (kill at role:after_call)"
    killed = []
    log = str(tmp_path / "holds.jsonl")
    events, children = [], []
    plan = type("Plan", (), {"seed": 1, "jobs": ["doc-1"]})()

    def kill(child):
        killed.append(child.name)
        child.proc.kill()
    watch = AimWatch(aims.resolve((aim,), _Ops()), _Ops(), "db", log, lambda: children,
                     events.append, plan, kill)
    proc = _held_child(tmp_path, log)
    children.append(_Child(proc, "worker-0.1"))
    watch.start()
    try:
        out, _ = proc.communicate(timeout=15)
        assert out == "" and proc.returncode == -signal.SIGKILL
    finally:
        watch.heal()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed == ["worker-0.1"]
    assert [(e["type"], e["aim"], e["point"], e["job"]) for e in events] == [
        ("kill", 1, "w.after_call", "doc-2")]
    section = aims.aim_section((aim,), _Ops(), events)
    assert section["aims"][0]["evidence"] == ["killed worker-0.1 at w.after_call for doc-2"]
    assert section["aims_unfired"] == []


# -- the catalog's aimed scenarios, in simulation -------------------------------------------

def _aimed(result, kind):
    return [e for e in result.history if e.get("src") == "nemesis" and e.get("type") == kind
            and "aim" in e]


@pytest.mark.parametrize("seed", (1, 2, 3))
def test_torn_completion_kills_a_worker_right_after_a_jobs_last_commit(seed):
    """Where a completion that queues its effects apart loses them: after the commit that
    delivered the job, before anything else."""
    from test_sim import run
    result = run(load_scenario("mutants/torn-completion", "smoke"), seed)
    kills = _aimed(result, "kill")
    assert len(kills) == 3 and result.signature() == []
    for kill in kills:
        states = [e for e in result.history if e.get("src") == "engine" and e["type"] == "state"
                  and e.get("job") == kill["job"] and e["t"] <= kill["t"]]
        assert states[-1]["to"] == "delivered"


@pytest.mark.parametrize("seed", (1, 2, 3))
def test_memo_hits_holds_a_new_owner_until_a_third_takes_the_job_over(seed):
    """The zombie's memo commits while the worker that took its job over stands held after
    its claim, so whoever goes on with the step first finds a memo it did not write."""
    from test_sim import run
    result = run(load_scenario("mutants/memo-hits", "smoke"), seed)
    released = [(e["aim"], e["reason"]) for e in _aimed(result, "release")]
    assert (1, "takeover") in released and (2, "takeover") in released
    assert result.signature() == []
