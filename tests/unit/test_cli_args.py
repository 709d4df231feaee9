"""The command lines of `ninelives` and `ninelives engine`: one syntax for --seeds in every
command, every integer flag held to its floor (exit 2 naming the flag), every flag with help,
each engine subcommand's help showing the settings it uses, and a usage that names every
command."""
from __future__ import annotations

import argparse

import pytest

import chaos.commands.cli
import engine.cli
from chaos.commands.flags import parse_seeds
from engine.config import FIELDS


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def parse_exit(parser: argparse.ArgumentParser, argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    return exited.value.code, capsys.readouterr().err


# -- --seeds ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seeds", [("1", range(1, 2)), ("3", range(1, 4)),
                                        ("2..4", range(2, 5)), ("7..7", range(7, 8))])
def test_seeds_are_n_for_1_to_n_or_a_range(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text,message", [("0", "names no seed"), ("-2", "names no seed"),
                                          ("5..2", "is empty"), ("x", "must be N or A..B"),
                                          ("1..", "must be N or A..B"), ("", "must be N")])
def test_seeds_that_name_no_seed_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


SEEDS_FLAGS = [(["sweep"], "seeds"), (["sim", "smoke"], "seeds"), (["mutants"], "seeds"),
               (["score"], "seeds"), (["score", "--run"], "run_seeds")]


@pytest.mark.parametrize("argv,dest", SEEDS_FLAGS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else v)
@pytest.mark.parametrize("text,seeds", [("3", range(1, 4)), ("2..5", range(2, 6))])
def test_every_command_reads_seeds_the_same_way(argv, dest, text, seeds):
    flag = "--" + dest.replace("_", "-")
    args = chaos.commands.cli.build_parser().parse_args(argv + [flag, text])
    assert getattr(args, dest) == seeds


@pytest.mark.parametrize("argv,dest", SEEDS_FLAGS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else v)
def test_every_command_refuses_seeds_that_name_no_seed(argv, dest, capsys):
    flag = "--" + dest.replace("_", "-")
    code, err = parse_exit(chaos.commands.cli.build_parser(), argv + [flag, "0"], capsys)
    assert code == 2 and f"argument {flag}: 0 names no seed" in err


def test_sim_takes_one_seed_with_seed_and_not_both():
    args = chaos.commands.cli.build_parser().parse_args(["sim", "smoke", "--seed", "8"])
    assert args.seed == 8
    with pytest.raises(SystemExit):
        chaos.commands.cli.build_parser().parse_args(["sim", "smoke", "--seed", "8", "--seeds", "2"])


def test_the_score_passes_its_seeds_on_to_each_mutant_s_test_as_given():
    from chaos.score import test_command
    command = test_command(range(2, 4), 1, range(1, 3))
    assert command.endswith("kill --seeds 2..3 --deep 1 --run 1..2")
    assert "--run" not in test_command(range(1, 3), 0, None)


# -- integer flags and their floors ----------------------------------------------------------

COUNTS = [(["replay", "RUN", "--tries"], ">= 1"), (["demo", "--jobs"], ">= 1"),
          (["demo", "--workers"], ">= 1"), (["mutants", "--parallel"], ">= 1"),
          (["sim", "smoke", "--budget"], ">= 1"), (["score", "--jobs"], ">= 1"),
          (["score", "--deep"], ">= 0")]


@pytest.mark.parametrize("argv,floor", COUNTS, ids=lambda v: " ".join(v)
                         if isinstance(v, list) else v)
@pytest.mark.parametrize("value", ["-1", "0", "x", "1.5"])
def test_a_count_below_its_floor_or_not_whole_exits_2_naming_the_flag(argv, floor, value,
                                                                      capsys):
    if floor == ">= 0" and value == "0":
        assert chaos.commands.cli.build_parser().parse_args(argv + [value]) is not None
        return
    code, err = parse_exit(chaos.commands.cli.build_parser(), argv + [value], capsys)
    assert code == 2 and f"argument {argv[-1]}:" in err


@pytest.mark.parametrize("argv,ceiling", [
    (["demo", "--jobs", "100000000000"], "at most 100,000"),
    (["demo", "--workers", "100000"], "at most 256"),
    (["replay", "RUN", "--tries", "100000000000"], "at most 100,000"),
    (["sim", "smoke", "--seeds", "100000000000"], "more than the 100,000"),
    (["score", "--timeout", "1e300"], "at most 86400 seconds")],
    ids=lambda v: " ".join(v[:-1]) if isinstance(v, list) else None)
def test_a_count_or_duration_past_its_bound_exits_2_naming_the_flag(argv, ceiling, capsys):
    # each would have sat silent for hours (demo --jobs 1e11 submitting, say)
    code, err = parse_exit(chaos.commands.cli.build_parser(), argv, capsys)
    flag = next(a for a in reversed(argv) if a.startswith("--"))
    assert code == 2 and f"argument {flag}:" in err and ceiling in err, err


@pytest.mark.parametrize("lease", ["1e300", "0.5,86401"])
def test_a_sweep_lease_past_a_day_exits_2_naming_the_flag(lease, capsys, monkeypatch):
    import chaos.commands.sweep

    def swept(*args, **kwargs):  # a lease let through fails here, not after hours of runs
        raise AssertionError("the sweep started")

    monkeypatch.setattr(chaos.commands.sweep, "run_sweep", swept)
    assert chaos.commands.cli.main(["sweep", "--lease", lease]) == 2
    err = capsys.readouterr().err
    assert "--lease" in err and "at most 86400 seconds (a day)" in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-3"])
def test_the_score_s_timeout_is_finite_positive_seconds(value, capsys):
    code, err = parse_exit(chaos.commands.cli.build_parser(), ["score", "--timeout", value], capsys)
    assert code == 2 and "argument --timeout:" in err


@pytest.mark.parametrize("argv", [["worker", "--max-jobs", "0"],
                                  ["worker", "--clock-skew", "nan"],
                                  ["costs", "--window", "0"], ["costs", "--window", "inf"]])
def test_an_engine_command_s_own_flags_are_checked(argv, capsys):
    code, err = parse_exit(engine.cli.build_parser(), argv, capsys)
    assert code == 2 and f"argument {argv[1]}:" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_engine_worker_lease_nan_exits_2_naming_the_flag(value, capsys, tmp_path, monkeypatch):
    def started(*args, **kwargs):  # a lease let through fails here, not by polling for good
        raise AssertionError("the worker started")

    monkeypatch.setitem(engine.cli.COMMANDS, "worker", started)
    code = engine.cli.main(["worker", "--db", str(tmp_path / "x.db"), f"--lease={value}"])
    err = capsys.readouterr().err
    assert code == 2 and "flag --lease: setting 'lease' must be a finite number" in err
    assert not (tmp_path / "x.db").exists()  # refused before the database was opened


# -- --backend and --pg-url: one syntax in every command that runs campaigns ------------------

BACKEND_COMMANDS = [["run", "smoke"], ["sweep"], ["mutants"]]


@pytest.mark.parametrize("argv", BACKEND_COMMANDS, ids=lambda v: v[0])
def test_every_command_of_runs_takes_backend_and_pg_url_the_same_way(argv):
    args = chaos.commands.cli.build_parser().parse_args(argv)
    assert (args.backend, args.pg_url) == ("sqlite", None)
    args = chaos.commands.cli.build_parser().parse_args(
        argv + ["--backend", "postgres", "--pg-url", "postgresql://u@127.0.0.1:5432/db"])
    assert (args.backend, args.pg_url) == ("postgres", "postgresql://u@127.0.0.1:5432/db")


@pytest.mark.parametrize("argv", BACKEND_COMMANDS, ids=lambda v: v[0])
def test_every_command_of_runs_refuses_an_unknown_backend_naming_the_flag(argv, capsys):
    code, err = parse_exit(chaos.commands.cli.build_parser(), argv + ["--backend", "oracle"], capsys)
    assert code == 2 and "argument --backend: invalid choice: 'oracle'" in err


@pytest.mark.parametrize("argv", [["sweep", "--lease", "1", "--heartbeat", "on"], ["mutants"]],
                         ids=lambda v: v[0])
@pytest.mark.parametrize("flags, says", [
    (["--pg-url", "postgresql://u:pw@127.0.0.1:1/db"], "--pg-url needs --backend postgres"),
    (["--backend", "postgres", "--pg-url", "mysql://u:pw@127.0.0.1/db"],
     "--pg-url must be a postgresql://"),
], ids=["pg-url-without-postgres", "not-postgresql"])
def test_a_bad_pg_url_exits_2_naming_the_flag_before_any_folder(argv, flags, says, tmp_path,
                                                                capsys, monkeypatch):
    def started(*args, **kwargs):  # bad input let through fails here, not by running
        raise AssertionError("a run started")

    monkeypatch.setattr("chaos.commands.sweep.run_sweep", started)
    monkeypatch.setattr("chaos.mutants.matrix.run_matrix", started)
    code = chaos.commands.cli.main(argv + flags + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and says in err and ":pw@" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# -- help ------------------------------------------------------------------------------------

def all_parsers(parser: argparse.ArgumentParser, prefix: str = ""):
    yield prefix or parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, f"{prefix} {name}".strip())


@pytest.mark.parametrize("build", [chaos.commands.cli.build_parser, engine.cli.build_parser],
                         ids=["ninelives", "ninelives engine"])
def test_every_flag_of_every_command_has_help(build):
    missing = [f"{name} {action.option_strings or action.dest}"
               for name, parser in all_parsers(build())
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not action.help]
    assert missing == []


def test_the_usage_names_every_command():
    names = set(subcommands(chaos.commands.cli.build_parser()))
    assert {"sweep", "demo", "score", "sim", "mutants"} <= names
    for name in names:
        assert f"ninelives {name} " in chaos.commands.cli.__doc__, name


def test_a_command_is_parsed_alike_by_its_own_parser_and_by_the_whole_one():
    cli = chaos.commands.cli
    assert set(subcommands(cli.build_parser())) == cli.COMMANDS
    for argv in (["sim", "smoke", "--seeds", "2..3"], ["mutants", "--only", "no_state_guard"],
                 ["run", "smoke", "--seed", "4"], ["score", "--seeds", "2"],
                 ["doctor", "--engine", "reference"]):
        only = cli.command_of(argv)
        assert only == argv[0]
        assert cli.build_parser(only).parse_args(argv) == cli.build_parser().parse_args(argv)
        assert set(subcommands(cli.build_parser(only))) & set(cli.OWN_COMMANDS) <= {only}
    # a typo, or options alone, gets the whole parser: its error lists every command
    assert cli.command_of(["smi", "smoke"]) is None and cli.command_of(["--version"]) is None


def test_a_run_imports_neither_the_simulation_nor_the_mutant_catalog_to_read_its_flags():
    import subprocess
    import sys
    code = ("import sys; from chaos.commands.cli import build_parser, command_of; "
            "argv = ['run', 'smoke', '--seed', '2']; build_parser(command_of(argv)).parse_args(argv); "
            "print(sorted(m for m in sys.modules if m.startswith(('chaos.sim', 'chaos.mutants', "
            "'chaos.reference.mutants', 'psycopg'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def engine_help(command: str) -> str:
    return subcommands(engine.cli.build_parser())[command].format_help()


@pytest.mark.parametrize("command,shown,hidden", [
    ("worker", ["--lease", "--heartbeat-interval", "--call-timeout", "--provider-url"],
     ["--receiver-url", "--outbox-lease", "--send-timeout"]),
    ("send", ["--receiver-url", "--outbox-lease", "--send-timeout"],
     ["--lease", "--heartbeat", "--call-timeout", "--provider-url"]),
    ("status", ["--db", "--busy-timeout"], ["--lease", "--receiver-url", "--provider-key"]),
    ("submit", ["--db", "--pipeline"], ["--lease", "--outbox-max-attempts"]),
    ("rerun-step", ["--provider-url", "--model", "--call-timeout"], ["--lease",
                                                                     "--receiver-url"]),
])
def test_each_engine_subcommand_shows_the_settings_it_uses(command, shown, hidden):
    text = engine_help(command)
    for flag in shown:
        assert f"{flag} " in text, flag
    for flag in hidden:
        assert f"{flag} " not in text, flag


def test_every_setting_is_shown_by_some_command_and_accepted_by_all():
    shown = {name for command in engine.cli.COMMAND_SETTINGS.values() for name in command}
    assert shown | set(engine.cli.STORE_SETTINGS) == set(FIELDS)
    parser = engine.cli.build_parser()
    for command in subcommands(parser):  # a shared config or environment sets them all
        extra = ["job", "step"] if command == "rerun-step" else ["job"] if command in (
            "cancel", "requeue", "resolve") else []
        args = parser.parse_args([command, *extra, "--lease", "7", "--receiver-url", "u"])
        assert (args.set_lease, args.set_receiver_url) == ("7", "u")


def test_the_heartbeat_interval_default_reads_lease_over_3():
    text = " ".join(engine_help("worker").split())
    assert "--heartbeat-interval FLOAT seconds between heartbeats (default lease/3)" in text
    assert "default 0.0" not in text.split("--heartbeat-interval")[1].split("--")[0]
