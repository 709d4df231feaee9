"""Where a run's engine database lives (chaos.run.backends): the flags checked at once and named,
a password kept out of every target and record, a database made per run, nothing left when
a server cannot be had; and what a store's clock changes in the run's expectations."""
from __future__ import annotations

import dataclasses
import os

import psycopg
import pytest

from chaos.run import pgserver
from chaos.run.backends import (STARTED_FOR_COMMAND, Backend, BackendError, backend_for,
                            check_backend, command_backend, database_name, redacted, run_database,
                            saved_target, split_password, with_dbname)
from chaos.contract import EngineSettings
from chaos.run.expect import expectations
from chaos.reference import REFERENCE
from chaos.reference.mutants import catalog
from chaos.reference.mutants.catalog import BY_NAME, ENGINES, ON_POSTGRES, MutantEngine
from chaos.spec.scenario import load_scenario


@pytest.mark.parametrize("name, url, words", [
    ("mysql", None, ["--backend", "sqlite, postgres", "mysql"]),
    ("sqlite", "postgresql://u@h/db", ["--pg-url needs --backend postgres"]),
    ("postgres", "mysql://u:pw@h/db", ["--pg-url", "postgresql://", "mysql://u:***@h/db"]),
    ("postgres", "postgresql:///", ["--pg-url", "postgresql://user@host"]),
])
def test_bad_flags_fail_at_construction_naming_the_flag(name, url, words):
    with pytest.raises(BackendError) as err:
        Backend(name, url)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "pw" not in str(err.value)


def test_a_password_is_split_off_and_redacted_wherever_it_is_written():
    assert split_password("postgresql://bob:s3cr%40t@127.0.0.1:5432/db?sslmode=disable") == (
        "postgresql://bob@127.0.0.1:5432/db?sslmode=disable", "s3cr%40t")
    assert split_password("postgresql://bob@127.0.0.1/db?password=pw&application_name=x") == (
        "postgresql://bob@127.0.0.1/db?application_name=x", "pw")
    assert split_password("postgresql://127.0.0.1/db") == ("postgresql://127.0.0.1/db", None)
    assert redacted("postgresql://bob:pw@h:1/db?password=pw2") == \
        "postgresql://bob:***@h:1/db?password=***"
    assert with_dbname("postgresql://bob@h:1/postgres?dbname=x&sslmode=disable", "run_1") == \
        "postgresql://bob@h:1/run_1?sslmode=disable"


def test_a_run_database_name_is_a_plain_identifier_within_63_bytes():
    assert database_name("kill-storm", "20261202T010203000001", 7) == \
        "ninelives_kill_storm_20261202t010203000001_seed7"
    assert len(database_name("x" * 80, "20261202T010203000001", 1)) == 63


def test_every_mutant_runs_on_postgres_but_those_of_sqlite_alone_which_are_refused_saying_why(
        monkeypatch):
    check_backend(REFERENCE, Backend("postgres"))
    for name, engine in ENGINES.items():  # each removes its mechanism from PostgreSQL's too
        if name in catalog.SQLITE_ONLY:
            continue
        check_backend(engine, Backend("postgres"))
        assert engine.backends == ("sqlite", "postgres")
    # group commit is SQLite's alone, and so is reusing a lost row's id: their mutants are
    # refused on PostgreSQL, saying why
    assert ON_POSTGRES == set(ENGINES) - {"group_stale_fails_all", "key_from_row_id"}
    assert set(catalog.SQLITE_ONLY) == {"group_stale_fails_all", "key_from_row_id"}
    with pytest.raises(BackendError, match=r"runs on sqlite only \(group commit is SQLite's"):
        check_backend(ENGINES["group_stale_fails_all"], Backend("postgres"))
    # a mechanism with no PostgreSQL counterpart is declared with its own reason
    monkeypatch.setitem(catalog.SQLITE_ONLY, "no_token_on_complete", "a reason of its own")
    sqlite_only = MutantEngine(BY_NAME["no_token_on_complete"])
    check_backend(sqlite_only, Backend("sqlite"))
    with pytest.raises(BackendError, match=r"--backend postgres: engine "
                                           r"mutant:no_token_on_complete runs on sqlite only "
                                           r"\(a reason of its own\)"):
        check_backend(sqlite_only, Backend("postgres"))


def test_a_command_of_many_runs_starts_one_server_for_all_of_them_and_stops_it():
    with command_backend(Backend()) as same:
        assert same == Backend()  # sqlite: as given
    names = ("run_one", "run_two")
    with command_backend(Backend("postgres")) as shared:
        assert shared.command_server and shared.pg_url
        made = []
        for name in names:  # each run a database of its own, on the one server
            with run_database(shared, name) as db:
                assert db.server == STARTED_FOR_COMMAND and db.control is None
                with psycopg.connect(db.target) as conn:
                    assert conn.execute("SELECT current_database()").fetchone()[0] == name
                made.append(db)
        assert {urlsplit_port(d.target) for d in made} == {urlsplit_port(shared.pg_url)}
    with pytest.raises(psycopg.OperationalError):  # gone with the command
        psycopg.connect(made[0].target, connect_timeout=2)
    with pytest.raises(ValueError, match="started for the command, which ended with it"):
        saved_target("run", {"database": made[0].to_json()})


def test_a_run_that_cuts_the_power_starts_its_own_server_not_the_commands():
    power_loss, smoke = load_scenario("power-loss", "smoke"), load_scenario("smoke", "smoke")
    shared = Backend("postgres", "postgresql://u@127.0.0.1:5999/postgres", command_server=True)
    assert backend_for(power_loss, shared) == Backend("postgres")  # its own: a cut kills it
    assert backend_for(smoke, shared) == shared
    named = Backend("postgres", "postgresql://u@127.0.0.1:5999/postgres")
    assert backend_for(power_loss, named) == named  # the user's server: refused, not replaced
    assert backend_for(power_loss, Backend()) == Backend()


def urlsplit_port(url: str) -> int | None:
    from urllib.parse import urlsplit
    return urlsplit(url).port


def test_a_pg_url_a_command_cannot_use_is_refused_before_any_run_naming_the_flag(pg_server):
    with pytest.raises(BackendError) as err:
        with command_backend(Backend("postgres", "postgresql://u:hunter2@127.0.0.1:1/db")):
            pass
    assert "--pg-url: cannot connect to postgresql://u:***@127.0.0.1:1/db" in str(err.value)
    assert "hunter2" not in str(err.value)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS no_createdb")
        conn.execute("CREATE ROLE no_createdb LOGIN NOCREATEDB")
    url = pg_server.url.replace("postgres@", "no_createdb@")
    with pytest.raises(BackendError, match="--pg-url: the user of .* may not create databases"):
        with command_backend(Backend("postgres", url)):
            pass
    with command_backend(Backend("postgres", pg_server.url)) as given:
        assert given == Backend("postgres", pg_server.url)  # the runs use it as named


def test_no_server_binaries_is_a_clear_error_naming_the_flag_and_leaves_nothing(monkeypatch):
    monkeypatch.setattr(pgserver.glob, "glob", lambda pattern: [])
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BackendError, match=r"--backend postgres: could not start a PostgreSQL "
                                           r"server .*`make test` installs them.*--pg-url"):
        with run_database(Backend("postgres"), "x"):
            pass


def test_an_unreachable_pg_url_is_a_clear_error_naming_the_flag_without_the_password():
    with pytest.raises(BackendError) as err:
        with run_database(Backend("postgres", "postgresql://u:hunter2@127.0.0.1:1/postgres"),
                          "x"):
            pass
    assert "--pg-url: cannot create database x on postgresql://u:***@127.0.0.1:1/postgres" \
        in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_pg_url_run_gets_a_new_database_without_the_password_in_its_target(pg_server):
    url = pg_server.url.replace("postgres@", "postgres:hunter2@")  # trust: any password
    before = os.environ.get("PGPASSWORD")
    name = database_name("unit", "20261202T000000000000", os.getpid())
    with run_database(Backend("postgres", url), name) as db:
        assert os.environ["PGPASSWORD"] == "hunter2"  # for the engine's processes
        assert "hunter2" not in repr(db.to_json()) and db.name == name
        assert db.server == pg_server.url and db.target == pg_server.url_for(name)
        with psycopg.connect(db.target) as conn:
            assert conn.execute("SELECT current_database()").fetchone()[0] == name
    assert os.environ.get("PGPASSWORD") == before
    assert saved_target("run", {"database": db.to_json()}) == db.target  # kept there
    pg_server.drop_database(db.target)


def test_a_run_on_its_own_server_stops_it_however_the_block_ends():
    with pytest.raises(KeyboardInterrupt):
        with run_database(Backend("postgres"), "interrupted") as db:
            with psycopg.connect(db.target) as conn:  # the run's server answers
                conn.execute("SELECT 1")
            raise KeyboardInterrupt
    with pytest.raises(psycopg.OperationalError):  # and is gone with the run
        psycopg.connect(db.target, connect_timeout=2)
    with pytest.raises(ValueError, match="ended with it"):
        saved_target("run", {"database": db.to_json()})


def _skewed_only():
    scenario = load_scenario("smoke", "smoke")
    faults = dataclasses.replace(scenario.faults, skewed_workers=1, kill=0.0)
    return dataclasses.replace(scenario, faults=faults)


def test_skewed_workers_take_leases_only_where_their_clock_places_them():
    scenario = _skewed_only()
    settings = REFERENCE.settings(scenario.engine)
    assert settings.lease_clock == "worker"
    assert expectations(scenario, REFERENCE, settings)["lease_exclusive"] is False
    on_server = dataclasses.replace(settings, **REFERENCE.store_settings("postgresql://h/d"))
    assert expectations(scenario, REFERENCE, on_server)["lease_exclusive"] is True


def test_a_lease_clock_other_than_worker_or_store_is_refused():
    with pytest.raises(ValueError, match="lease_clock must be 'worker' or 'store'"):
        EngineSettings(lease_clock="wall")


def test_the_simulation_refuses_server_faults_rather_than_passing_without_them(tmp_path,
                                                                               capsys):
    from chaos.commands.cli import main
    assert main(["sim", "postgres-faults", "--profile", "smoke", "--seed", "1", "--out",
                 str(tmp_path)]) == 2
    assert "faults.server_restart crashes a real PostgreSQL server" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_the_whole_catalog_on_postgres_leaves_sqlite_only_mutants_out_and_one_named_is_refused(
        capsys):
    from chaos.mutants.matrix import on_backend
    kept = on_backend(list(catalog.CATALOG), Backend("postgres"), named=False)
    assert {m.name for m in kept} == ON_POSTGRES
    assert "group_stale_fails_all left out on postgres: group commit is SQLite's" in \
        capsys.readouterr().err
    assert len(on_backend(list(catalog.CATALOG), Backend(), named=False)) == len(catalog.CATALOG)
    with pytest.raises(BackendError, match="runs on sqlite only"):
        on_backend([BY_NAME["group_stale_fails_all"]], Backend("postgres"), named=True)
