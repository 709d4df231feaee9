"""Crash points named by role, by an engine's own name, optional, or all (chaos.engines.crashpoints):
what each arms on an engine, the scenario errors for a name the engine lacks, what the report
says of optional names an engine lacks, and the shipped scenarios' roles arming on the
reference engine exactly the points they named before."""
from __future__ import annotations

import dataclasses

import pytest

from chaos.contract import ContractError, load_engine, validate
from chaos.engines.crashpoints import ROLES, parse, resolve
from chaos.reference import REFERENCE, ReferenceEngine
from chaos.reports.fired import crash_point_names, not_applicable
from chaos.reports.report_text import crash_point_lines
from chaos.spec.scenario import Faults, Run, ScenarioError, crash_points_for, load_scenario
from chaos.sim import SeededChoices, SimSpec, simulate

TOY = "examples.toy_engine.adapter:TOY"
ARTICLE = "examples.article_engine.adapter:ARTICLE"


def scenario_file(tmp_path, points: list[str]) -> str:
    path = tmp_path / "points.toml"
    listed = ", ".join(f'"{p}"' for p in points)
    path.write_text(f'name = "points"\n[faults]\ncrash_points = [{listed}]\n'
                    'crash_point_probability = 0.1\n')
    return str(path)


# -- reading a name ------------------------------------------------------------------------------

def test_a_name_is_read_as_a_role_an_engine_point_or_all_and_a_question_mark_makes_it_optional():
    assert parse("role:after_call") == ("role:after_call", "after_call", None, False)
    assert parse("role:before_mark?") == ("role:before_mark?", "before_mark", None, True)
    assert parse("worker.group.before_commit?") == ("worker.group.before_commit?", None,
                                                     "worker.group.before_commit", True)
    assert parse("after_call") == ("after_call", None, "after_call", False)  # the toy's own
    assert parse("*") == ("*", None, "*", False)


@pytest.mark.parametrize("text,says", [
    ("role:after_cal", "known roles: submit, claim"),
    ("*?", "never optional"),
    ("worker.after_call:2", "not a crash point name"),
    ("worker.after_call@0.5", "not a crash point name"),
    ("", "not a crash point name"),
])
def test_a_name_that_cannot_be_one_is_refused_naming_it(text, says):
    with pytest.raises(ValueError) as err:
        parse(text)
    assert repr(text) in str(err.value) and says in str(err.value)


def test_every_role_has_a_one_line_meaning():
    assert ROLES and all(meaning and "\n" not in meaning for meaning in ROLES.values())


# -- resolving names on an engine ----------------------------------------------------------------

def test_a_role_arms_the_points_the_engine_maps_to_it_and_an_own_name_arms_itself():
    got = resolve(["role:after_call", "worker.heartbeat", "role:before_mark"], REFERENCE)
    assert got.armed == ("worker.after_call", "worker.heartbeat", "sender.before_commit")
    assert got.named["role:after_call"] == ("worker.after_call",)
    assert not got.absent and not got.missing
    toy = load_engine(TOY)
    assert resolve(["role:after_call"], toy).armed == ("after_call",)
    assert resolve(["role:before_send"], load_engine(ARTICLE)).armed == ("sender.before_send",)


def test_all_arms_every_point_and_a_point_named_twice_is_armed_once():
    got = resolve(["*", "role:after_call", "worker.after_call"], REFERENCE)
    assert got.armed == ("*", "worker.after_call") and not got.missing


def test_a_name_the_engine_lacks_is_missing_unless_optional_then_absent_with_the_reason():
    toy = load_engine(TOY)
    got = resolve(["role:heartbeat", "worker.group.before_commit?", "role:after_call",
                   "role:before_mark?"], toy)
    assert got.armed == ("after_call",)
    assert list(got.missing) == ["role:heartbeat"]
    assert "maps no point to role heartbeat" in got.missing["role:heartbeat"]
    assert got.absent == {
        "worker.group.before_commit?": "engine toy declares no point 'worker.group.before_commit'",
        "role:before_mark?": "engine toy maps no point to role before_mark: " +
                             ROLES["before_mark"]}


def test_an_engine_without_crash_points_arms_nothing_and_refuses_no_name():
    class Pointless(ReferenceEngine):
        capabilities = ReferenceEngine.capabilities - {"crash_points"}
    got = resolve(["role:after_call", "worker.nowhere"], Pointless())
    assert got.armed == () and not got.missing
    assert set(got.absent) == {"role:after_call", "worker.nowhere"}


# -- at scenario load ----------------------------------------------------------------------------

def test_a_misspelt_point_is_a_scenario_error_naming_it_the_field_and_the_engines_points(
        tmp_path):
    path = scenario_file(tmp_path, ["role:after_call", "worker.after_cal"])
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    for fragment in ("points.toml", "'faults.crash_points'", "'worker.after_cal'",
                     "worker.after_call, worker.before_commit", "after_call -> worker.after_call",
                     "trailing '?'"):
        assert fragment in message, (fragment, message)
    assert "'role:after_call'" not in message  # the names it does declare are not blamed


def test_an_unknown_role_is_refused_at_load_whatever_the_engine(tmp_path):
    with pytest.raises(ScenarioError, match=r"points.toml: field 'faults.crash_points': "
                                            r"'role:nope\?' names no role \(known roles: submit"):
        load_scenario(scenario_file(tmp_path, ["role:nope?"]))


def test_a_role_the_engine_does_not_map_is_refused_unless_optional(tmp_path):
    toy = load_engine(TOY)
    with pytest.raises(ScenarioError, match=r"'role:heartbeat': engine toy maps no point to "
                                            r"role heartbeat.*Its points: after_claim"):
        load_scenario(scenario_file(tmp_path, ["role:heartbeat", "role:after_call"]),
                      engine=toy)
    scenario = load_scenario(scenario_file(tmp_path, ["role:heartbeat?", "role:after_call"]),
                             engine=toy)
    assert crash_points_for(scenario, toy) == (("after_call",), ("role:heartbeat?",))


def test_the_report_lists_what_each_name_armed_and_the_optional_ones_the_engine_lacks(tmp_path):
    toy = load_engine(TOY)
    scenario = load_scenario(scenario_file(tmp_path, ["role:heartbeat?", "role:after_call",
                                                      "after_commit"]), engine=toy)
    names = crash_point_names(scenario, toy)
    assert names == {"crash_points_armed": {"role:after_call": ["after_call"],
                                            "after_commit": ["after_commit"]},
                     "crash_points_not_applicable": {
                         "role:heartbeat?": "engine toy maps no point to role heartbeat: "
                                            + ROLES["heartbeat"]}}
    assert crash_point_lines(names) == [
        "crash points armed: role:after_call (after_call), after_commit",
        "crash points not applicable to this engine (optional): role:heartbeat? (engine toy "
        "maps no point to role heartbeat: " + ROLES["heartbeat"] + ")"]
    assert "crash_points" not in not_applicable(scenario, toy)  # some points are armed
    alone = load_scenario(scenario_file(tmp_path, ["role:heartbeat?"]), engine=toy)
    assert "crash_points" in not_applicable(alone, toy)  # none is: the fault is not applicable


# -- the shipped scenarios -----------------------------------------------------------------------

#: What each shipped scenario that names points armed on the reference engine when it named
#: them by the reference's own names: by role now, it must arm the same.
REFERENCE_POINTS = {
    "outbox-ambiguous": {"sender.after_send", "sender.after_claim", "sender.before_commit"},
    "slots": {"worker.group.before_commit", "worker.group.after_commit", "worker.after_call",
              "worker.heartbeat", "claim.before_commit"},
    "mutants/torn-completion": {"worker.after_commit"},
    "mutants/torn-steps": {"worker.after_commit"},
    "smoke": {"*"},
}


@pytest.mark.parametrize("name", sorted(REFERENCE_POINTS))
def test_the_shipped_scenarios_arm_on_the_reference_engine_the_points_they_always_did(name):
    armed, absent = crash_points_for(load_scenario(name), REFERENCE)
    assert set(armed) == REFERENCE_POINTS[name] and not absent


def test_outbox_ambiguous_runs_on_the_article_engine_without_its_missing_mark_point():
    article = load_engine(ARTICLE)
    armed, absent = crash_points_for(load_scenario("outbox-ambiguous", engine=article), article)
    assert set(armed) == {"sender.after_send", "sender.before_send"}
    assert absent == ("role:before_mark?",)


# -- the adapter's map ---------------------------------------------------------------------------

def test_an_adapter_mapping_an_unknown_role_or_a_point_it_lacks_fails_the_contract():
    class Confused(ReferenceEngine):
        point_roles = {"after_cal": ("worker.after_call",),
                       "after_call": ("worker.after_cal",)}
    with pytest.raises(ContractError) as err:
        validate(Confused())
    assert "unknown role 'after_cal'" in str(err.value)
    assert "'worker.after_cal', which is not in its crashpoints" in str(err.value)


# -- in simulation -------------------------------------------------------------------------------

def test_the_simulation_kills_only_at_the_points_a_role_names():
    base = load_scenario("smoke", "smoke")
    scenario = dataclasses.replace(
        base, name="sim-role", run=Run(jobs=3, workers=2, senders=1, chaos=2.0, heal=0.5,
                                       drain=20.0),
        faults=Faults(crash_points=("role:after_call",), crash_point_probability=0.5))
    engine = ReferenceEngine()
    result = simulate(SimSpec(scenario, 1, engine, "reference"), SeededChoices(1))
    points = {e["point"] for e in result.history if e["type"] == "crashpoint"}
    assert points == {"worker.after_call"}
