"""The lease sweep on a small grid: real workers, the latency under test, real duplicate spend;
on PostgreSQL, one server for the whole sweep."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# More workers than jobs, so idle workers are there to take a lease the moment it expires.
# The short lease (1.2 s) is shorter than every call (2 s) but still three heartbeats long,
# so that on a loaded machine a beat scheduled late does not lose it (at 0.4 s a beat 0.27 s
# late did), and the long one (5 s) outlasts a call by 3 s.
SCENARIO = """name = "tiny-sweep"
[run]
jobs = 3
workers = 6
senders = 1
chaos = 1.0
heal = 0.2
drain = 40.0
[engine]
max_attempts = 5
max_claims = 12
backoff_base = 0.05
backoff_cap = 0.3
[faults]
latency = "fixed:2.0"
"""


def test_heartbeat_off_with_calls_longer_than_the_lease_pays_twice_and_on_does_not(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO)
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "sweep", str(scenario),
                           "--lease", "1.2,5", "--heartbeat", "on,off", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = os.listdir(tmp_path / "sweeps")
    sweep = json.loads((tmp_path / "sweeps" / folder / "sweep.json").read_text())
    cells = {(c["lease"], c["heartbeat"]): c for c in sweep["cells"]}
    assert cells[(1.2, False)]["duplicate_spend"] > 0
    assert cells[(1.2, False)]["duplicate_calls"] > 0
    assert cells[(1.2, True)]["duplicate_spend"] == 0
    assert cells[(5.0, False)]["duplicate_spend"] == 0
    rec = sweep["recommendation"]
    assert rec["heartbeat_on"]["lease"] == 1.2
    assert rec["heartbeat_off"]["lease"] == 5.0
    assert "1.2" in done.stdout and "duplicate" in done.stdout
    html = (tmp_path / "sweeps" / folder / "sweep.html").read_text()
    assert "<svg" in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_a_sweep_on_postgres_runs_every_cell_on_its_own_database_of_one_server(tmp_path):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(SCENARIO.replace("drain = 40.0", "drain = 20.0"))
    done = subprocess.run([sys.executable, "-m", "chaos.commands.cli", "sweep", str(scenario),
                           "--lease", "1.2,5", "--heartbeat", "on", "--backend", "postgres",
                           "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    [folder] = os.listdir(tmp_path / "sweeps")
    sweep = json.loads((tmp_path / "sweeps" / folder / "sweep.json").read_text())
    assert sweep["backend"] == "postgres"
    assert {c["duplicate_spend"] for c in sweep["cells"]} == {0}  # heartbeat on: none
    runs = [json.loads(open(os.path.join(run, "report.json")).read())
            for cell in sweep["cells"] for run in cell["runs"]]
    databases = [r["database"] for r in runs]
    assert len(runs) == 2 and all(r["backend"] == "postgres" for r in runs)
    assert len({d["name"] for d in databases}) == 2  # a database of its own per run
    assert {d["server"] for d in databases} == {"started for the command"}
    ports = {d["target"].rsplit(":", 1)[1].split("/")[0] for d in databases}
    assert len(ports) == 1  # ... on one server for the whole sweep
    [port] = ports
    assert all("--backend postgres" in r["run_command"] and "--pg-url" not in r["run_command"]
               for r in runs)
    assert not [p.pid for p in psutil.process_iter(["name", "cmdline"])
                if p.info["name"] == "postgres"
                and f"-p {port}" in " ".join(p.info["cmdline"] or [])], \
        "the sweep's server outlived it"
