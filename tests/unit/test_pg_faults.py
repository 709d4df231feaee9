"""PostgreSQL's statement timeout and row lock faults: drawn after every other fault (other
scenarios keep their plans), refused where there is no PostgreSQL (SQLite, the simulation)
with exit 2 naming the field; the statement timeout applied by the nemesis as a held lock
and cancelled statements, counted only when a statement was cancelled, its held lock a
window the checks' excuses see; the row lock a row claims pass over and writes wait on."""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import Counter
from types import SimpleNamespace

import pytest

from chaos.checkers.ops import harness_windows, lock_windows
from chaos.run.nemesis import STATEMENT_WAIT, Nemesis
from chaos.spec.plan import make_plan
from chaos.reference import REFERENCE
from chaos.reports.fired import not_applicable, prevented, unfired
from chaos.spec.scenario import POSTGRES_FAULTS, RATES, SERVER_FAULTS, ScenarioError, load_scenario

PIPELINE = REFERENCE.pipeline


def postgres_faults(**faults):
    s = load_scenario("postgres-faults", "ci")
    return dataclasses.replace(s, faults=dataclasses.replace(s.faults, **faults))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_statement_timeouts_are_drawn_after_every_other_fault(seed):
    without = make_plan(postgres_faults(statement_timeout=0.0, row_lock=0.0), seed, PIPELINE)
    with_ = make_plan(postgres_faults(statement_timeout=0.5, row_lock=0.0), seed, PIPELINE)
    others = [e for e in with_.timeline if e["fault"] != "statement_timeout"]
    assert others == without.timeline  # the other faults keep their times and targets
    assert dataclasses.replace(with_, timeline=[]) == dataclasses.replace(without, timeline=[])
    timeouts = [e for e in with_.timeline if e["fault"] == "statement_timeout"]
    assert timeouts and all(0 <= e["at"] < with_chaos(with_) for e in timeouts)


def with_chaos(plan) -> float:
    return load_scenario(plan.scenario, plan.profile).run.chaos


def test_statement_timeout_is_a_server_fault_scaled_as_a_rate():
    assert "statement_timeout" in SERVER_FAULTS and "statement_timeout" in RATES
    assert SERVER_FAULTS[-1] == "statement_timeout"  # drawn last
    ci, soak = load_scenario("postgres-faults", "ci"), load_scenario("postgres-faults", "soak")
    assert ci.faults.statement_timeout > 0
    assert soak.faults.statement_timeout == ci.faults.statement_timeout  # rates x1
    assert soak.faults.statement_timeout_seconds == ci.faults.statement_timeout_seconds


def scenario_file(tmp_path, faults: str) -> str:
    path = tmp_path / "timeouts.toml"
    path.write_text(f'name = "timeouts"\n[run]\njobs = 4\nchaos = 2.0\n[faults]\n{faults}\n')
    return str(path)


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_a_timeout_of_zero_or_less_is_refused_naming_the_field(tmp_path, seconds):
    path = scenario_file(tmp_path, f"statement_timeout = 1.0\nstatement_timeout_seconds = "
                                   f"{seconds}")
    with pytest.raises(ScenarioError, match="faults.statement_timeout_seconds"):
        load_scenario(path)


def test_a_negative_statement_timeout_rate_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="faults.statement_timeout' is a rate"):
        load_scenario(scenario_file(tmp_path, "statement_timeout = -0.5"))


def test_on_sqlite_a_statement_timeout_is_exit_2_naming_the_field(tmp_path, capsys):
    from chaos.commands.cli import main
    out = tmp_path / "out"
    code = main(["run", scenario_file(tmp_path, "statement_timeout = 1.0"), "--out", str(out),
                 "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "faults.statement_timeout needs --backend postgres on a server the run starts" in err


def test_the_simulation_refuses_a_statement_timeout(tmp_path, capsys):
    from chaos.commands.cli import main
    out = tmp_path / "out"
    code = main(["sim", scenario_file(tmp_path, "statement_timeout = 1.0"), "--seed", "1",
                 "--out", str(out), "--quiet"])
    assert code == 2
    assert "faults.statement_timeout cancels statements on a real PostgreSQL server" in \
        capsys.readouterr().err
    assert not out.exists() or not list(out.iterdir())


# -- the nemesis ----------------------------------------------------------------------------

class FakeServer:
    """cancel_statements answers what it was told to; it records whether the lock was held."""

    def __init__(self, engine, cancels: list[dict]) -> None:
        self.engine, self.cancels, self.asked = engine, cancels, []

    def cancel_statements(self, pids, running_for, within):
        self.asked.append((sorted(pids()), running_for, within, self.engine.held))
        return self.cancels


class FakeEngine:
    held = False

    @contextlib.contextmanager
    def hold_write_lock(self, db):
        self.held = True
        try:
            yield
        finally:
            self.held = False


def nemesis_with(cancels: list[dict]):
    engine = FakeEngine()
    server = FakeServer(engine, cancels)
    children = [SimpleNamespace(name="worker-0.1", role="worker", pid=4242),
                SimpleNamespace(name="sender-0.2", role="sender", pid=4243)]
    supervisor = SimpleNamespace(alive=lambda: children)
    events: list[dict] = []
    scenario = postgres_faults(statement_timeout=1.0, statement_timeout_seconds=0.3)
    plan = make_plan(scenario, 1, PIPELINE)
    nemesis = Nemesis(scenario, plan, engine, "db", supervisor, None, events.append, server)
    return nemesis, server, events


def test_the_nemesis_cancels_statements_kept_waiting_by_a_held_lock():
    nemesis, server, events = nemesis_with([{"backend": 77, "state": "active", "client": 4242},
                                            {"backend": 78, "state": "active", "client": 4243}])
    nemesis._statement_timeout({"pick": 0})
    # asked, while the lock was held, about every engine process's statements
    assert server.asked == [([4242, 4243], 0.3, 0.3 + STATEMENT_WAIT, True)]
    assert [e["type"] for e in events] == ["statement_timeout", "statement_cancelled",
                                           "statement_cancelled", "statement_timeout_end"]
    assert all(e["src"] == "nemesis" for e in events)
    assert [(e["target"], e["pid"], e["backend"]) for e in events[1:3]] == [
        ("worker-0.1", 4242, 77), ("sender-0.2", 4243, 78)]
    assert events[0]["seconds"] == 0.3 and events[-1]["cancelled"] == 2
    assert nemesis.applied == Counter({"statement_timeout": 1})


def test_a_statement_timeout_that_cancelled_nothing_is_not_counted():
    nemesis, _, events = nemesis_with([])
    nemesis._statement_timeout({"pick": 0})
    assert [e["type"] for e in events] == ["statement_timeout", "statement_timeout_end"]
    assert not nemesis.applied


def test_the_held_lock_closes_its_window_when_the_cancel_fails():
    nemesis, server, events = nemesis_with([])
    server.cancel_statements = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("down"))
    nemesis._apply({"fault": "statement_timeout", "pick": 0})
    assert [e["type"] for e in events] == ["statement_timeout", "statement_timeout_end",
                                           "error"]


def test_a_crash_waits_for_a_read_holding_the_server_up():
    nemesis, _, _ = nemesis_with([])
    crashed = threading.Event()
    nemesis.server.crash = crashed.set
    nemesis.server.restart = lambda: None
    with nemesis.server_up():
        thread = threading.Thread(target=nemesis._server_restart, args=({},))
        thread.start()
        assert not crashed.wait(0.2)
    thread.join(10)
    assert crashed.is_set()


# -- the report and the checks' excuses -----------------------------------------------------

def test_an_unfired_statement_timeout_is_named_and_needs_a_write_lock():
    scenario = postgres_faults(statement_timeout=1.0)
    assert "statement_timeout" in unfired(scenario, {"server_restart": 1, "connection_kill": 1,
                                                     "kill": 1})
    no_lock = SimpleNamespace(capabilities=frozenset(REFERENCE.capabilities) - {"write_lock"},
                              pipeline=PIPELINE)
    assert "statement_timeout" in not_applicable(scenario, no_lock)


def nemesis_event(t: float, type_: str) -> dict:
    return {"t": t, "src": "nemesis", "type": type_}


def test_a_statement_timeouts_held_lock_is_an_excused_window():
    history = [nemesis_event(1.0, "statement_timeout"), nemesis_event(1.4, "statement_cancelled"),
               nemesis_event(1.5, "statement_timeout_end")]
    assert harness_windows(history)["locks"] == [(1.0, 1.5)]


def test_overlapping_lock_windows_of_any_kinds_are_covered_whole():
    history = [nemesis_event(1.0, "contention"), nemesis_event(1.2, "server_crash"),
               nemesis_event(1.5, "contention_end"), nemesis_event(2.0, "server_restart"),
               # a second hold logs its start before the first logs its end
               nemesis_event(3.0, "contention"), nemesis_event(3.5, "contention"),
               nemesis_event(3.51, "contention_end"), nemesis_event(4.0, "contention_end"),
               nemesis_event(5.0, "statement_timeout")]
    assert lock_windows(history) == [(1.0, 2.0), (3.0, 4.0), (5.0, float("inf"))]


def test_an_end_without_its_start_opens_nothing():
    history = [nemesis_event(1.0, "contention_end"), nemesis_event(2.0, "statement_timeout"),
               nemesis_event(2.5, "server_restart"), nemesis_event(3.0, "statement_timeout_end")]
    assert lock_windows(history) == [(2.0, 3.0)]


# -- on a real server -----------------------------------------------------------------------

def test_the_server_cancels_a_statement_past_the_timeout_with_sqlstate_57014(pg_server):
    import os

    import psycopg
    url = pg_server.create_database(empty=True)
    errors: list = []

    def long_statement() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            try:
                conn.execute("SELECT pg_sleep(20)")
            except psycopg.Error as exc:
                errors.append(exc.sqlstate)

    thread = threading.Thread(target=long_statement)
    thread.start()
    try:
        cancelled = pg_server.cancel_statements(lambda: [os.getpid()], running_for=0.3,
                                                within=10.0)
    finally:
        thread.join(30)
    assert [c["client"] for c in cancelled] == [os.getpid()]
    assert errors == ["57014"]  # what a statement_timeout raises


def test_nothing_is_cancelled_before_a_statement_has_run_the_timeout(pg_server):
    import os
    assert pg_server.cancel_statements(lambda: [os.getpid()], running_for=5.0,
                                       within=0.2) == []


# -- a row held locked ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2])
def test_row_locks_are_drawn_after_every_other_fault(seed):
    without = make_plan(postgres_faults(row_lock=0.0), seed, PIPELINE)
    with_ = make_plan(postgres_faults(row_lock=0.5), seed, PIPELINE)
    assert [e for e in with_.timeline if e["fault"] != "row_lock"] == without.timeline
    assert any(e["fault"] == "row_lock" for e in with_.timeline)
    assert list(POSTGRES_FAULTS)[-1] == "row_lock" and "row_lock" not in SERVER_FAULTS


def test_on_sqlite_a_row_lock_is_exit_2_naming_the_field(tmp_path, capsys):
    from chaos.commands.cli import main
    code = main(["run", scenario_file(tmp_path, "row_lock = 1.0"), "--out",
                 str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert "faults.row_lock needs --backend postgres" in capsys.readouterr().err


def test_the_simulation_refuses_a_row_lock(tmp_path, capsys):
    from chaos.commands.cli import main
    code = main(["sim", scenario_file(tmp_path, "row_lock = 1.0"), "--seed", "1", "--out",
                 str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert "faults.row_lock holds a row lock on a real PostgreSQL server" in \
        capsys.readouterr().err


class RowLocking(FakeEngine):
    def __init__(self, target) -> None:
        self.target = target

    @contextlib.contextmanager
    def hold_row_lock(self, db, pick):
        self.held = True
        try:
            yield self.target
        finally:
            self.held = False


def row_nemesis(target):
    events: list[dict] = []
    scenario = postgres_faults(row_lock=1.0, row_lock_seconds=0.05)
    nemesis = Nemesis(scenario, make_plan(scenario, 1, PIPELINE), RowLocking(target), "db",
                      SimpleNamespace(alive=lambda: []), None, events.append, None)
    return nemesis, events


def test_the_nemesis_holds_a_row_and_closes_its_window():
    target = {"table": "job", "row": "doc-1", "job": "doc-1"}
    nemesis, events = row_nemesis(target)
    nemesis._row_lock({"pick": 3})
    assert [e["type"] for e in events] == ["row_lock", "row_lock_end"]
    assert all(e["row"] == "doc-1" and e["table"] == "job" for e in events)
    assert events[1]["t"] - events[0]["t"] >= 0.05
    assert nemesis.applied == Counter({"row_lock": 1})


@pytest.mark.parametrize("fault", ["row_lock", "statement_timeout", "connection_kill"])
def test_a_fault_made_through_the_server_waits_out_a_restart_that_has_it_down(fault):
    # Four row locks of a loaded run fell into restarts' down times, each met "connection
    # refused", and the run ended with none applied (exit 2).
    nemesis, _ = row_nemesis({"table": "job", "row": "doc-1", "job": "doc-1"})
    applied = threading.Event()
    setattr(nemesis, f"_{fault}", lambda event: applied.set())
    with nemesis.server_up():  # what a restart holds while the server is down
        thread = threading.Thread(target=nemesis._apply, args=({"fault": fault, "pick": 3},))
        thread.start()
        assert not applied.wait(0.2)
    thread.join(10)
    assert applied.is_set()


def test_nothing_left_to_lock_is_recorded_and_excuses_the_unfired_fault():
    nemesis, events = row_nemesis(None)
    nemesis._row_lock({"pick": 3})
    assert [e["type"] for e in events] == ["row_lock_idle"] and not nemesis.applied
    plan = make_plan(postgres_faults(row_lock=1.0), 1, PIPELINE)
    assert "settled" in prevented(plan, events, ["row_lock"])["row_lock"]
    assert prevented(plan, [], ["row_lock"]) == {}


def test_a_row_lock_needs_the_adapters_control():
    scenario = postgres_faults(row_lock=1.0)
    bare = SimpleNamespace(capabilities=frozenset(REFERENCE.capabilities), pipeline=PIPELINE)
    assert "row_lock" in not_applicable(scenario, bare)
    assert "row_lock" not in not_applicable(scenario, REFERENCE)


def test_the_reference_holds_a_jobs_row_that_claims_pass_over_and_writes_wait_on(pg_server):
    import psycopg
    url = pg_server.create_database()
    REFERENCE.install(url)
    for job_id in ("doc-1", "doc-2"):
        REFERENCE.submit(url, job_id, {"title": job_id})
    with REFERENCE.hold_row_lock(url, pick=1) as target:
        assert target == {"table": "job", "row": "doc-2", "job": "doc-2"}  # still to run
        with psycopg.connect(url, autocommit=True) as conn:
            free = conn.execute("SELECT id FROM job FOR UPDATE SKIP LOCKED").fetchall()
            assert free == [("doc-1",)]
            conn.execute("SET lock_timeout = '100ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):  # SQLSTATE 55P03
                conn.execute("UPDATE job SET attempts = attempts WHERE id = 'doc-2'")
    with pytest.raises(ValueError, match="SQLite has no row locks"):
        REFERENCE.hold_row_lock("engine.db", 0)
