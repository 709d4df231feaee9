"""An engine that fixes a job's settings when it is enqueued gets the scenario's [engine]
table with every submission, wherever the harness submits (the runner, the nemesis's
duplicate submissions, the simulation), once its adapter's `submit` asks for it by name;
an adapter that does not ask is called as before."""
from __future__ import annotations

from typing import Any

from chaos.contract import submitter
from chaos.run.nemesis import Nemesis
from chaos.spec.plan import make_plan
from chaos.run.runner import Campaign
from chaos.spec.scenario import load_scenario
from chaos.sim import SeededChoices, SimSpec, simulate
from examples.toy_engine.adapter import ToyEngine


class ToyTakingTable(ToyEngine):
    """The toy, with a `submit` that cannot work without the [engine] table."""

    def __init__(self) -> None:
        self.tables: list[dict[str, Any]] = []

    def submit(self, db: str, job_id: str, payload: Any, now: float | None = None, *,
               settings: dict[str, Any]) -> str:
        self.tables.append(settings)
        return super().submit(db, job_id, payload, now)


def scenario_for(engine, name: str = "duplicate-submit"):
    return load_scenario(name, "smoke", engine=engine, engine_set={"max_attempts": 3})


def test_the_simulation_gives_every_submission_the_table_as_written():
    engine = ToyTakingTable()
    scenario = scenario_for(engine)
    result = simulate(SimSpec(scenario, 1, engine, "toy-taking-table"), SeededChoices(1))
    submits = [e for e in result.history if e.get("src") == "runner" and e["type"] == "submit"]
    assert any(e["duplicate"] for e in submits), "the nemesis submitted again"
    assert len(engine.tables) == len(submits)
    assert all(table == scenario.engine for table in engine.tables)
    assert engine.tables[0]["max_attempts"] == 3  # --engine-set over the file's table
    assert not result.errors, result.errors


def test_a_real_run_submits_with_the_table_from_the_runner_and_the_nemesis(tmp_path):
    engine = ToyTakingTable()
    scenario = scenario_for(engine)
    plan = make_plan(scenario, 1, engine.pipeline)
    campaign = Campaign(scenario, plan, engine, str(tmp_path), progress=False)
    engine.install(campaign.db)
    campaign._submit_all()
    assert len(engine.tables) == len(plan.jobs)
    nemesis = Nemesis(scenario, plan, engine, campaign.db, None, None, lambda event: None)
    nemesis._duplicate_submit({"job": plan.jobs[0], "kind": "same"})
    assert len(engine.tables) == len(plan.jobs) + 1
    assert all(table == scenario.engine for table in engine.tables)
    # each call gets its own copy: an adapter that edits it changes nothing of the run's
    assert engine.tables[0] is not scenario.engine


def test_an_adapter_that_does_not_name_settings_is_called_as_before():
    class Forwarding:
        def submit(self, db, job_id, payload, **keywords):
            return keywords

    engine = Forwarding()
    assert submitter(engine, {"lease": 2.0})("db", "job", {}, now=1.0) == {"now": 1.0}
