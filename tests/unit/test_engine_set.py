"""`--engine-set NAME=VALUE`: an engine setting over a scenario's [engine] table, validated as
the table is (a bad value exits 2 naming the setting), recorded in the scenario's record, and
given again by the rerun command and by a replay, so that the seed reproduces the run."""
from __future__ import annotations

import json
import shlex

import pytest

import chaos.run.runner
from chaos.commands.cli import main
from chaos.contract import load_engine
from chaos.spec.plan import make_plan
from chaos.reports.report import run_command
from chaos.spec.scenario import ScenarioError, engine_set_args, load_scenario, parse_engine_set


def test_values_are_read_as_toml_and_a_bare_word_as_a_string():
    assert parse_engine_set(["slots=4", "lease=0.5", "heartbeat=false", "synchronous=NORMAL",
                             'model="gpt x"']) == {"slots": 4, "lease": 0.5, "heartbeat": False,
                                                   "synchronous": "NORMAL", "model": "gpt x"}


@pytest.mark.parametrize("arg", ["slots", "=4", ""])
def test_an_argument_without_name_and_value_is_refused_naming_it(arg):
    with pytest.raises(ScenarioError, match="--engine-set"):
        parse_engine_set([arg])


def test_the_setting_goes_over_the_table_and_is_recorded_apart():
    scenario = load_scenario("kill-storm", "smoke", engine_set={"slots": 4, "lease": 2.0})
    assert scenario.engine["slots"] == 4 and scenario.engine["lease"] == 2.0
    assert scenario.to_json()["engine_set"] == {"slots": 4, "lease": 2.0}
    assert load_engine("reference").settings(scenario.engine).slots == 4


@pytest.mark.parametrize("arg, named", [("slots=0", "slots"), ("slots=many", "slots"),
                                        ("slot=4", "engine.slot"), ("lease=abc", "lease")])
def test_a_bad_setting_exits_2_naming_it(arg, named, capsys):
    assert main(["run", "kill-storm", "--profile", "smoke", "--engine-set", arg]) == 2
    err = capsys.readouterr().err
    assert named in err and "--engine-set" in err, err


def test_the_rerun_command_gives_the_settings_again():
    scenario = load_scenario("kill-storm", "smoke",
                             engine_set={"slots": 4, "synchronous": "NORMAL", "lease": 1.5})
    command = run_command(scenario, 7, "reference")
    argv = shlex.split(command)
    assert argv[argv.index("--seed") + 1] == "7"
    given = [argv[i + 1] for i, a in enumerate(argv) if a == "--engine-set"]
    assert parse_engine_set(given) == {"slots": 4, "synchronous": "NORMAL", "lease": 1.5}


def test_a_secret_setting_is_never_written_into_the_rerun_command():
    assert engine_set_args({"provider_key": "hunter2", "slots": 2}) == ["--engine-set",
                                                                        "slots=2"]


def test_a_replay_runs_the_saved_plan_with_the_recorded_settings(tmp_path, monkeypatch):
    engine = load_engine("reference")
    scenario = load_scenario("kill-storm", "smoke", engine, {"slots": 4})
    plan = make_plan(scenario, 3, engine.pipeline)
    run = tmp_path / "run"
    run.mkdir()
    report = {"schema": "ninelives.report/1", "partial": True, "result": "partial",
              "scenario": scenario.to_json(), "profile": "smoke", "engine": "reference",
              "plan": plan.to_json(), "seed": 3, "verdicts": [], "run_dir": str(run)}
    (run / "report.json").write_text(json.dumps(report))
    seen = []

    def fake_campaign(scenario, seed, engine, out, **kwargs):
        seen.append((scenario.engine.get("slots"), scenario.engine_set, seed))
        raise KeyboardInterrupt  # enough: what it was given is what we check

    monkeypatch.setattr(chaos.run.runner, "run_campaign", fake_campaign)
    assert main(["replay", str(run)]) == 130
    assert seen == [(4, {"slots": 4}, 3)]
