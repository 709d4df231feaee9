"""Job slots in the simulation: `ninelives sim` runs the engine's own `engine.slots.Slots` (each
slot a thread of its process with its own store, one heartbeat, the group commit's leader and
followers waiting on the virtual clock). The reference engine holds every invariant with four
slots a process; slots of one process work at once and commit in groups; a SIGKILL ends every
slot of the process at once; a crash inside the group rolls its transaction back, one after
it leaves it committed; the same seed gives the same history; broken group commits (one that
writes a stale slot's transition, one that tells a slot another's outcome) and the catalog's
job-slot mutants are caught, and shrink."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter, defaultdict
from contextlib import contextmanager

import pytest

import engine.slots
from chaos.reference.inprocess.run import ReferenceSimulation
from chaos.reference.observer import pid_of
from chaos.spec.scenario import load_scenario
from chaos.sim import ReplayChoices, load_schedule, save_schedule, shrink, simulate
from chaos.sim.output import sim_command
from chaos.sim.scheduler import RUN
from chaos.sim.threads import SimCondition
from engine.slots import GroupCommit
from engine.store import LeaseLost
from test_sim import ZOMBIES, Broken, clean, first_failure, history_bytes, replaced, run

SLOTS = 4


def with_slots(scen, slots: int = SLOTS):
    """`scen` with `slots` job slots a worker process, as `--engine-set slots=N` gives it."""
    return dataclasses.replace(scen, engine={**scen.engine, "slots": slots},
                               engine_set={"slots": slots})


SMOKE = load_scenario("smoke", "smoke", None, {"slots": SLOTS})
ZOMBIE_SLOTS = with_slots(ZOMBIES)


@contextmanager
def groups_seen():
    """Every group the engine's GroupCommit commits or loses, in order: [pid, its writes, the
    audit's last row before it began, how many of its writes were not fenced out (None until
    its transaction ended)]. Observes, changes nothing."""
    seen: list[list] = []
    original = GroupCommit.__dict__["_run"]

    def _run(store, group):
        last = store.conn.execute("SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0]
        seen.append(entry := [store.sim_owner.process.pid, len(group), last, None])
        results = original.__func__(store, group)
        entry[3] = sum(1 for _, error in results if error is None)
        return results

    with replaced(GroupCommit, "_run", lambda _: staticmethod(_run)):
        yield seen


# -- the reference engine holds, with slots working at once ---------------------------------

def test_ninelives_sim_takes_engine_settings_and_gives_them_again():
    assert SMOKE.engine["slots"] == SLOTS and SMOKE.engine_set == {"slots": SLOTS}
    result = run(SMOKE, 1)
    assert result.snapshot["settings"]["slots"] == SLOTS  # what the checks are told
    assert f"--engine-set slots={SLOTS}" in sim_command(result)


def test_the_sim_command_runs_a_seed_with_the_setting_and_records_it(tmp_path, capsys):
    from chaos.commands.cli import main
    assert main(["sim", "smoke", "--profile", "smoke", "--seed", "2", "--engine-set",
                 f"slots={SLOTS}", "--out", str(tmp_path), "--quiet"]) == 0
    assert "PASS" in capsys.readouterr().out
    (folder,) = (tmp_path / "smoke").iterdir()
    recorded = json.loads((folder / "scenario.json").read_text())
    assert recorded["engine"]["slots"] == SLOTS and recorded["engine_set"] == {"slots": SLOTS}
    report = json.loads((folder / "report.json").read_text())
    assert report["run_command"].endswith(f"--engine-set slots={SLOTS}")
    assert main(["sim", "smoke", "--seed", "2", "--engine-set", "slots=0"]) == 2


def test_the_reference_engine_holds_every_invariant_with_four_slots_a_process():
    assert clean(SMOKE, range(1, 11)) == {}
    assert clean(ZOMBIE_SLOTS, range(1, 6)) == {}


def test_the_slots_of_one_process_work_at_once_and_commit_in_groups():
    with groups_seen() as groups:
        results = [run(SMOKE, seed) for seed in range(1, 4)]
    overlapping = 0
    for result in results:
        calls = defaultdict(list)
        for e in result.history:
            if e["src"] == "provider" and pid_of(e.get("worker")) is not None:
                calls[pid_of(e["worker"])].append(e)
        overlapping += sum(1 for mine in calls.values() for a in mine for b in mine
                           if a["job"] < b["job"] and a["t_start"] < b["t_end"]
                           and b["t_start"] < a["t_end"])
        workers = {e["worker"] for e in result.history if e["src"] == "provider"}
        assert any(w.endswith(f"/{SLOTS - 1}") for w in workers), workers
    assert overlapping > 0  # one process, several jobs' calls in flight at one virtual time
    sizes = Counter(n for _, n, _, _ in groups)
    assert sizes[1] and sum(k for n, k in sizes.items() if n > 1) > 0, sizes


def test_the_same_seed_gives_the_same_history_with_slots(tmp_path):
    first, second = run(SMOKE, 3), run(SMOKE, 3)
    assert history_bytes(first, tmp_path, "a") == history_bytes(second, tmp_path, "b")
    assert first.choices == second.choices and first.turns == second.turns
    replayed = run(SMOKE, 3, choices=ReplayChoices(first.choices))
    assert history_bytes(replayed, tmp_path, "c") == history_bytes(first, tmp_path, "a")
    assert history_bytes(run(SMOKE, 4), tmp_path, "d") != history_bytes(first, tmp_path, "a")


# -- a kill ends every slot; crashes inside the group ----------------------------------------

def test_a_kill_ends_every_slot_of_the_process_at_once():
    cut_several, killed = 0, 0
    for seed in range(1, 6):
        result = run(SMOKE, seed)
        deaths = {e["pid"]: e["t"] for e in result.history
                  if e["type"] == "exit" and e.get("signal") == "SIGKILL"}
        killed += len(deaths)
        for e in result.history:  # nothing of a dead process writes or calls after its death
            pid = pid_of(e.get("worker")) if e["src"] in ("engine", "provider") else None
            if pid in deaths:
                assert e["t"] <= deaths[pid], (seed, e)
        from chaos.checkers.cuts import kill_cuts
        cuts = kill_cuts(result.history, result.snapshot["pipeline"])
        cut_several += sum(1 for c in cuts if len(c["steps"]) > 1)
    assert killed and cut_several  # some death cut several slots' steps at once


@contextmanager
def crashes_seen():
    """(crash point, pid, the audit's last row when the process's death was handled), per
    worker process killed at a crash point."""
    seen: list[tuple[str, int, int]] = []
    original = ReferenceSimulation._process_ended  # the driver's

    def ended(self, process):
        points = [e["point"] for e in self.events
                  if e["type"] == "crashpoint" and e["pid"] == process.pid]
        if points:
            last = self.runner_store.conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0]
            seen.append((points[-1], process.pid, last))
        return original(self, process)

    ReferenceSimulation._process_ended = ended
    try:
        yield seen
    finally:
        del ReferenceSimulation._process_ended


def test_a_crash_inside_the_group_rolls_it_back_and_one_after_it_keeps_it_whole():
    """Before COMMIT (every row written): nothing of the group is in the database when its
    process has died; after COMMIT (no slot told yet): all of it is."""
    by_point: dict[str, list[int]] = defaultdict(list)
    with groups_seen() as groups, crashes_seen() as crashes:
        for seed in range(1, 21):
            groups.clear()
            crashes.clear()
            run(SMOKE, seed)
            for point, pid, last in crashes:
                if not point.startswith("worker.group."):
                    continue
                _, writes, before, kept = [g for g in groups if g[0] == pid][-1]
                if point == "worker.group.before_commit":
                    assert kept is None and last == before, (seed, writes, before, last)
                else:  # committed: its rows are there, unless every write was fenced out
                    assert kept is not None and (last > before) == (kept > 0), (
                        seed, writes, kept, before, last)
                by_point[point].append(writes)
    assert max(by_point["worker.group.before_commit"], default=0) > 1, by_point
    assert by_point["worker.group.after_commit"], by_point


# -- a broken group commit is caught, and shrinks ------------------------------------------

class StaleWritingGroup(GroupCommit):
    """Broken: a slot's write that its lease no longer fences is written again under the
    job's current token, so a zombie slot's transition commits in the group."""

    @staticmethod
    def _run(store, group):
        return GroupCommit._run(_Unfenced(store), group)


class _Unfenced:
    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _current(self, claim):
        token = self._store.conn.execute("SELECT lease_token FROM job WHERE id=?",
                                         (claim.job_id,)).fetchone()[0]
        return dataclasses.replace(claim, lease_token=token)

    def complete(self, claim, *args, **kwargs):
        try:
            return self._store.complete(claim, *args, **kwargs)
        except LeaseLost:
            return self._store.complete(self._current(claim), *args, **kwargs)

    def fail(self, claim, *args, **kwargs):
        try:
            return self._store.fail(claim, *args, **kwargs)
        except LeaseLost:
            return self._store.fail(self._current(claim), *args, **kwargs)


STALE_GROUP = Broken("stale-writing-group",
                     (engine.slots, "GroupCommit", lambda _: StaleWritingGroup))


def test_a_group_commit_that_writes_a_stale_slots_transition_is_caught_and_shrinks(tmp_path):
    failing = first_failure(ZOMBIE_SLOTS, STALE_GROUP, "fenced-writes", seeds=range(1, 21))
    assert engine.slots.GroupCommit is GroupCommit  # the patch is the run's alone
    target = next(sig for sig in failing.signature() if sig[0] == "fenced-writes")
    shrunk = shrink(failing, target, budget=60)
    small = shrunk.result
    assert target in small.signature() and len(small.choices) < len(failing.choices)
    path = save_schedule(str(tmp_path / "counterexample.json"), small, shrunk.target)
    spec, choices, _ = load_schedule(path, STALE_GROUP)
    assert spec.scenario.engine["slots"] == SLOTS
    again = simulate(spec, ReplayChoices(choices))
    assert history_bytes(again, tmp_path, "again") == history_bytes(small, tmp_path, "small")


class CrossedGroup(GroupCommit):
    """Broken: each slot of a group is told the next slot's outcome (its claim of the next
    step, or its LeaseLost), so a slot works on under another slot's lease."""

    @staticmethod
    def _run(store, group):
        results = GroupCommit._run(store, group)
        return results[1:] + results[:1]


CROSSED_GROUP = Broken("crossed-group", (engine.slots, "GroupCommit", lambda _: CrossedGroup))


def test_a_group_commit_that_tells_a_slot_another_slots_outcome_is_caught():
    failing = first_failure(SMOKE, CROSSED_GROUP, "fenced-writes", seeds=range(1, 11))
    assert clean(SMOKE, [failing.spec.seed]) == {}


@pytest.mark.parametrize("name", ["group_stale_fails_all", "heartbeat_one_slot"])
def test_the_catalogs_job_slot_mutants_are_caught_in_simulation_where_the_reference_holds(name):
    from chaos.reference.mutants.catalog import CATALOG, ENGINES
    mutant = next(m for m in CATALOG if m.name == name)
    scen = load_scenario(mutant.scenario, mutant.profile)
    assert scen.engine.get("slots", 1) > 1
    failing = first_failure(scen, ENGINES[name], mutant.expect[0], seeds=range(1, 11))
    assert clean(scen, [failing.spec.seed]) == {}


# -- a finishing write on a lease the heartbeat renewed --------------------------------------

#: Slots whose calls outlive their claim's lease (the heartbeat renews it), finishing while
#: the write lock is held past the busy timeout. Seeds 7 and 13 gave a paid-for answer up
#: at the first busy lock while the renewed lease held, before the fix (the seeds a schedule
#: reaches it at move when the engine's points do: its heartbeat passes them before a batch).
RENEWALS = load_scenario("slot-renewals", "smoke")
RENEWAL_SEEDS = (7, 13)


def finished_on_renewals(result) -> list[tuple[str, str]]:
    """(job, step) of each answer its slot committed after the end of the lease its claim
    gave it, a busy timeout or more after the answer came: the window, where the lock kept
    a slot waiting on a lease only its heartbeat's renewals still held."""
    busy = RENEWALS.engine["busy_timeout"]
    claims = [e for e in result.history if e["src"] == "engine" and e["type"] == "claimed"]
    memos = {(e["job"], e["step"], e["worker"]): e["t"] for e in result.history
             if e["src"] == "engine" and e["type"] == "memo" and e.get("op") != "delete"}
    found = []
    for call in (e for e in result.history if e["src"] == "provider" and e["type"] == "call"
                 and e.get("status") == 200):
        own = [c for c in claims if c["job"] == call["job"] and c["worker"] == call["worker"]
               and c["t"] <= call["t_start"]]
        committed = memos.get((call["job"], call["step"], call["worker"]))
        if own and committed is not None and call["t_end"] > own[-1]["lease_until"] \
                and committed >= call["t_end"] + busy:
            found.append((call["job"], call["step"]))
    return found


def test_a_slot_keeps_trying_its_finishing_write_for_as_long_as_its_renewed_lease_holds():
    results = [run(RENEWALS, seed) for seed in RENEWAL_SEEDS]
    assert [r.signature() for r in results] == [[], []]
    assert all(finished_on_renewals(r) for r in results)


def test_a_slot_that_judges_its_lease_by_its_claim_alone_is_caught_giving_up_a_paid_answer():
    """The engine before the fix: the finishing write's deadline is the claim's lease end,
    whatever the heartbeat renewed since."""
    from engine.worker import Worker

    def by_claim(original):
        def _write(self, write, claim, spend, watch=None):
            return original(self, write, claim, spend)
        return _write

    with replaced(Worker, "_write", by_claim):
        results = [run(RENEWALS, seed) for seed in RENEWAL_SEEDS]
    for result in results:
        assert ("cost-accounted", "result-discarded") in result.signature()


# -- the condition the group waits on ------------------------------------------------------

def test_a_condition_wait_is_a_scheduling_point_and_a_notify_wakes_the_oldest_waiter():
    from test_sim import Script, actor, scheduler
    # the fifth pick, just after the notify, runs the woken thread before the notifier
    script = Script(*[(0, RUN)] * 4, (1, RUN))
    sched = scheduler(script)
    cond, order = SimCondition(sched), []

    def waiter(name):
        def body():
            with cond:
                order.append(f"{name} waits")
                assert cond.wait() is True
                order.append(f"{name} woke")
        return body

    def notifier():
        sched.sleep(1.0)
        with cond:
            order.append("notify")
            cond.notify()
        order.append("notifier goes on")
        sched.sleep(1.0)
        with cond:
            cond.notify_all()

    for name, body in (("a", waiter("a")), ("b", waiter("b")), ("n", notifier)):
        actor(sched, name, body)
    sched.run(max_turns=100)
    assert script.seen[4] == ["n", "a"]  # the notify passed the turn with the lock let go
    assert order == ["a waits", "b waits", "notify", "a woke", "notifier goes on", "b woke"]
    assert all(not a.alive for a in sched.actors)
