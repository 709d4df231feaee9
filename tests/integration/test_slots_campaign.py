"""Whole chaos runs of worker processes with job slots (several jobs at once per process):
the slots scenario, and the shared scenarios with `--engine-set slots=4`. Real processes, real
SIGKILL: one kill cuts every step its process was working on, and every invariant holds."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 4


def ninelives(*args: str, timeout: float = 280) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def only_run(out: Path) -> Path:
    runs = [Path(d) for d, _, files in os.walk(out) if "report.json" in files]
    assert len(runs) == 1, runs
    return runs[0]


def run_report(tmp_path: Path, scenario: str, *args: str) -> tuple[dict, str]:
    done = ninelives("run", scenario, "--profile", "smoke", "--seed", "1", *args,
                     "--out", str(tmp_path), "--quiet")
    report = json.loads((only_run(tmp_path) / "report.json").read_text())
    failed = {v["name"]: v["reason"] for v in report["verdicts"] if v["verdict"] == "fail"}
    assert done.returncode == 0, (failed, report["faults_unfired"], done.stderr[-2000:])
    return report, done.stdout


def test_the_slots_scenario_kills_several_steps_at_once_and_every_invariant_holds(tmp_path):
    report, out = run_report(tmp_path, "slots")
    assert report["scenario"]["engine"]["slots"] == SLOTS
    cuts = report["metrics"]["kill_cuts"]
    # one death cuts every step its process worked on, and never more than its slots
    assert any(int(n) > 1 for n in cuts["kills_by_steps_cut"]), cuts
    assert cuts["most_in_one_kill"] <= SLOTS, cuts
    assert all(len(k["steps"]) <= SLOTS for k in report["kills"])
    grouped = {p: n for p, n in report["crashpoint_coverage"].items() if ".group." in p}
    assert sum(grouped.values()) > 0, report["crashpoint_coverage"]
    assert report["faults_applied"].get("pause", 0) > 0
    assert "in-flight steps" in out
    page = (only_run(tmp_path) / "report.html").read_text()
    assert "steps at once" in page and "Worker kills and the steps each cut" in page


#: The shared scenarios (not the mutant catalog's own): in the default suite two of them
#: with slots=4 beside the slots scenario; every one in the soak run
#: (`.venv/bin/python -m pytest -n 2 -m soak tests/integration/test_slots_campaign.py`).
SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml")
                   if p.stem not in ("profiles", "slots"))
DEFAULT = {"kill-storm", "lost-lease"}
#: the database server's own faults need a server the run starts
BACKEND = {"postgres-faults": ("--backend", "postgres")}


@pytest.mark.parametrize("scenario", [
    pytest.param(name, marks=() if name in DEFAULT else (pytest.mark.soak,))
    for name in SCENARIOS])
def test_every_scenario_passes_with_four_job_slots(tmp_path, scenario):
    report, out = run_report(tmp_path, scenario, "--engine-set", f"slots={SLOTS}",
                             *BACKEND.get(scenario, ()))
    assert report["scenario"]["engine_set"] == {"slots": SLOTS}
    assert report["metrics"]["kill_cuts"]["most_in_one_kill"] <= SLOTS
    # the rerun command gives the setting again, so the seed reproduces the run
    argv = shlex.split(report["run_command"])
    assert argv[argv.index("--engine-set") + 1] == f"slots={SLOTS}"
    assert f"--engine-set slots={SLOTS}" in out
