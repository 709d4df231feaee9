"""The warning a real run gets at plan time when its scenario runs more engine callers than
this machine's runs are judged reliably with (chaos.capacity): on stderr and in report.json,
never a refusal."""
from __future__ import annotations

import dataclasses

from chaos.capacity import CALLERS_PER_CPU, callers, capacity_warnings
from chaos.runner import with_capacity
from chaos.scenario import load_scenario

SMOKE = load_scenario("smoke", "smoke")


def with_workers(workers: int, slots: int = 1):
    return dataclasses.replace(SMOKE, run=dataclasses.replace(SMOKE.run, workers=workers),
                               engine={**SMOKE.engine, "slots": slots})


def test_a_scenario_within_the_machine_gets_no_warning():
    most = 2 * CALLERS_PER_CPU - SMOKE.run.senders  # workers that fill 2 CPUs exactly
    assert capacity_warnings(with_workers(most), cpus=2) == []


def test_more_workers_than_the_machine_judges_is_a_warning_naming_the_counts():
    (warning,) = capacity_warnings(with_workers(64), cpus=2)
    assert warning.startswith("64 workers + 1 senders = 65 engine callers on 2 CPU(s)")
    assert f"{2 * CALLERS_PER_CPU} ({CALLERS_PER_CPU} per CPU)" in warning
    assert "fenced-writes" in warning and "ninelives sim" in warning
    # a bigger machine judges the same scenario
    assert capacity_warnings(with_workers(64), cpus=64) == []


def test_job_slots_count_as_callers():
    assert callers(with_workers(3, slots=4)) == 3 * 4 + SMOKE.run.senders
    (warning,) = capacity_warnings(with_workers(3, slots=4), cpus=1)
    assert warning.startswith("3 workers x 4 slots + 1 senders = 13 engine callers")


def test_the_report_carries_the_warnings():
    report = with_capacity({"result": "pass"}, with_workers(64))
    assert report["warnings"] == capacity_warnings(with_workers(64))
    assert with_capacity({"result": "pass"}, with_workers(1))["warnings"] == []
