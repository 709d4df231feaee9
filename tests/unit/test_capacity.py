"""The warning a real run gets at plan time when its scenario runs more worker job slots than
this machine's runs are judged reliably with (chaos.spec.capacity): on stderr and in report.json,
never a refusal."""
from __future__ import annotations

import dataclasses

from chaos.spec.capacity import SLOTS_PER_CPU, capacity_warnings, job_slots
from chaos.run.runner import with_capacity
from chaos.spec.scenario import load_scenario

SMOKE = load_scenario("smoke", "smoke")


def with_workers(workers: int, slots: int = 1):
    return dataclasses.replace(SMOKE, run=dataclasses.replace(SMOKE.run, workers=workers),
                               engine={**SMOKE.engine, "slots": slots})


def test_as_many_workers_as_the_machine_judges_get_no_warning():
    assert capacity_warnings(with_workers(2 * SLOTS_PER_CPU), cpus=2) == []


def test_more_workers_than_the_machine_judges_is_a_warning_naming_the_counts():
    (warning,) = capacity_warnings(with_workers(2 * SLOTS_PER_CPU + 1), cpus=2)
    assert warning.startswith(f"{2 * SLOTS_PER_CPU + 1} workers on 2 CPU(s): more than the "
                              f"{2 * SLOTS_PER_CPU} ({SLOTS_PER_CPU} per CPU)")
    assert "fenced-writes" in warning and "ninelives sim" in warning
    # a bigger machine judges the same scenario
    assert capacity_warnings(with_workers(2 * SLOTS_PER_CPU + 1), cpus=4) == []


def test_each_job_slot_counts():
    assert job_slots(with_workers(3, slots=4)) == 12
    (warning,) = capacity_warnings(with_workers(SLOTS_PER_CPU, slots=2), cpus=1)
    assert warning.startswith(f"{SLOTS_PER_CPU} workers x 2 slots = {2 * SLOTS_PER_CPU} job "
                              "slots on 1 CPU(s)")


def test_the_report_carries_the_warnings():
    report = with_capacity({"result": "pass"}, with_workers(256))
    assert report["warnings"] == capacity_warnings(with_workers(256)) != []
    assert with_capacity({"result": "pass"}, with_workers(1))["warnings"] == []
