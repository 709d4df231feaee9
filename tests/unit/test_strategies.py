"""The Hypothesis strategies (chaos.testing.strategies) and the remembered seeds (chaos.testing.remembered):
drawn scenarios pass the checks a scenario file passes, drawn runs of the reference hold,
assert_holds fails a planted bug with its witness and a replayable folder; a failing seed is
tried first and forgotten after FORGET_AFTER passes; a torn file is skipped."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from chaos.contract import load_engine
from chaos.testing.remembered import FORGET_AFTER, RememberedSeeds, check_key, order
from chaos.spec.scenario import check_for_engine, check_saved, load_scenario
from chaos.sim import SeededChoices, SimSpec, simulate
from chaos.testing.strategies import assert_holds, fault_plans, faults, scenarios, simulations

QUICK = settings(max_examples=15, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(scenarios("lost-lease", engine="examples.toy_engine.adapter:TOY",
                 engine_set={"call_timeout": 0.8}))
def test_a_drawn_scenario_passes_the_checks_of_a_scenario_file(scenario):
    assert check_saved(scenario, "drawn") is scenario
    check_for_engine(scenario, load_engine("examples.toy_engine.adapter:TOY"))
    assert scenario.run.senders >= 1 and scenario.run.chaos > 0
    assert scenario.engine["call_timeout"] == 0.8  # the [engine] table is kept, with the set


@QUICK
@given(fault_plans(scenarios("smoke", run=None, fault_tables=faults(kinds=("kill",)))))
def test_a_drawn_fault_plan_kills_only_when_asked(plan):
    assert {f["fault"] for f in plan.timeline} <= {"kill"}


def test_faults_refuses_a_kind_it_does_not_draw():
    with pytest.raises(ValueError, match="'server_restart' is not a fault"):
        faults(kinds=("server_restart",))  # at construction, not when drawn


@settings(max_examples=12, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(simulations(scenarios("smoke")))
def test_drawn_runs_of_the_reference_hold(run):
    assert_holds(run)


def planted_failure():
    """A simulated run of the toy engine's planted bug that fails effects-complete."""
    spec = "examples.toy_engine.planted:SENT_BEFORE_SEND"
    engine = load_engine(spec)
    scenario = load_scenario("smoke", "smoke", engine)
    return simulate(SimSpec(scenario, 1, engine, spec), SeededChoices(1))


def test_assert_holds_fails_a_planted_bug_with_its_witness_and_a_replayable_folder(tmp_path):
    result = planted_failure()
    with pytest.raises(AssertionError) as failed:
        assert_holds(result, out=str(tmp_path), shrink_budget=0)
    text = str(failed.value)
    assert "effects-complete (marked-sent-not-applied)" in text
    assert "<- effects-complete" in text  # the story marks the witness
    schedule = text.split("replay it: ninelives sim --replay ", 1)[1].split()[0]
    assert os.path.exists(schedule)


def test_assert_holds_shrinks_the_failing_schedule_when_given_a_budget(tmp_path):
    result = planted_failure()
    with pytest.raises(AssertionError) as failed:
        assert_holds(result, out=str(tmp_path), shrink_budget=20)
    text = str(failed.value)
    assert "the shrink failed" not in text, text
    assert "shrunk from" in text and "ninelives sim --replay" in text.split("shrunk from", 1)[1]


def test_a_failing_seed_is_tried_first_and_forgotten_after_passing_in_a_row(tmp_path):
    key = check_key("sim", "myengine:ENGINE", "smoke", "ci")
    seeds = RememberedSeeds(str(tmp_path), key)
    assert order(seeds.seeds(), range(1, 4)) == [(1, False), (2, False), (3, False)]
    seeds.failed(7, [("fenced-writes", "zombie-write")])
    seeds.failed(2, [("effects-complete", "not-applied")])
    assert order(seeds.seeds(), range(1, 4)) == [(2, True), (7, True), (1, False),
                                                   (3, False)]
    seeds.passed(2)
    seeds.failed(2, [("effects-complete", "not-applied")])  # a failure starts the count again
    assert [seeds.passed(2) for _ in range(FORGET_AFTER)] == [False] * (FORGET_AFTER - 1) + [True]
    assert seeds.seeds() == [7]
    other = RememberedSeeds(str(tmp_path), check_key("sim", "myengine:ENGINE", "smoke", "soak"))
    assert other.seeds() == []  # another profile is another check
    assert RememberedSeeds(None, key).seeds() == []  # the database off: nothing remembered


def test_a_torn_file_in_the_database_is_skipped_with_a_warning(tmp_path):
    seeds = RememberedSeeds(str(tmp_path), check_key("run", "reference", "smoke", "ci"))
    seeds.failed(3, [])
    with open(os.path.join(seeds.folder, "4.json"), "w") as fh:
        fh.write('{"seed": 4, "fail')
    assert seeds.seeds() == [3]
    assert seeds.warnings and "4.json: skipped" in seeds.warnings[0]


def test_a_shard_tries_its_own_seeds_and_its_own_remembered_ones_first():
    from chaos.run.shards import parse_shard
    from chaos.testing.suite_checks import _sharded
    assert _sharded([4, 5], range(1, 7), parse_shard("2/3")) == [(5, True), (2, False)]
    assert _sharded([4], range(1, 4), None) == [(4, True), (1, False), (2, False), (3, False)]
