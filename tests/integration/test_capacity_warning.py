"""A real run of more worker job slots than the machine is judged reliably with is warned of at
plan time, on stderr and in report.json, and still runs (chaos.spec.capacity)."""
from __future__ import annotations

import json

import chaos.spec.capacity
from chaos.commands import cli


def test_a_run_past_the_machines_capacity_is_warned_of_and_runs(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(chaos.spec.capacity, "SLOTS_PER_CPU", 0)  # this machine judges none
    code = cli.main(["run", "smoke", "--profile", "smoke", "--seed", "1", "--out",
                     str(tmp_path), "--quiet"])
    err = capfd.readouterr().err
    assert code in (0, 1), err  # judged: a warning, never a refusal
    [line] = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert line.startswith("warning: 2 workers on ")
    (report_path,) = [p for p in tmp_path.glob("smoke/*/report.json")
                      if p.parent.name != "latest"]
    report = json.loads(report_path.read_text())
    assert report["warnings"] == [line[len("warning: "):]]
