"""The exit-code table (docs/explanation/harness.md), row by row, with real processes: each
row's code from a harness command and from an engine command."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "runs")


def ninelives(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINELIVES_")}
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=env)


def fixture_run(tmp_path, name: str) -> str:
    folder = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), folder)
    return str(folder)


def engine_db(tmp_path, *jobs: str) -> str:
    """A database holding `jobs` (each with the payload {"body": id})."""
    db = str(tmp_path / "engine.db")
    for job in jobs:
        done = ninelives("engine", "submit", "--db", db, "--id", job, "--payload",
                         json.dumps({"body": job}))
        assert done.returncode == 0, done.stderr
    return db


def harness_pass(tmp_path):
    return ninelives("check", fixture_run(tmp_path, "pass"))


def harness_fail(tmp_path):
    return ninelives("check", fixture_run(tmp_path, "fail"))


def harness_bad_scenario(tmp_path):
    scenario = tmp_path / "typo.toml"
    scenario.write_text('name = "typo"\n[faults]\nkil = 1.0\n')
    return ninelives("run", str(scenario), "--out", str(tmp_path / "out"))


def harness_no_tries(tmp_path):
    return ninelives("replay", fixture_run(tmp_path, "pass"), "--tries", "0")


def harness_nothing_to_judge(tmp_path):
    run = fixture_run(tmp_path, "pass")
    open(os.path.join(run, "history.jsonl"), "w").close()
    return ninelives("check", run)


def harness_adapter_raised(tmp_path):
    return ninelives("run", "smoke", "--profile", "smoke", "--engine",
                     "tests.contract.broken_adapters:BROKEN_INSTALL", "--out",
                     str(tmp_path / "out"), "--quiet")


def engine_done(tmp_path):
    return ninelives("engine", "status", "--db", engine_db(tmp_path, "a"))


def engine_alerts(tmp_path):
    db = engine_db(tmp_path, "a")
    with sqlite3.connect(db) as conn:  # a job parked, as a failed fetch leaves it
        conn.execute("UPDATE job SET state = 'failed_fetch', last_error = 'poison' WHERE id = 'a'")
    return ninelives("engine", "alerts", "--db", db)


def engine_conflicting_submit(tmp_path):
    return ninelives("engine", "submit", "--db", engine_db(tmp_path, "a"), "--id", "a",
                     "--payload", json.dumps({"body": "another"}))


def engine_bad_payload(tmp_path):
    return ninelives("engine", "submit", "--db", engine_db(tmp_path), "--id", "a",
                     "--payload", "{not json")


#: (row, case) -> (what to run, the exit code the table gives it)
ROWS = {
    ("0", "harness: every invariant with evidence holds"): (harness_pass, 0),
    ("0", "engine: done"): (engine_done, 0),
    ("1", "harness: an invariant failed"): (harness_fail, 1),
    ("1", "engine: alerts found a parked job"): (engine_alerts, 1),
    ("2", "harness: bad input"): (harness_bad_scenario, 2),
    ("2", "harness: replay --tries 0"): (harness_no_tries, 2),
    ("2", "harness: no invariant had evidence"): (harness_nothing_to_judge, 2),
    ("2", "harness: an adapter raised"): (harness_adapter_raised, 2),
    ("2", "engine: the same id with another payload"): (engine_conflicting_submit, 2),
    ("2", "engine: bad input"): (engine_bad_payload, 2),
}


@pytest.mark.parametrize("row", ROWS, ids=[f"{code}-{case}" for code, case in ROWS])
def test_each_row_of_the_exit_code_table(row, tmp_path):
    run, code = ROWS[row]
    done = run(tmp_path)
    assert done.returncode == code, done.stdout + done.stderr
    if code == 2:
        assert "Traceback" not in done.stderr


def spawned(out) -> bool:
    """Whether the run under `out` has started an engine process (events.jsonl says so)."""
    for folder, _, files in os.walk(out):
        if "events.jsonl" in files:
            with open(os.path.join(folder, "events.jsonl"), encoding="utf-8") as fh:
                return '"type": "spawn"' in fh.read()
    return False


def test_ctrl_c_of_a_run_exits_130_leaving_its_evidence(tmp_path):
    """Row 130: a real SIGINT to a real `ninelives run`'s process group, as Ctrl-C sends."""
    out = tmp_path / "reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NINELIVES_")}
    proc = subprocess.Popen([sys.executable, "-m", "chaos.commands.cli", "run", "smoke", "--profile",
                             "smoke", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not spawned(out):
            time.sleep(0.05)
        assert spawned(out), "no engine process started within 120 s"
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    runs = [d for d, _, files in os.walk(out) if "report.json" in files]
    assert len(runs) == 1 and runs[0] in stdout + stderr  # it says where the evidence is
